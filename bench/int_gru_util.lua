-- bench/int_gru_util.lua: what the integer GRU layer benchmarks (bench/int_gru_cuda.lua,
-- int_gru_large.lua, int_gru_small.lua) share: a C layer (qg_int_gru) with a calibrated model's
-- quantizers, and the median of a list of times. Scripts reach it through package.path
-- "bench/?.lua" (run from the checkout root, as they are).
local clib = require("qgru.clib")
local ffi, lib = clib.ffi, clib.lib

local M = {}

-- A qg_int_gru(C, H) on ctx's device with every quantizer of lq (a prepared, calibrated
-- quant.GRU state: lq:quantizers()), freed by the garbage collector.
function M.layer_on(ctx, lq, C, H)
  local out = ffi.new("qg_int_gru*[1]")
  clib.check(ctx, lib.qg_int_gru_create(ctx, out, C, H), 2)
  local h = ffi.gc(out[0], lib.qg_int_gru_free)
  for _, q in pairs(lq:quantizers()) do
    if q.per_channel then
      clib.check(ctx, lib.qg_int_gru_set_weight_quant(ctx, h, q.slot, q.bitwidth, q.is_unsigned and 1 or 0, q.exps.t, q.zps.t), 2)
    else
      clib.check(ctx, lib.qg_int_gru_set_act(ctx, h, q.slot, ffi.new("qg_qspec", q.bitwidth, q.is_unsigned and 1 or 0, q.e, q.z)), 2)
    end
  end
  return h
end

-- The median of t (sorts t in place); the lower middle for an even count.
function M.median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

return M
