-- bench/int_gru_bwd_shapes.lua: the persistent STE backward (qg_int_gru_backward through nn.GRU with
-- QAT int8, after one forward) at one shape, auto and every forced configuration (clusters K 1-16,
-- rows NB 1-8, splits S 1-32, storage 1-4: qg_ctx_set_persist_shape), each the median of 15 after
-- 10. Built with -DQG_BP_TRACE=1 on kernels/int_gru_bwd_persist.cu, the library prints each
-- candidate of its choice with the model's estimate on stderr ("BPC ..."), so one run gives the
-- measured times against the model (bench/int_gru_bwd_fit.py fits it; bench/cuda_int_gru.md,
-- session 50). Lines on stderr: "TRY <shape>", the candidates, "RES <shape> <ms|fail>".
--   QGRU_ROOT=$PWD QGRU_LIB=<trace build>/libqgru.so luajit bench/int_gru_bwd_shapes.lua T N C H 2> fit_TxNxCxH.txt
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;" .. package.path
local qgru = require("qgru")
local util = require("int_gru_util")
local clib = require("qgru.clib")
local lib = clib.lib
local T, N, C, H = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
local ctx = clib.context("cuda")
local function check(st) clib.check(ctx, st, 2) end
local x, gout, mq = util.qat_module(T, N, C, H)
local function med(f)
  for _ = 1, 10 do f() end
  check(lib.qg_ctx_synchronize(ctx))
  local t = {}
  for i = 1, 15 do t[i] = qgru.deviceTime(f, "cuda") end
  table.sort(t); return t[8]
end
local function try(label, K, NB, S, st)
  qgru.setKernelPath("auto")
  mq:forward(x)
  check(lib.qg_ctx_synchronize(ctx))
  if K > 0 then qgru.setKernelPath("persistent") end
  check(lib.qg_ctx_set_persist_shape(ctx, K, NB, S, st))
  io.stderr:write("TRY " .. label .. "\n")
  local ok, v = pcall(med, function() mq:backward(x, gout) end)
  check(lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
  qgru.setKernelPath("auto")
  io.stderr:write(string.format("RES %s %s\n", label, ok and string.format("%.4f", v) or "fail"))
end
-- the backward without its recurrence: T = 1 gives the fixed part
try("auto", 0, 0, 0, 0)
for _, K in ipairs({ 1, 2, 4, 8, 16 }) do
  for _, NB in ipairs({ 1, 2, 4, 8 }) do
    for _, S in ipairs({ 1, 2, 4, 8, 16, 32 }) do
      for _, st in ipairs({ 1, 2, 3, 4 }) do
        try(string.format("K%d_NB%d_S%d_st%d", K, NB, S, st), K, NB, S, st)
      end
    end
  end
end
