-- bench/qat_parts.lua: the QAT int8 train step of one nn.GRU(C, H) on the GPU by parts: the
-- training forward and the backward timed apart (qgru.deviceTime: CUDA events around the work each
-- enqueues, median of `reps` after `warm`), beside the float model's, in each math mode. The
-- train step of recipes/bench.lua is forward + backward (no optimizer).
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/qat_parts.lua [reps] [warm] [T N C H] [modes]
-- modes: comma-separated subset of tf32,strict (default both); an eighth argument "int8" skips the
-- float model; a ninth, a kernel path ("auto", "persistent", "fallback"; qgru.setKernelPath), sets
-- the recurrences of both passes. reps 1 warm 0 for a profiler.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local qgru = require("qgru")
local nn, quant = qgru.nn, qgru.quant
local Tensor = qgru.Tensor

local reps = tonumber(arg[1]) or 20
local warm = tonumber(arg[2]) or 3
local T, N, C, H = tonumber(arg[3]) or 100, tonumber(arg[4]) or 256, tonumber(arg[5]) or 512, tonumber(arg[6]) or 1024
local modes = {}
for v in (arg[7] or "tf32,strict"):gmatch("[^,]+") do modes[#modes + 1] = v end
local int8_only = arg[8] == "int8"
if arg[9] then qgru.setKernelPath(arg[9]) end

local function median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

local function parts(m, x, gout)
  for _ = 1, warm do m:forward(x); m:backward(x, gout) end
  local f, b, s = {}, {}, {}
  for r = 1, reps do
    f[r] = qgru.deviceTime(function() m:forward(x) end, "cuda")
    b[r] = qgru.deviceTime(function() m:backward(x, gout) end, "cuda")
    s[r] = f[r] + b[r]
  end
  return median(f), median(b), median(s)
end

qgru.seed(1)
local x = Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
local gout = Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
print(string.format("QAT train step by parts, T%d N%d C%d H%d, CUDA events, median of %d after %d (ms)", T, N, C, H, reps, warm))
print(string.format("%-6s %-6s %10s %10s %10s", "math", "model", "forward", "backward", "fwd+bwd"))
for _, mode in ipairs(modes) do
  qgru.setMath(mode)
  local a, b, c
  if not int8_only then
    qgru.seed(1)
    local mf = nn.GRU(C, H, { device = "cuda" })
    mf:training()
    a, b, c = parts(mf, x, gout)
    print(string.format("%-6s %-6s %10.3f %10.3f %10.3f", mode, "float", a, b, c))
  end
  qgru.seed(1)
  local mq = nn.GRU(C, H, { device = "cuda" })
  quant.prepare(mq, quant.uniform(8))
  quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
  mq:training()
  a, b, c = parts(mq, x, gout)
  print(string.format("%-6s %-6s %10.3f %10.3f %10.3f", mode, "int8", a, b, c))
end
qgru.setMath("strict")
