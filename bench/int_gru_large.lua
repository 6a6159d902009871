-- bench/int_gru_large.lua: the integer GRU layer (qg_int_gru, int8 everywhere, quantizers
-- calibrated on a small CPU batch) at one shape on the GPU, by recurrence kernel: "grid" (auto:
-- the GPU-wide persistent tc_grid_kernel where it runs) and "step" (a forced persistent shape the
-- cluster kernel cannot hold, so auto takes the per-step tc_step_kernel, one launch per step).
-- Times (CUDA events around the work each call enqueues, median of `reps` after `warm`): the
-- inference forward, the training forward (saved state), the STE backward; and the inference
-- forward at T = 1 (fixed cost: W x, operand preparation; per step = (t_T - t_1) / (T - 1)).
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/int_gru_large.lua [reps] [warm] [T N C H] [variants]
-- variants: comma-separated subset of grid,step (default both); reps 1 warm 0 for profilers;
-- a last argument "infer" times the inference forwards only.
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = qgru.Tensor
local ffi, lib = clib.ffi, clib.lib

local reps = tonumber(arg[1]) or 20
local warm = tonumber(arg[2]) or 3
local T, N, C, H = tonumber(arg[3]) or 100, tonumber(arg[4]) or 256, tonumber(arg[5]) or 512, tonumber(arg[6]) or 1024
local variants = {}
for v in (arg[7] or "grid,step"):gmatch("[^,]+") do variants[#variants + 1] = v end
local infer_only = arg[8] == "infer"
local dev = "cuda"

local function check(ctx, st) clib.check(ctx, st, 2) end
local util = require("int_gru_util")

local ctx = clib.context(dev)
local function time(f) return util.time(ctx, f, reps, warm) end

local h, W, R, bx, br = util.int8_layer(ctx, C, H, dev, 4)

local function run(Ts)
  local x = qgru.zeros({ Ts, N, C }):uniform(-1, 1):to(dev)
  local y = Tensor.new({ Ts, N, H }, "f32", dev)
  local hn = Tensor.new({ N, H }, "f32", dev)
  local sv = { hq = Tensor.new({ Ts + 1, N, H }, "i32", dev), cell = Tensor.new({ Ts, N, H, lib.qg_int_gru_cell_bytes(h) }, "u8", dev),
               xq = Tensor.new({ Ts, N, C }, "i32", dev), xmask = Tensor.new({ Ts, N, C }, "u8", dev) }
  local saved = ffi.new("qg_int_gru_saved")
  saved.hq, saved.cell, saved.xq, saved.xmask = sv.hq.t, sv.cell.t, sv.xq.t, sv.xmask.t
  local dy = qgru.zeros({ Ts, N, H }):uniform(-1, 1):to(dev)
  local g = { dx = Tensor.new({ Ts, N, C }, "f32", dev), dW = Tensor.new({ 3 * H, C }, "f32", dev),
              dR = Tensor.new({ 3 * H, H }, "f32", dev), dbx = Tensor.new({ 3 * H }, "f32", dev), dbr = Tensor.new({ 3 * H }, "f32", dev) }
  local function fwd(sav)
    check(ctx, lib.qg_int_gru_forward(ctx, h, y.t, 0, hn.t, sav, nil, x.t, W.t, R.t, bx.t, br.t, nil, nil, 0))
  end
  local r = {}
  r.infer = time(function() fwd(nil) end)
  r.cell = lib.qg_int_gru_cell_path(h)
  if Ts > 1 and not infer_only then
    r.train_fwd = time(function() fwd(saved) end)
    r.bwd = time(function()
      check(ctx, lib.qg_int_gru_backward(ctx, h, g.dx.t, g.dW.t, g.dR.t, g.dbx.t, g.dbr.t, nil, dy.t, 0, nil, saved, nil, nil, 0))
    end)
  end
  return r
end

print(string.format("integer GRU layer, int8, T%d N%d C%d H%d, CUDA events, median of %d after %d (ms)", T, N, C, H, reps, warm))
print(string.format("%-6s %10s %10s %10s %10s %12s %6s", "kernel", "infer", "infer T=1", "train fwd", "backward", "us/step", "cell"))
for _, v in ipairs(variants) do
  if v == "step" then check(ctx, lib.qg_ctx_set_persist_shape(ctx, 1, 1, 0, 0)) end
  local a = run(T)
  local b = run(1)
  check(ctx, lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
  print(string.format("%-6s %10.3f %10.3f %10.3f %10.3f %12.2f %6d", v, a.infer, b.infer, a.train_fwd or 0, a.bwd or 0,
                      (a.infer - b.infer) / (T - 1) * 1e3, a.cell))
end
