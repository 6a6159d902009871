-- bench/xs_auto_on.lua: the strict STE backward of one nn.GRU(C, H) with QAT int8 (through the
-- module, after one forward) with the exact int8 split chosen (qg_ctx_set_exact_split AUTO) and
-- forced on, two alternating rounds, median of 20 after 30: where the chooser's threshold misses.
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/xs_auto_on.lua T N C H
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;" .. package.path
local qgru = require("qgru")
local util = require("int_gru_util")
local clib = require("qgru.clib")
local lib = clib.lib
local T, N, C, H = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
local ctx = clib.context("cuda")
local x, gout, mq = util.qat_module(T, N, C, H)
local out = {}
for r = 1, 2 do
  for _, mode in ipairs({ { "auto", 0 }, { "on", 1 } }) do
    clib.check(ctx, lib.qg_ctx_set_exact_split(ctx, mode[2]))
    mq:forward(x)
    local f = function() mq:backward(x, gout) end
    for _ = 1, 30 do f() end
    clib.check(ctx, lib.qg_ctx_synchronize(ctx))
    local t = {}
    for i = 1, 20 do t[i] = qgru.deviceTime(f, "cuda") end
    table.sort(t)
    out[#out + 1] = string.format("%s %.4f", mode[1], t[11])
  end
end
clib.check(ctx, lib.qg_ctx_set_exact_split(ctx, 0))
print(string.format("T%d N%d C%d H%d strict backward: %s", T, N, C, H, table.concat(out, " | ")))
