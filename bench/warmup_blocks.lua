-- bench/warmup_blocks.lua: a train step of one GRU layer timed as recipes/bench.lua times it (CUDA
-- events after a synchronisation), steps 1..200 of a fresh process in blocks of 20, the median of
-- each: how many steps LuaJIT needs before the step reaches its steady state (recipes/bench.lua
-- warms up for 50). kind: qat (int8, every operator) or float; `luajit -joff` compares with the
-- interpreter (no compilation, slower throughout). Needs a CUDA device.
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/warmup_blocks.lua T N C H [qat|float]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local quant, nn = qgru.quant, qgru.nn
local T, N, C, H = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4])
local kind = arg[5] or "qat"
qgru.setMath("strict")
qgru.seed(1)
local x = Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
local gout = Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
local mq = nn.GRU(C, H, { device = "cuda" })
if kind == "qat" then
  quant.prepare(mq, quant.uniform(8))
  quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
end
mq:training()
local f = function() mq:forward(x); mq:backward(x, gout) end
local out = {}
for b = 1, 10 do
  local v = {}
  for r = 1, 20 do v[r] = qgru.deviceTime(f, "cuda") end
  table.sort(v)
  out[#out + 1] = string.format("%.3f", v[11])
end
print(string.format("%s %dx%dx%dx%d jit %s: %s", kind, T, N, C, H, jit.status() and "on" or "off", table.concat(out, " ")))
