-- bench/int_gru_pk_sweep.lua: the integer GRU's inference forward (the C call, int8 everywhere)
-- at seed-small, seed-qat and medium, under the automatic shape and over every forced cluster
-- shape of the persistent cluster kernel (qg_ctx_set_persist_shape: CS CTAs a cluster, NB batch
-- rows), each output compared bit for bit with the automatic one ("DIFF" if not). A forced shape
-- that does not fit runs the per-step fallback under the auto path (the ~0.4-1.4 ms entries).
-- CUDA events, median of 20 after 3 (ms). Why: to check the cost model of pk_choose
-- (kernels/int_gru.cu) against measurement at the small shapes (bench/cuda_int_gru.md, session 23).
-- Shapes as TxNxCxH arguments replace the three; with --small, also every forced shape of the
-- small-H kernel (storage 2: R in one CTA's registers, `rows` rows a CTA, `splits` lanes a unit, in
-- as many waves of CTAs as it takes; storage 5: its two-role variant), named "small r<rows> s<splits>"
-- (session 42's check of isk_choose at large batches).
--   QGRU_ROOT=$PWD QGRU_LIB=build/libqgru.so luajit bench/int_gru_pk_sweep.lua [--small] [TxNxCxH ...]
package.path = "lua/?.lua;lua/?/init.lua;bench/?.lua;" .. package.path
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = qgru.Tensor
local ffi, lib = clib.ffi, clib.lib
local util = require("int_gru_util")
local dev = "cuda"
local ctx = clib.context(dev)
local function check(st) clib.check(ctx, st, 2) end
local function time(f, reps, warm) return util.time(ctx, f, reps, warm) end
local shapes, small = {}, false
for _, a in ipairs(arg) do
  if a == "--small" then small = true
  else
    local t, n, c, hh = a:match("^(%d+)x(%d+)x(%d+)x(%d+)$")
    assert(t, "bench/int_gru_pk_sweep.lua: '" .. a .. "' is not TxNxCxH")
    shapes[#shapes + 1] = { tonumber(t), tonumber(n), tonumber(c), tonumber(hh) }
  end
end
if #shapes == 0 then shapes = { { 100, 4, 128, 256 }, { 50, 32, 64, 128 }, { 100, 64, 256, 512 } } end
for _, sh in ipairs(shapes) do
  local T, N, C, H = sh[1], sh[2], sh[3], sh[4]
  local h, W, R, bx, br = util.int8_layer(ctx, C, H, dev, 4)
  local x = qgru.zeros({ T, N, C }):uniform(-1, 1):to(dev)
  local y, hn = Tensor.new({ T, N, H }, "f32", dev), Tensor.new({ N, H }, "f32", dev)
  local function fwd() check(lib.qg_int_gru_forward(ctx, h, y.t, 0, hn.t, nil, nil, x.t, W.t, R.t, bx.t, br.t, nil, nil, 0)) end
  local line = {}
  check(lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
  line[#line + 1] = string.format("auto %.3f", time(fwd, 20, 3))
  local ref = y:to("cpu"):totable()
  -- "name ms" of one timed forward under the current shape, " DIFF" where y is not auto's bit for bit
  local function entry(name, fn_time)
    local ok, t = pcall(fn_time)
    if not ok then return name .. " n/a" end
    local yt = y:to("cpu"):totable()
    for a = 1, T do for b = 1, N do for c = 1, H do
      if yt[a][b][c] ~= ref[a][b][c] then return string.format("%s %.3f DIFF", name, t) end
    end end end
    return string.format("%s %.3f", name, t)
  end
  for _, cs in ipairs({ 1, 2, 4, 8, 16 }) do
    for _, rows in ipairs({ 1, 2, 4, 8 }) do
      if 8 * rows <= math.max(8, N) * 2 then
        check(lib.qg_ctx_set_persist_shape(ctx, cs, rows, 0, 0))
        line[#line + 1] = entry(string.format("CS%d NB%d", cs, 8 * rows), function() return time(fwd, 20, 3) end)
      end
    end
  end
  if small then
    for _, f in ipairs({ { 1, 0, 2 }, { 1, 1, 2 }, { 1, 2, 2 }, { 1, 4, 2 }, { 2, 0, 2 }, { 2, 2, 2 }, { 2, 4, 2 }, { 4, 0, 2 },
                         { 4, 4, 2 }, { 8, 0, 2 }, { 1, 1, 5 } }) do
      check(lib.qg_ctx_set_persist_shape(ctx, 1, f[1], f[2], f[3]))
      local name = string.format("small%s r%d s%d", f[3] == 5 and "-ws" or "", f[1], f[2])
      line[#line + 1] = entry(name, function()   -- a forced shape that does not fit fails instead of running the fallback
        qgru.setKernelPath("persistent")
        local ok, t = pcall(time, fwd, 20, 3)
        qgru.setKernelPath("auto")
        if not ok then error(t, 0) end
        return t
      end)
    end
  end
  check(lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
  print(string.format("T%d N%d C%d H%d: %s", T, N, C, H, table.concat(line, " | ")))
end
