-- bench/int_gru_cuda.lua: wall time of the integer GRU layer (qg_int_gru) on the GPU, one layer
-- and direction, int8 everywhere (quantizers calibrated on the CPU), per kernel path: inference
-- forward (no saved state), training forward (saved state) and the STE backward. Each figure is
-- the median of `reps` calls, each call followed by a stream synchronization (host launch
-- overhead included), after `warm` calls; "enq" is the host time of the call alone (enqueueing),
-- and the T=1 row of each shape shows the fixed cost (per-step cost = (t_T - t_1) / (T - 1)).
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/int_gru_cuda.lua [reps] [device] [warm]
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = qgru.Tensor
local ffi, lib = clib.ffi, clib.lib

local reps = tonumber(arg[1]) or 20
local dev = arg[2] or "cuda"
local warm = tonumber(arg[3]) or 3
local SHAPES = { { T = 50, N = 32, C = 64, H = 128 }, { T = 100, N = 64, C = 256, H = 512 } }

local function check(ctx, st) clib.check(ctx, st, 2) end
local util = require("int_gru_util")
local median = util.median

local function time(ctx, f)
  for _ = 1, warm do f() end
  check(ctx, lib.qg_ctx_synchronize(ctx))
  local ts, es = {}, {}
  for r = 1, reps do
    local t0 = lib.qg_wall_time()
    f()
    local t1 = lib.qg_wall_time()
    check(ctx, lib.qg_ctx_synchronize(ctx))
    ts[r] = (lib.qg_wall_time() - t0) * 1e3
    es[r] = (t1 - t0) * 1e3
  end
  return median(ts), median(es)
end

print(string.format("integer GRU layer on %s, int8, median of %d (ms)", dev, reps))
print(string.format("%-24s %-11s %10s %8s %10s %10s %8s", "shape", "path", "infer fwd", "(enq)", "train fwd", "backward", "(enq)"))
local all = {}
for _, s in ipairs(SHAPES) do
  all[#all + 1] = s
  all[#all + 1] = { T = 1, N = s.N, C = s.C, H = s.H }
end
for _, s in ipairs(all) do
  local ctx = clib.context(dev)
  local h, W, R, bx, br = util.int8_layer(ctx, s.C, s.H, dev, 10)
  local x = qgru.zeros({ s.T, s.N, s.C }):uniform(-1, 1):to(dev)
  local y = Tensor.new({ s.T, s.N, s.H }, "f32", dev)
  local hn = Tensor.new({ s.N, s.H }, "f32", dev)
  local sv = { hq = Tensor.new({ s.T + 1, s.N, s.H }, "i32", dev), cell = Tensor.new({ s.T, s.N, s.H, lib.qg_int_gru_cell_bytes(h) }, "u8", dev),
               xq = Tensor.new({ s.T, s.N, s.C }, "i32", dev), xmask = Tensor.new({ s.T, s.N, s.C }, "u8", dev) }
  local saved = ffi.new("qg_int_gru_saved")
  saved.hq, saved.cell, saved.xq, saved.xmask = sv.hq.t, sv.cell.t, sv.xq.t, sv.xmask.t
  local dy = qgru.zeros({ s.T, s.N, s.H }):uniform(-1, 1):to(dev)
  local g = { dx = Tensor.new({ s.T, s.N, s.C }, "f32", dev), dW = Tensor.new({ 3 * s.H, s.C }, "f32", dev),
              dR = Tensor.new({ 3 * s.H, s.H }, "f32", dev), dbx = Tensor.new({ 3 * s.H }, "f32", dev), dbr = Tensor.new({ 3 * s.H }, "f32", dev) }
  for _, path in ipairs({ "persistent", "fallback" }) do
    qgru.setKernelPath(path)
    local function fwd(sav)
      check(ctx, lib.qg_int_gru_forward(ctx, h, y.t, 0, hn.t, sav, nil, x.t, W.t, R.t, bx.t, br.t, nil, nil, 0))
    end
    local inf, inf_e = time(ctx, function() fwd(nil) end)
    local trn = time(ctx, function() fwd(saved) end)
    local bwd, bwd_e = time(ctx, function()
      check(ctx, lib.qg_int_gru_backward(ctx, h, g.dx.t, g.dW.t, g.dR.t, g.dbx.t, g.dbr.t, nil, dy.t, 0, nil, saved, nil, nil, 0))
    end)
    print(string.format("%-24s %-11s %10.3f %8.3f %10.3f %10.3f %8.3f", string.format("T%d N%d C%d H%d", s.T, s.N, s.C, s.H), path, inf,
                        inf_e, trn, bwd, bwd_e))
  end
  qgru.setKernelPath("auto")
end
