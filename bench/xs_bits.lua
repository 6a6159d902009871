-- bench/xs_bits.lua: a fingerprint of one QAT int8 train step's gradients on the GPU (dx and every
-- parameter gradient of one nn.GRU(C, H), strict mode unless told): an FNV-1a hash of each
-- tensor's 32-bit words, its sum of squares and count of non-finite values; also of the training
-- forward's output and of an inference forward's. Two libraries whose integer forward and strict
-- STE backward should give the same bits (a kernel rearranged, not its sums) print the same lines.
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/xs_bits.lua [T N C H] [math] [lengths]
-- lengths: "lengths" gives rows lengths T, T-1, ... (cycling down to 1) instead of full rows.
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local qgru = require("qgru")
local ffi = require("ffi")
local nn, quant = qgru.nn, qgru.quant
local Tensor = qgru.Tensor

local T, N, C, H = tonumber(arg[1]) or 100, tonumber(arg[2]) or 256, tonumber(arg[3]) or 512, tonumber(arg[4]) or 1024
qgru.setMath(arg[5] or "strict")
local with_lengths = arg[6] == "lengths"

local function fnv(t)
  local c = t:to("cpu")
  local p = ffi.cast("const uint32_t *", c:ptr())
  local h = 2166136261ULL
  for k = 0, c:numel() - 1 do h = (bit.bxor(h, p[k]) * 16777619ULL) % 4294967296ULL end
  return string.format("%08x", tonumber(h)), c:sumsq(), c:countNonFinite()
end

qgru.seed(1)
local x = Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
local gout = Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
local m = nn.GRU(C, H, { device = "cuda" })
quant.prepare(m, quant.uniform(8))
quant.calibrate(m, { x }, { method = "minmax", passes = 1 })
m:training()
local input = x
if with_lengths then
  local L = {}
  for n = 1, N do L[n] = T - (n - 1) % T end
  input = { x, lengths = L }
end
for rep = 1, 2 do   -- the second call replays the captured loop (kernels/gru.cu's graph cache)
  m:zeroGradParameters()
  local y = m:forward(input)
  local out = { { "y", y } }
  local dx = m:backward(input, gout)
  out[#out + 1] = { "dx", dx }
  for _, k in ipairs({ "W", "R", "bx", "br" }) do out[#out + 1] = { k, m.grads[0][0][k] } end
  for _, o in ipairs(out) do
    local h, ss, nf = fnv(o[2])
    print(string.format("call %d %-3s %s sumsq %.9e nonfinite %d", rep, o[1], h, ss, nf))
  end
end
m:evaluate()
local h, ss, nf = fnv(m:forward(input))
print(string.format("infer  y   %s sumsq %.9e nonfinite %d", h, ss, nf))
