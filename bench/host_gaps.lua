-- bench/host_gaps.lua: how much of a timed QAT step is the GPU waiting on the host? For the QAT
-- train step, its forward and backward alone, int8 inference and frozen inference at one shape
-- (int8, every operator, as recipes/bench.lua builds them): the median event time as
-- recipes/bench.lua takes it after a synchronisation ("plain"), the same with a 7-ms float forward
-- queued just before the start event ("pre": the host has queued the whole step before the GPU
-- reaches it, so host latency is hidden), and the host's time to queue the step.
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/host_gaps.lua [T N C H] [reps] [strict|tf32]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local ffi, lib = clib.ffi, clib.lib
local quant, nn = qgru.quant, qgru.nn
ffi.cdef[[ typedef struct { long tv_sec; long tv_nsec; } host_gaps_ts; int clock_gettime(int, host_gaps_ts *); ]]
local tsb = ffi.new("host_gaps_ts")
local function now() ffi.C.clock_gettime(1, tsb); return tonumber(tsb.tv_sec) * 1e3 + tonumber(tsb.tv_nsec) * 1e-6 end
local T, N, C, H = tonumber(arg[1]) or 100, tonumber(arg[2]) or 256, tonumber(arg[3]) or 512, tonumber(arg[4]) or 1024
local reps = tonumber(arg[5]) or 20
local mode = arg[6] or "strict"
qgru.setMath(mode)
local ctx = clib.context("cuda")
qgru.seed(1)
local x = Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
local gout = Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
local big = nn.GRU(512, 1024, { device = "cuda" })
local xb = Tensor.new({ 100, 256, 512 }, "f32"):normal(0, 1):to("cuda")
big:evaluate()
local mq = nn.GRU(C, H, { device = "cuda" })
quant.prepare(mq, quant.uniform(8))
quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
local function med(t) table.sort(t); return t[math.floor(#t / 2) + 1] end
local function measure(name, f)
  for _ = 1, 3 do f() end
  clib.check(ctx, lib.qg_ctx_synchronize(ctx))
  local plain, pre, host = {}, {}, {}
  for r = 1, reps do plain[r] = qgru.deviceTime(f, "cuda") end
  for r = 1, reps do
    big:forward(xb)
    local t0 = now()
    pre[r] = qgru.deviceTime(function() f(); host[r] = now() - t0 end, "cuda")
  end
  print(string.format("%s %dx%dx%dx%d %-6s %-7s plain %.4f  pre %.4f  host enqueue %.4f ms", mode, T, N, C, H, name, "", med(plain), med(pre), med(host)))
end
mq:training()
measure("train", function() mq:forward(x); mq:backward(x, gout) end)
measure("tfwd", function() mq:forward(x) end)
do -- the backward alone: its forward untimed and finished first
  local plain, pre = {}, {}
  for r = 1, reps + 3 do
    mq:forward(x); clib.check(ctx, lib.qg_ctx_synchronize(ctx))
    plain[r] = qgru.deviceTime(function() mq:backward(x, gout) end, "cuda")
    mq:forward(x); clib.check(ctx, lib.qg_ctx_synchronize(ctx))
    big:forward(xb)
    pre[r] = qgru.deviceTime(function() mq:backward(x, gout) end, "cuda")
  end
  print(string.format("%s %dx%dx%dx%d %-6s         plain %.4f  pre %.4f", mode, T, N, C, H, "bwd", med(plain), med(pre)))
end
mq:evaluate()
measure("infer", function() mq:forward(x) end)
quant.freeze(mq)
measure("frozen", function() mq:forward(x) end)
