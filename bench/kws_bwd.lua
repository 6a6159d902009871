-- bench/kws_bwd.lua: where the time of the QAT int8 train step and of float inference goes at
-- long-kws (T1000 N16 C40 H64; seed-qat T50 N32 C64 H128 with "seed-qat" as argument 2), on the GPU.
-- Median of `reps` samples, each timed by CUDA events around the work it enqueues (qgru.deviceTime):
--   * the QAT step through the module (quant.prepare, int8, calibrated): train forward alone, train
--     forward + backward, and the layer calls alone (qg_int_gru_forward with saved state,
--     qg_int_gru_backward), the backward with R~ forced into registers (storage 2, S lanes; 3: the
--     cell on warps of its own; 4: its inputs prepared on warps of their own too) or shared memory (storage 1) or chosen (auto);
--   * the float layer (qg_gru_forward inference, qg_gru_backward) chosen and forced to each
--     register share (K1 NB1, S = 1, 2, 4, 8 lanes) and to shared memory.
-- A forced shape a build cannot run prints its error.
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/kws_bwd.lua [reps] [shape]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local nn, quant = qgru.nn, qgru.quant
local Tensor = qgru.Tensor
local ffi, lib = clib.ffi, clib.lib

local reps = tonumber(arg[1]) or 20
local shape = arg[2] or "long-kws"
local S = ({ ["long-kws"] = { 1000, 16, 40, 64 }, ["seed-qat"] = { 50, 32, 64, 128 } })[shape]
local T, N, C, H = S[1], S[2], S[3], S[4]
local ctx = clib.context("cuda")
local function check(st) clib.check(ctx, st, 2) end

local function median_ms(f)
  for _ = 1, 3 do f() end
  check(lib.qg_ctx_synchronize(ctx))
  local t = {}
  for i = 1, reps do t[i] = qgru.deviceTime(f, "cuda") end
  table.sort(t)
  return t[math.floor(#t / 2) + 1]
end
local function timed(label, f, K, NB, Sx, storage)
  check(lib.qg_ctx_set_persist_shape(ctx, K or 0, NB or 0, Sx or 0, storage or 0))
  local ok, v = pcall(median_ms, f)
  check(lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
  print(string.format("%-58s %s", label, ok and string.format("%.3f ms", v) or ("error: " .. tostring(v):gsub("\n.*", ""):sub(1, 140))))
end

print(string.format("%s (T%d N%d C%d H%d), median of %d, ms (CUDA events), lib %s", shape, T, N, C, H, reps, os.getenv("QGRU_LIB") or "?"))

-- ---- QAT through the module ----
qgru.seed(1)
local x = Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
local gout = Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
local mq = nn.GRU(C, H, { device = "cuda" })
quant.prepare(mq, quant.uniform(8))
quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
mq:training()
timed("QAT module: train forward", function() mq:forward(x) end)
timed("QAT module: train forward + backward (the bench's step)", function() mq:forward(x); mq:backward(x, gout) end)
mq:forward(x)
timed("QAT module: backward alone (after one forward)", function() mq:backward(x, gout) end)

-- ---- the integer layer alone ----
local lq, w = mq.qstate.layers[0], mq.weights[0][0]
local out = ffi.new("qg_int_gru*[1]")
check(lib.qg_int_gru_create(ctx, out, C, H))
local h = ffi.gc(out[0], lib.qg_int_gru_free)
for _, q in pairs(lq:quantizers()) do
  if q.per_channel then
    local e, z = q.exps:to("cpu"), q.zps:to("cpu")
    check(lib.qg_int_gru_set_weight_quant(ctx, h, q.slot, q.bitwidth, q.is_unsigned and 1 or 0, e.t, z.t))
  else
    check(lib.qg_int_gru_set_act(ctx, h, q.slot, ffi.new("qg_qspec", q.bitwidth, q.is_unsigned and 1 or 0, q.e, q.z)))
  end
end
local y = Tensor.new({ T, N, H }, "f32", "cuda")
local hn = Tensor.new({ N, H }, "f32", "cuda")
local sv = { hq = Tensor.new({ T + 1, N, H }, "i32", "cuda"), cell = Tensor.new({ T, N, H, lib.qg_int_gru_cell_bytes(h) }, "u8", "cuda"),
             xq = Tensor.new({ T, N, C }, "i32", "cuda"), xmask = Tensor.new({ T, N, C }, "u8", "cuda") }
local saved = ffi.new("qg_int_gru_saved")
saved.hq, saved.cell, saved.xq, saved.xmask = sv.hq.t, sv.cell.t, sv.xq.t, sv.xmask.t
local dy = Tensor.new({ T, N, H }, "f32"):uniform(-1, 1):to("cuda")
local g = { dx = Tensor.new({ T, N, C }, "f32", "cuda"), dW = Tensor.new({ 3 * H, C }, "f32", "cuda"), dR = Tensor.new({ 3 * H, H }, "f32", "cuda"),
            dbx = Tensor.new({ 3 * H }, "f32", "cuda"), dbr = Tensor.new({ 3 * H }, "f32", "cuda") }
local function ifwd(sav) check(lib.qg_int_gru_forward(ctx, h, y.t, 0, hn.t, sav, nil, x.t, w.W.t, w.R.t, w.bx.t, w.br.t, nil, nil, 0)) end
local function ibwd() check(lib.qg_int_gru_backward(ctx, h, g.dx.t, g.dW.t, g.dR.t, g.dbx.t, g.dbr.t, nil, dy.t, 0, nil, saved, nil, nil, 0)) end
timed("int layer: inference forward", function() ifwd(nil) end)
timed("int layer: train forward (saved state)", function() ifwd(saved) end)
ifwd(saved)
timed("int layer: STE backward, auto", ibwd)
qgru.setKernelPath("persistent")
timed("int layer: STE backward, smem K1 NB1 S8", ibwd, 1, 1, 8, 1)
timed("int layer: STE backward, smem K1 NB1 S4", ibwd, 1, 1, 4, 1)
for _, sx in ipairs({ 1, 2, 4, 8 }) do timed("int layer: STE backward, regs K1 NB1 S" .. sx, ibwd, 1, 1, sx, 2) end
timed("int layer: STE backward, regs K1 NB2 S2", ibwd, 1, 2, 2, 2)
for _, sx in ipairs({ 2, 4 }) do timed("int layer: STE backward, split roles K1 NB1 S" .. sx, ibwd, 1, 1, sx, 3) end
for _, sx in ipairs({ 2, 4 }) do timed("int layer: STE backward, three roles K1 NB1 S" .. sx, ibwd, 1, 1, sx, 4) end
if H > 64 then
  timed("int layer: STE backward, smem K4 NB4 S0", ibwd, 4, 4, 0, 1)
  timed("int layer: STE backward, regs K2 NB1 S4", ibwd, 2, 1, 4, 2)
end
qgru.setKernelPath("auto")

-- ---- the float layer alone ----
local k = 1 / math.sqrt(H)
local function dev(shape, lo) return Tensor.new(shape, "f32"):uniform(-lo, lo):to("cuda") end
local W, R, bx, br = dev({ 3 * H, C }, k), dev({ 3 * H, H }, k), dev({ 3 * H }, k), dev({ 3 * H }, k)
local hs, gates = Tensor.new({ T + 1, N, H }, "f32", "cuda"), Tensor.new({ T, N, 4 * H }, "f32", "cuda")
local fdy = dev({ T, N, H }, 1e-3)
local function ffwd(gt) check(lib.qg_gru_forward(ctx, y.t, 0, hs.t, gt and gates.t or nil, nil, x.t, W.t, R.t, bx.t, br.t, nil, nil, 0)) end
local function fbwd() check(lib.qg_gru_backward(ctx, g.dx.t, g.dW.t, g.dR.t, g.dbx.t, g.dbr.t, nil, fdy.t, 0, nil, x.t, W.t, R.t, hs.t, gates.t, nil, 0)) end
timed("float layer: inference forward, auto", function() ffwd(false) end)
timed("float layer: train forward, auto", function() ffwd(true) end)
ffwd(true)
timed("float layer: backward, auto", fbwd)
qgru.setKernelPath("persistent")
for _, sx in ipairs({ 1, 2, 4, 8 }) do timed("float layer: inference forward, regs K1 NB1 S" .. sx, function() ffwd(false) end, 1, 1, sx, 2) end
timed("float layer: inference forward, regs K1 NB2 S2", function() ffwd(false) end, 1, 2, 2, 2)
timed("float layer: inference forward, smem K1 NB1", function() ffwd(false) end, 1, 1, 0, 1)
if H > 64 then
  timed("float layer: inference forward, regs K4 NB2 S8", function() ffwd(false) end, 4, 2, 8, 2)
  timed("float layer: inference forward, regs K4 NB2 S4", function() ffwd(false) end, 4, 2, 4, 2)
end
for _, sx in ipairs({ 2, 4, 8 }) do timed("float layer: backward, regs K1 NB1 S" .. sx, fbwd, 1, 1, sx, 2) end
timed("float layer: backward, smem K1 NB1", fbwd, 1, 1, 0, 1)
qgru.setKernelPath("auto")
