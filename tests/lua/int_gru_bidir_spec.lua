-- int_gru_bidir_spec.lua: qg_int_gru_forward_bidir / qg_int_gru_backward_bidir (a quantized
-- bidirectional layer's two directions in one call; on a GPU at the same time, direction 1 on the
-- context's peer) against the two one-direction calls in order, bit for bit: y (both halves), hn,
-- every saved byte, and dx, dW, dR, dbx, dbr, dh0 accumulated onto non-zero values. On the CPU
-- (always) and on a GPU (tagged by a pending line where there is none) over the integer kernels'
-- paths: the small-H kernel with lengths and h0, the cluster kernel, at H 600 with 130 rows the
-- large-H forward and the strict backward's two row groups and exact split (strict and TF32), and
-- the per-step backward forced with its side stream (the peer copies the context's settings). And
-- the front door's refusals: nothing runs when either direction's arguments are bad.
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local nn, quant, Tensor = qgru.nn, qgru.quant, qgru.Tensor
local ffi, lib = clib.ffi, clib.lib

local function host(t) return t:device() == "cpu" and t or t:to("cpu") end
local function bytes(t)
  local x = host(t)
  return ffi.string(x:ptr(), x:numel() * lib.qg_dtype_size(clib.dtypes[x:dtype()]))
end
local function same_bits(a, b, what)
  local sa, sb = bytes(a), bytes(b)
  if sa ~= sb then
    local k = 1
    while sa:byte(k) == sb:byte(k) do k = k + 1 end
    error(string.format("%s: the bidirectional call differs from the one-direction calls (first at byte %d of %d)", what, k, #sa), 2)
  end
end

-- A calibrated bidirectional quantized GRU (one layer) on `dev`, with its inputs (cpu-made, moved).
local function case(c, dev)
  qgru.seed(c.seed)
  local gru = nn.GRU(c.C, c.H, { bidirectional = true })
  for _, p in ipairs(gru:namedParameters()) do p.param:uniform(-0.5, 0.5) end
  quant.prepare(gru, quant.uniform(c.bits or 8))
  local calib = { qgru.zeros({ c.T, c.N, c.C }):uniform(-1.5, 1.5) }
  quant.calibrate(gru, calib, { method = "minmax", passes = 2 })
  gru:to(dev)
  local inp = { x = qgru.zeros({ c.T, c.N, c.C }):uniform(-1.5, 1.5):to(dev) }
  if c.h0 then inp.h0 = { qgru.zeros({ c.N, c.H }):uniform(-0.8, 0.8):to(dev), qgru.zeros({ c.N, c.H }):uniform(-0.8, 0.8):to(dev) } end
  if c.lengths then
    local l = {}
    for n = 1, c.N do l[n] = ((n * 5 + c.seed) % c.T) + 1 end
    l[1] = c.T
    inp.L = Tensor.from(l, "i64"):to(dev)
  end
  inp.dy = qgru.zeros({ c.T, c.N, 2 * c.H }):uniform(-1, 1):to(dev)
  return gru, inp
end

local function saved_of(lq, c, dev)
  local s = {
    hq = Tensor.new({ c.T + 1, c.N, c.H }, "i32", dev), cell = Tensor.new({ c.T, c.N, c.H, lib.qg_int_gru_cell_bytes(lq.handle) }, "u8", dev),
    xq = Tensor.new({ c.T, c.N, c.C }, "i32", dev), xmask = Tensor.new({ c.T, c.N, c.C }, "u8", dev),
  }
  local sv = ffi.new("qg_int_gru_saved")
  sv.hq, sv.cell, sv.xq, sv.xmask = s.hq.t, s.cell.t, s.xq.t, s.xmask.t
  s.sv = sv
  return s
end

-- Gradient buffers filled with the same non-zero values for both runs (seeded).
local function grads(c, dev, seed)
  qgru.seed(seed)
  local g = { dx = qgru.zeros({ c.T, c.N, c.C }):uniform(-0.1, 0.1):to(dev) }
  for d = 0, 1 do
    g[d] = { W = qgru.zeros({ 3 * c.H, c.C }):uniform(-0.1, 0.1):to(dev), R = qgru.zeros({ 3 * c.H, c.H }):uniform(-0.1, 0.1):to(dev),
             bx = qgru.zeros({ 3 * c.H }):uniform(-0.1, 0.1):to(dev), br = qgru.zeros({ 3 * c.H }):uniform(-0.1, 0.1):to(dev),
             h0 = Tensor.new({ c.N, c.H }, "f32", dev):fill(7) }
  end
  return g
end

local function arr(ct, a, b) return ffi.new(ct, a, b) end

-- The forward and backward, as two one-direction calls (bidir = false) or one bidirectional call.
local function run(gru, inp, c, dev, bidir)
  local ctx = clib.context(dev)
  local q = gru.qstate
  local lq = { [0] = q.layers[0], [1] = q.layers[1] }
  local w = { [0] = gru.weights[0][0], [1] = gru.weights[0][1] }
  local y = Tensor.new({ c.T, c.N, 2 * c.H }, "f32", dev):fill(3)
  local hn = { [0] = Tensor.new({ c.N, c.H }, "f32", dev), [1] = Tensor.new({ c.N, c.H }, "f32", dev) }
  local s = { [0] = saved_of(lq[0], c, dev), [1] = saved_of(lq[1], c, dev) }
  local h0 = inp.h0 and { [0] = inp.h0[1], [1] = inp.h0[2] } or nil
  local L = inp.L and inp.L.t or nil
  local g = grads(c, dev, 77)
  if not bidir then
    for d = 0, 1 do
      clib.check(ctx, lib.qg_int_gru_forward(ctx, lq[d].handle, y.t, d * c.H, hn[d].t, s[d].sv, nil, inp.x.t, w[d].W.t, w[d].R.t,
                                             w[d].bx.t, w[d].br.t, h0 and h0[d].t or nil, L, d))
    end
    for d = 0, 1 do
      clib.check(ctx, lib.qg_int_gru_backward(ctx, lq[d].handle, g.dx.t, g[d].W.t, g[d].R.t, g[d].bx.t, g[d].br.t,
                                              h0 and g[d].h0.t or nil, inp.dy.t, d * c.H, nil, s[d].sv, h0 and h0[d].t or nil, L, d))
    end
  else
    local h0a = h0 and arr("const qg_tensor*[2]", h0[0].t, h0[1].t) or nil
    clib.check(ctx, lib.qg_int_gru_forward_bidir(ctx, arr("qg_int_gru*[2]", lq[0].handle, lq[1].handle), y.t,
                                                 arr("qg_tensor*[2]", hn[0].t, hn[1].t), arr("const qg_int_gru_saved*[2]", s[0].sv, s[1].sv),
                                                 inp.x.t, arr("const qg_tensor*[2]", w[0].W.t, w[1].W.t),
                                                 arr("const qg_tensor*[2]", w[0].R.t, w[1].R.t),
                                                 arr("const qg_tensor*[2]", w[0].bx.t, w[1].bx.t),
                                                 arr("const qg_tensor*[2]", w[0].br.t, w[1].br.t), h0a, L))
    clib.check(ctx, lib.qg_int_gru_backward_bidir(ctx, arr("qg_int_gru*[2]", lq[0].handle, lq[1].handle), g.dx.t,
                                                  arr("qg_tensor*[2]", g[0].W.t, g[1].W.t), arr("qg_tensor*[2]", g[0].R.t, g[1].R.t),
                                                  arr("qg_tensor*[2]", g[0].bx.t, g[1].bx.t), arr("qg_tensor*[2]", g[0].br.t, g[1].br.t),
                                                  h0 and arr("qg_tensor*[2]", g[0].h0.t, g[1].h0.t) or nil, inp.dy.t, nil,
                                                  arr("const qg_int_gru_saved*[2]", s[0].sv, s[1].sv), h0a, L))
  end
  return { y = y, hn = hn, s = s, g = g }
end

local function compare(a, b)
  same_bits(a.y, b.y, "y")
  for d = 0, 1 do
    same_bits(a.hn[d], b.hn[d], "hn[" .. d .. "]")
    for _, k in ipairs({ "hq", "cell", "xq", "xmask" }) do same_bits(a.s[d][k], b.s[d][k], "saved[" .. d .. "]." .. k) end
    for _, k in ipairs({ "W", "R", "bx", "br", "h0" }) do same_bits(a.g[d][k], b.g[d][k], "d" .. k .. "[" .. d .. "]") end
  end
  same_bits(a.g.dx, b.g.dx, "dx")
end

local function check_case(c, dev)
  local gru, inp = case(c, dev)
  local one = run(gru, inp, c, dev, false)
  local both = run(gru, inp, c, dev, true)
  compare(one, both)
  -- the backward really ran and both halves of y were written (the test could not pass on no-ops)
  assert.is_true(bytes(one.g.dx) ~= bytes(grads(c, dev, 77).dx))
  local yh = host(both.y):totable()
  assert.are_not.equal(3, yh[1][1][1])
  assert.are_not.equal(3, yh[1][1][2 * c.H])
end

describe("qg_int_gru_forward_bidir / backward_bidir (cpu)", function()
  it("equal the one-direction calls bit for bit, lengths and h0", function()
    check_case({ seed = 1, T = 7, N = 3, C = 5, H = 4, lengths = true, h0 = true }, "cpu")
  end)
  it("equal the one-direction calls bit for bit, 5-bit operators, no h0", function()
    check_case({ seed = 2, T = 5, N = 2, C = 3, H = 6, bits = 5 }, "cpu")
  end)

  it("check both directions before running anything", function()
    local c = { seed = 3, T = 4, N = 2, C = 3, H = 5 }
    local gru, inp = case(c, "cpu")
    local ctx = clib.context("cpu")
    local q = gru.qstate
    local h = { q.layers[0].handle, q.layers[1].handle }
    local w = { gru.weights[0][0], gru.weights[0][1] }
    local y = Tensor.new({ c.T, c.N, 2 * c.H }, "f32", "cpu"):fill(3)
    local function wa(k) return arr("const qg_tensor*[2]", w[1][k].t, w[2][k].t) end
    local function fwd(handles, yt, hn)
      return lib.qg_int_gru_forward_bidir(ctx, handles, yt, hn, nil, inp.x.t, wa("W"), wa("R"), wa("bx"), wa("br"), nil, nil)
    end
    local function refused(st, pattern)
      assert.are.equal(lib.QG_ERR_ARG, st)
      local msg = ffi.string(lib.qg_last_error(ctx))
      assert.is_truthy(msg:find(pattern, 1, true), msg)
      assert.are.equal(bytes(Tensor.new({ c.T, c.N, 2 * c.H }, "f32", "cpu"):fill(3)), bytes(y))   -- nothing ran
    end
    refused(fwd(arr("qg_int_gru*[2]", h[1], h[1]), y.t, nil), "the same layer")
    refused(fwd(arr("qg_int_gru*[2]", h[1], nil), y.t, nil), "g must hold")
    -- direction 1's hn of the wrong shape: direction 0's forward must not have run either
    local good, bad = Tensor.new({ c.N, c.H }, "f32", "cpu"), Tensor.new({ c.N, c.H + 1 }, "f32", "cpu")
    refused(fwd(arr("qg_int_gru*[2]", h[1], h[2]), y.t, arr("qg_tensor*[2]", good.t, bad.t)), "hn")
    -- y one column short of direction 1's half
    local narrow = Tensor.new({ c.T, c.N, 2 * c.H - 1 }, "f32", "cpu"):fill(3)
    assert.are.equal(lib.QG_ERR_ARG, fwd(arr("qg_int_gru*[2]", h[1], h[2]), narrow.t, nil))
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("do not fit", 1, true))
    assert.are.equal(bytes(Tensor.new({ c.T, c.N, 2 * c.H - 1 }, "f32", "cpu"):fill(3)), bytes(narrow))
    -- layers of different sizes
    local other = nn.GRU(c.C, c.H + 1, { bidirectional = true })
    quant.prepare(other, quant.uniform(8))
    quant.calibrate(other, { qgru.zeros({ c.T, c.N, c.C }):uniform(-1, 1) }, { method = "minmax", passes = 1 })
    refused(fwd(arr("qg_int_gru*[2]", h[1], other.qstate.layers[1].handle), y.t, nil), "differ in size")
    -- the backward without saved state
    local g = grads(c, "cpu", 5)
    local st = lib.qg_int_gru_backward_bidir(ctx, arr("qg_int_gru*[2]", h[1], h[2]), g.dx.t, arr("qg_tensor*[2]", g[0].W.t, g[1].W.t),
                                             arr("qg_tensor*[2]", g[0].R.t, g[1].R.t), arr("qg_tensor*[2]", g[0].bx.t, g[1].bx.t),
                                             arr("qg_tensor*[2]", g[0].br.t, g[1].br.t), nil, inp.dy.t, nil, nil, nil, nil)
    assert.are.equal(lib.QG_ERR_ARG, st)
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("saved state missing", 1, true))
  end)
end)

describe("qg_int_gru_forward_bidir / backward_bidir #gpu", function()
  if skip_without_cuda(pending) then return end
  local cases = {
    { seed = 11, T = 20, N = 3, C = 5, H = 7, lengths = true, h0 = true },   -- the small-H kernel
    { seed = 12, T = 12, N = 17, C = 40, H = 130, lengths = true },          -- the cluster kernel
    { seed = 13, T = 3, N = 130, C = 40, H = 600, h0 = true },               -- large H, two row groups, exact split
    { seed = 14, T = 3, N = 130, C = 40, H = 600, lengths = true, math = "tf32" },
    -- the per-step backward forced: two row groups, the column maxima and dx in chunks beside the
    -- loop on each context's side stream (as cuda_int_gru_spec's seeds 75 and 76)
    { seed = 15, T = 40, N = 130, C = 9, H = 33, h0 = true, lengths = true, path = "fallback" },
    { seed = 16, T = 35, N = 130, C = 9, H = 33, path = "fallback", math = "tf32" },
  }
  for _, c in ipairs(cases) do
    it(string.format("equal the one-direction calls bit for bit: T%d N%d C%d H%d%s%s%s%s", c.T, c.N, c.C, c.H,
                     c.lengths and " lengths" or "", c.h0 and " h0" or "", c.math and (" " .. c.math) or "",
                     c.path and (" " .. c.path) or ""), function()
      qgru.setMath(c.math or "strict")
      qgru.setKernelPath(c.path or "auto")
      local ok, err = pcall(check_case, c, "cuda")
      qgru.setMath("strict")
      qgru.setKernelPath("auto")
      assert(ok, err)
    end)
  end
  it("a nn.GRU training step on the GPU equals the same on the CPU (the module takes the bidirectional call)", function()
    local function step(dev)
      local c = { seed = 21, T = 9, N = 4, C = 6, H = 5 }
      local gru, inp = case(c, dev)
      gru:training()
      local y = gru:forward(inp.x)
      local dx = gru:backward(inp.x, inp.dy)
      return y, dx, gru.grads[0][1].R
    end
    local y1, dx1, dr1 = step("cpu")
    local y2, dx2, dr2 = step("cuda")
    same_bits(y1, y2, "y (integer outputs)")
    local a, b = dx1:totable(), host(dx2):totable()
    for t = 1, #a do for n = 1, #a[t] do for k = 1, #a[t][n] do
      assert(math.abs(a[t][n][k] - b[t][n][k]) <= 1e-5 * math.max(1, math.abs(a[t][n][k])), "dx")
    end end end
    local ra, rb = dr1:totable(), host(dr2):totable()
    for i = 1, #ra do for j = 1, #ra[i] do
      assert(math.abs(ra[i][j] - rb[i][j]) <= 1e-5 * math.max(1, math.abs(ra[i][j])), "dR of direction 1")
    end end
  end)
end)
