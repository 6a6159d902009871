-- bench/int_gru_util.lua: what the integer GRU layer benchmarks (bench/int_gru_cuda.lua,
-- int_gru_large.lua, int_gru_small.lua; the module ones int_gru_bwd_shapes.lua, xs_auto_on.lua,
-- warmup_blocks.lua) share: a C layer (qg_int_gru) with a calibrated model's quantizers, the QAT
-- module of recipes/bench.lua, and the median of a list of times. Scripts reach it through package.path
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

-- A calibrated int8 layer: qgru.seed(1), an nn.GRU(C, H) prepared with quant.uniform(8) and
-- calibrated by minmax (2 passes) on one uniform [-1, 1] batch of calib_T x 8 x C; returns its C
-- layer on ctx (M.layer_on) and the weights W, R, bx, br on dev.
function M.int8_layer(ctx, C, H, dev, calib_T)
  local qgru = require("qgru")
  qgru.seed(1)
  local gru = qgru.nn.GRU(C, H)
  qgru.quant.prepare(gru, qgru.quant.uniform(8))
  qgru.quant.calibrate(gru, { qgru.zeros({ calib_T, 8, C }):uniform(-1, 1) }, { method = "minmax", passes = 2 })
  local lq, w = gru.qstate.layers[0], gru.weights[0][0]
  return M.layer_on(ctx, lq, C, H), w.W:to(dev), w.R:to(dev), w.bx:to(dev), w.br:to(dev)
end

-- The QAT int8 step of recipes/bench.lua on the GPU: qgru.seed(1), x [T, N, C] ~ N(0, 1) and a
-- fixed gradOutput [T, N, H] on "cuda", an nn.GRU(C, H) prepared with quant.uniform(8) and
-- calibrated by minmax (1 pass) on x, in training mode. Returns x, gout, the module.
function M.qat_module(T, N, C, H)
  local qgru = require("qgru")
  qgru.seed(1)
  local x = qgru.Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
  local gout = qgru.Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
  local mq = qgru.nn.GRU(C, H, { device = "cuda" })
  qgru.quant.prepare(mq, qgru.quant.uniform(8))
  qgru.quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
  mq:training()
  return x, gout, mq
end

-- The median over reps calls of f of the time of the work f enqueues on ctx (CUDA events:
-- qg_ctx_timer_start / stop), after warm calls and a synchronize.
function M.time(ctx, f, reps, warm)
  for _ = 1, warm do f() end
  clib.check(ctx, lib.qg_ctx_synchronize(ctx), 2)
  local ts, ms = {}, ffi.new("double[1]")
  for r = 1, reps do
    clib.check(ctx, lib.qg_ctx_timer_start(ctx), 2)
    f()
    clib.check(ctx, lib.qg_ctx_timer_stop(ctx, ms), 2)
    ts[r] = ms[0]
  end
  return M.median(ts)
end

-- The median of t (sorts t in place); the lower middle for an even count.
function M.median(t)
  table.sort(t)
  return t[math.floor((#t + 1) / 2)]
end

return M
