-- bench/int_gru_small.lua: the integer GRU layer's forward (one layer and direction, int8 every
-- operator, quantizers calibrated on the CPU, no lengths, no h0) with the recurrence forced to
-- each shape of the small-H kernel (kernels/int_gru_small.cu: qg_ctx_set_persist_shape(1, rows,
-- splits, 2); its two-role variant: (1, 1, 0, 5)) and of the cluster kernel (cluster, 1, 0, 1: tiles of 8 rows), and under auto.
-- Each figure: the median of `reps` calls timed by CUDA events around the call (qgru.deviceTime),
-- after 3 warm-up calls; inference (no saved state) and training (saved state) forwards. Prints
-- one line per shape and variant, then per shape the best small shape, the best cluster shape and
-- auto's figures.
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/int_gru_small.lua [reps] [shape name] [auto]
-- (a shape name: that shape only; "auto": the auto variant only, e.g. under ncu; "quick": auto,
-- one row with one and two lanes per unit, and the two-role variant (storage 5))
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = qgru.Tensor
local ffi, lib = clib.ffi, clib.lib

local reps = tonumber(arg[1]) or 20
local only, auto_only, quick = arg[2], arg[3] == "auto", arg[3] == "quick"
local SHAPES = {
  { name = "long-kws", T = 1000, N = 16, C = 40, H = 64 },
  { name = "seed-qat", T = 50, N = 32, C = 64, H = 128 },
  { name = "T200 N1 H64", T = 200, N = 1, C = 40, H = 64 },
  { name = "T200 N128 H64", T = 200, N = 128, C = 40, H = 64 },
  { name = "T200 N512 H64", T = 200, N = 512, C = 40, H = 64 },
  { name = "T100 N64 H100", T = 100, N = 64, C = 63, H = 100 },
  { name = "T200 N16 H16", T = 200, N = 16, C = 40, H = 16 },
}
local ctx = clib.context("cuda")
local function check(st) clib.check(ctx, st, 2) end
local util = require("int_gru_util")
local median = util.median

local function time(f)
  for _ = 1, 3 do f() end
  local ts = {}
  for r = 1, reps do ts[r] = qgru.deviceTime(f, "cuda") end
  return median(ts)
end

local variants = { { name = "auto" } }
for _, rows in ipairs({ 1, 2, 4, 8 }) do
  for _, splits in ipairs({ 0, 1, 2, 4, 8, 16, 32 }) do
    variants[#variants + 1] = { name = string.format("small r%d s%d", rows, splits), shape = { 1, rows, splits, 2 }, small = true }
  end
end
variants[#variants + 1] = { name = "small ws r1", shape = { 1, 1, 0, 5 }, small = true }   -- the cell over two roles of warps
for _, cs in ipairs({ 1, 2, 4, 8, 16 }) do
  variants[#variants + 1] = { name = string.format("cluster c%d r8", cs), shape = { cs, 1, 0, 1 }, cluster = true }
end

qgru.setKernelPath("persistent")
print(string.format("integer GRU layer forward on cuda, int8, median of %d (ms, CUDA events)", reps))
print(string.format("%-16s %-18s %10s %10s", "shape", "variant", "infer", "train"))
for _, s in ipairs(SHAPES) do
  if only and s.name ~= only then goto next_shape end
  local h, W, R, bx, br = util.int8_layer(ctx, s.C, s.H, "cuda", 10)
  local x = qgru.zeros({ s.T, s.N, s.C }):uniform(-1, 1):to("cuda")
  local y = Tensor.new({ s.T, s.N, s.H }, "f32", "cuda")
  local hn = Tensor.new({ s.N, s.H }, "f32", "cuda")
  local sv = { hq = Tensor.new({ s.T + 1, s.N, s.H }, "i32", "cuda"), cell = Tensor.new({ s.T, s.N, s.H, lib.qg_int_gru_cell_bytes(h) }, "u8", "cuda"),
               xq = Tensor.new({ s.T, s.N, s.C }, "i32", "cuda"), xmask = Tensor.new({ s.T, s.N, s.C }, "u8", "cuda") }
  local saved = ffi.new("qg_int_gru_saved")
  saved.hq, saved.cell, saved.xq, saved.xmask = sv.hq.t, sv.cell.t, sv.xq.t, sv.xmask.t
  local best = {}
  for _, v in ipairs(variants) do
    if auto_only and v.shape then goto next_variant end
    if quick and v.shape and not (v.name == "small r1 s1" or v.name == "small r1 s2" or v.name == "small ws r1") then goto next_variant end
    if v.shape then   -- a storage this library does not know (an older build): skipped
      if lib.qg_ctx_set_persist_shape(ctx, v.shape[1], v.shape[2], v.shape[3], v.shape[4]) ~= lib.QG_OK then goto next_variant end
    else check(lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0)) end
    local function fwd(sav)
      return lib.qg_int_gru_forward(ctx, h, y.t, 0, hn.t, sav, nil, x.t, W.t, R.t, bx.t, br.t, nil, nil, 0)
    end
    if fwd(nil) == lib.QG_OK then   -- a shape that cannot run is skipped
      local inf = time(function() check(fwd(nil)) end)
      local trn = time(function() check(fwd(saved)) end)
      print(string.format("%-16s %-18s %10.4f %10.4f", s.name, v.name, inf, trn))
      local k = v.small and "small" or v.cluster and "cluster" or "auto"
      if not best[k] or inf < best[k].inf then best[k] = { name = v.name, inf = inf, trn = trn } end
    end
    ::next_variant::
  end
  check(lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
  for _, k in ipairs({ "auto", "small", "cluster" }) do
    local b = best[k]
    if b then print(string.format("BEST %-16s %-8s %-18s infer %.4f train %.4f", s.name, k, b.name, b.inf, b.trn)) end
  end
  ::next_shape::
end
qgru.setKernelPath("auto")
