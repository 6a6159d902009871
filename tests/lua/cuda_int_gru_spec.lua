-- cuda_int_gru_spec.lua: the integer GRU layer (qg_int_gru) on CUDA against the CPU backend and
-- the independent Lua reference (tests/lua/qref.lua). For each case the quantizers come from a
-- calibrated CPU model (mixed bitwidths 2..16, asymmetric and unsigned quantizers, odd sizes); the
-- same C layer is then built on each device and driven through the C API directly:
--   * forward: every saved byte (output.h codes of every step, the packed cell state with its mask
--     bits, input.x codes and masks), y (with a column offset; the other columns untouched) and hn
--     identical to the CPU's, with both GPU kernel paths forced in turn, with and without saved
--     state, with h0, per-row lengths and both directions; the codes also equal qref's;
--   * STE backward: every gradient within 1e-5 relative of the CPU's (accumulated onto non-zero
--     gradients; dy with a column offset, dhn, h0 / dh0, lengths, reverse; H in {1, 7, 64, 130},
--     N in {1, 3, 16, 17}), with the per-step and the persistent recurrence forced in turn, the
--     latter also with forced cluster shapes (several CTAs splitting R~'s columns, several rows
--     per cluster, forced splits, R~ forced into registers or shared memory); the same forward and
--     backward twice on the GPU: bit-identical;
--     a forced persistent backward on an H it cannot hold (or a forced shape that cannot hold H)
--     is a clear error, and auto falls back;
--   * calibration statistics observed on the GPU equal the CPU's and give identical (e, z) for
--     every operator;
--   * a forced persistent path on operands it cannot hold is a clear error; auto falls back;
--   * the W x GEMM (kernels/wx_gemm.cuh) over several partial tiles along T N, 3H and C (more K
--     tiles than its ring holds), odd and even 3H, one and two planes, observer on and off;
--   * int8 layers run the 32-bit cell (qg_int_gru_cell_path) in the persistent kernel and in the
--     tensor-core step (auto with a forced shape that cannot hold H), a unit outside its bounds
--     the general cell; the same bytes.
-- Tagged gpu: without a CUDA device the whole file is skipped with one pending line.
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local U = require("testutil")
local R = require("qref")
local nn, quant = qgru.nn, qgru.quant
local Tensor = qgru.Tensor
local ffi, lib = clib.ffi, clib.lib

local function check(ctx, st) clib.check(ctx, st, 2) end

-- describe(name, body), but without a CUDA device one pending line instead of the body.
local function gpu_describe(name, body)
  describe(name, function()
    if skip_without_cuda(pending) then return end
    body()
  end)
end

local METHODS = { minmax = lib.QG_CALIB_MINMAX, histogram = lib.QG_CALIB_HISTOGRAM, mse = lib.QG_CALIB_MSE }

-- ---- configurations ----
local BITS = { 2, 4, 8, 12, 16 }
local GEMM_OPS = { ["input.x"] = true, ["output.h"] = true, ["matmul.Wx"] = true, ["matmul.Rh"] = true,
                   ["gate.z_pre"] = true, ["gate.r_pre"] = true, ["gate.g_pre"] = true, ["op.rRh"] = true }

local function from_table(oc, name)
  return quant.fromTable(qgru.json.decode(qgru.json.encode({ GRU_config = { operator_config = oc } })), name)
end

-- Random bitwidths and signedness for every operator (seeded Lua RNG); weights may be unsigned.
local function random_config(seed)
  math.randomseed(seed)
  local oc = {}
  for _, op in ipairs(quant.OPS) do
    local e = {}
    local w = op:match("^weight") ~= nil
    e.bitwidth = BITS[math.random(#BITS)]
    if w or GEMM_OPS[op] then e.bitwidth = math.max(e.bitwidth, 4) end
    e.is_symmetric = w and (math.random() < 0.6) or (math.random() < 0.3)
    e.is_unsigned = math.random() < (w and 0.2 or 0.25)
    if op == "gate.z_out" or op == "gate.r_out" then e.is_unsigned = math.random() < 0.7 end
    oc[op] = e
  end
  return from_table(oc, "random" .. seed)
end

-- Every operator at `bits`, with some entries overridden.
local function uniform_config(bits, over, name)
  local oc = {}
  for _, op in ipairs(quant.OPS) do oc[op] = { bitwidth = bits } end
  for op, e in pairs(over or {}) do oc[op] = e end
  return from_table(oc, name)
end

-- A calibrated one-layer CPU GRU: its quantizers (LayerQuant) and weights (cpu tensors).
local function calibrated(seed, cfg, T, N, C, H)
  qgru.seed(seed)
  local gru = nn.GRU(C, H)
  for _, p in ipairs(gru:namedParameters()) do p.param:uniform(-0.7, 0.7) end
  quant.prepare(gru, cfg)
  local calib = {}
  for i = 1, 2 do calib[i] = qgru.zeros({ T, N, C }):uniform(-1.5, 1.5) end
  quant.calibrate(gru, calib, { method = "minmax", passes = 2 })
  return gru.qstate.layers[0], gru.weights[0][0]
end

-- A C layer on device dev holding the quantizers of lq; exp_over (optional): a weight slot and a
-- per-channel exponent table (1-based channel -> exponent) that replaces calibrated ones.
local function layer_on(dev, lq, C, H, exp_over)
  local ctx = clib.context(dev)
  local out = ffi.new("qg_int_gru*[1]")
  check(ctx, lib.qg_int_gru_create(ctx, out, C, H))
  local h = ffi.gc(out[0], lib.qg_int_gru_free)
  for _, q in pairs(lq:quantizers()) do
    if q.per_channel then
      local exps = q.exps
      if exp_over and exp_over.slot == q.slot then
        exps = q.exps:clone()
        for j, e in pairs(exp_over.exps) do exps:set(j, e) end
      end
      check(ctx, lib.qg_int_gru_set_weight_quant(ctx, h, q.slot, q.bitwidth, q.is_unsigned and 1 or 0, exps.t, q.zps.t))
    else
      check(ctx, lib.qg_int_gru_set_act(ctx, h, q.slot, ffi.new("qg_qspec", q.bitwidth, q.is_unsigned and 1 or 0, q.e, q.z)))
    end
  end
  return h
end

-- A unit outside every form of the 32-bit cell (int_gru_cell.h qg_cell32_sum): channel j of
-- weight.bx (gate z of unit j) set to 3e7 at exponent -18, code 114, so z_pre's sum would reach
-- 2^31 at any common scale; the 64-bit cell still holds it. Returns the weights (bx copied) and
-- the exp_over for layer_on.
local function bias_outside_32(w, j)
  local w2 = {}
  for k, v in pairs(w) do w2[k] = v end
  w2.bx = w.bx:clone()
  w2.bx:set(j, 3e7)
  return w2, { slot = lib.QG_W_BX, exps = { [j] = -18 } }
end

local function copy_to(t, dev) return t and Tensor.new(t:shape(), t:dtype(), dev):copy(t) or nil end

local function new_stats(dev)
  local s = { range = Tensor.new({ lib.QG_Q_NUM_ACT, 4 }, "f64", dev),
              counts = Tensor.new({ lib.QG_Q_NUM_ACT, lib.QG_STATS_BINS }, "i64", dev), c = ffi.new("qg_stats") }
  s.c.range, s.c.counts = s.range.t, s.counts.t
  return s
end

-- One forward of layer h on dev. inp: cpu tensors x, W, R, bx, br, h0 (or nil), L (or nil),
-- reverse; train: keep the saved state; stats: from new_stats (or nil). y has H + 3 columns
-- filled with 7 and gets the layer's output at columns [2, 2 + H).
local function forward(dev, h, inp, train, stats)
  local ctx = clib.context(dev)
  local T, N, C = inp.x:size(1), inp.x:size(2), inp.x:size(3)
  local H = inp.R:size(2)
  local o = { dev = dev, reverse = inp.reverse, x = copy_to(inp.x, dev), W = copy_to(inp.W, dev), R = copy_to(inp.R, dev), bx = copy_to(inp.bx, dev),
              br = copy_to(inp.br, dev), h0 = copy_to(inp.h0, dev), L = copy_to(inp.L, dev) }
  o.y = Tensor.new({ T, N, H + 3 }, "f32", dev):fill(7)
  o.hn = Tensor.new({ N, H }, "f32", dev)
  local saved
  if train then
    o.hq = Tensor.new({ T + 1, N, H }, "i32", dev)
    o.cell = Tensor.new({ T, N, H, lib.qg_int_gru_cell_bytes(h) }, "u8", dev)
    o.xq = Tensor.new({ T, N, C }, "i32", dev)
    o.xmask = Tensor.new({ T, N, C }, "u8", dev)
    saved = ffi.new("qg_int_gru_saved")
    saved.hq, saved.cell, saved.xq, saved.xmask = o.hq.t, o.cell.t, o.xq.t, o.xmask.t
    o.saved = saved
  end
  check(ctx, lib.qg_int_gru_forward(ctx, h, o.y.t, 2, o.hn.t, saved, stats and stats.c or nil, o.x.t, o.W.t, o.R.t, o.bx.t,
                                    o.br.t, o.h0 and o.h0.t or nil, o.L and o.L.t or nil, inp.reverse and 1 or 0))
  return o
end

-- Backward after forward o; g0: cpu tensors the gradients start from (accumulation).
local function backward(h, o, dy, dhn, g0)
  local ctx = clib.context(o.dev)
  local g = { dx = copy_to(g0.dx, o.dev), dW = copy_to(g0.dW, o.dev), dR = copy_to(g0.dR, o.dev), dbx = copy_to(g0.dbx, o.dev),
              dbr = copy_to(g0.dbr, o.dev), dh0 = Tensor.new(dhn:shape(), "f32", o.dev):fill(5) }
  local dyd, dhnd = copy_to(dy, o.dev), copy_to(dhn, o.dev)
  check(ctx, lib.qg_int_gru_backward(ctx, h, g.dx.t, g.dW.t, g.dR.t, g.dbx.t, g.dbr.t, g.dh0.t, dyd.t, 2, dhnd.t, o.saved,
                                     o.h0 and o.h0.t or nil, o.L and o.L.t or nil, o.reverse and 1 or 0))
  return g
end

local function flat(t) return U.flatten(t:totable()) end

-- Exactly equal contents (the first difference is named).
local function same(a, b, what)
  local fa, fb = flat(a), flat(b)
  assert(#fa == #fb, what .. ": sizes differ")
  for i = 1, #fa do
    if fa[i] ~= fb[i] then error(string.format("%s: element %d differs: %s vs %s (CPU)", what, i, tostring(fa[i]), tostring(fb[i])), 2) end
  end
end

local function with_path(path, fn)
  qgru.setKernelPath(path)
  local ok, err = pcall(fn)
  qgru.setKernelPath("auto")
  if not ok then error(err, 0) end
end

-- The STE backward's inputs of a case (cpu tensors, seeded from it): dy with three columns beyond
-- H (backward reads it at column offset 2), dhn, and the gradients to accumulate onto: non-zero,
-- or zeros when zero_g0 is set.
local function ste_inputs(c, zero_g0)
  qgru.seed(300 + c.seed)
  local dy = qgru.zeros({ c.T, c.N, c.H + 3 }):uniform(-1, 1)
  local dhn = qgru.zeros({ c.N, c.H }):uniform(-1, 1)
  local g0 = { dx = qgru.zeros({ c.T, c.N, c.C }), dW = qgru.zeros({ 3 * c.H, c.C }), dR = qgru.zeros({ 3 * c.H, c.H }),
               dbx = qgru.zeros({ 3 * c.H }), dbr = qgru.zeros({ 3 * c.H }) }
  if not zero_g0 then
    for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr" }) do g0[k]:uniform(-0.1, 0.1) end
  end
  return dy, dhn, g0
end

-- Inputs of a case (cpu tensors).
local function inputs(c, w)
  qgru.seed(100 + c.seed)
  local inp = { x = qgru.zeros({ c.T, c.N, c.C }):uniform(-1.5, 1.5), W = w.W, R = w.R, bx = w.bx, br = w.br, reverse = c.reverse }
  if c.h0 then inp.h0 = qgru.zeros({ c.N, c.H }):uniform(-0.8, 0.8) end
  if c.lengths then
    local l = {}
    for n = 1, c.N do l[n] = ((n * 7 + c.seed) % c.T) + 1 end
    l[1] = c.T
    inp.L = Tensor.from(l, "i64")
  end
  return inp
end

-- An STE case at uniform 8-bit operators (over: entries that replace some, name: the config's
-- label): its quantizers (LayerQuant), inputs, STE inputs (zero_g0 as for ste_inputs) and the
-- CPU's gradients, the reference of the GPU runs.
local function uniform_ste_case(c, over, name, zero_g0)
  local lq, w = calibrated(c.seed, uniform_config(8, over, name), c.T, c.N, c.C, c.H)
  local inp = inputs(c, w)
  local dy, dhn, g0 = ste_inputs(c, zero_g0)
  local hc = layer_on("cpu", lq, c.C, c.H)
  return lq, inp, dy, dhn, g0, backward(hc, forward("cpu", hc, inp, true), dy, dhn, g0)
end

-- The CPU's training forward of case c on inputs inp, the reference of the GPU runs, after two
-- checks of the CPU itself: its inference y equals its training y, and (c.qref) its codes of every
-- step equal the independent Lua reference's (tests/lua/qref.lua; no lengths there).
local function cpu_reference(c, lq, w, inp, exp_over)
  local ref = forward("cpu", layer_on("cpu", lq, c.C, c.H, exp_over), inp, true)
  local ref_inf = forward("cpu", layer_on("cpu", lq, c.C, c.H, exp_over), inp, false)
  same(ref_inf.y, ref.y, "CPU inference y vs training y")
  if c.qref then
    local A, Wq = U.qref_quantizers(lq)
    local F = R.layer(A, Wq, { W = w.W:totable(), R = w.R:totable(), bx = w.bx:totable(), br = w.br:totable() }, inp.x:totable(),
                      inp.h0 and inp.h0:totable() or nil, c.reverse)
    local hq = ref.hq:totable()
    for s = 0, c.T do
      for n = 1, c.N do
        for i = 1, c.H do
          if hq[s + 1][n][i] ~= F.hq[s][n][i] then
            error(string.format("step %d row %d unit %d: CPU code %d, reference %d", s, n, i, hq[s + 1][n][i], F.hq[s][n][i]))
          end
        end
      end
    end
  end
  return ref
end

local CASES = {
  { seed = 1, T = 5, N = 3, C = 5, H = 7, h0 = true, qref = true },
  { seed = 2, T = 4, N = 1, C = 1, H = 1, reverse = true, qref = true },
  { seed = 3, T = 6, N = 17, C = 300, H = 130, h0 = true, lengths = true, reverse = true },
  { seed = 4, T = 7, N = 17, C = 5, H = 130, lengths = true },
  { seed = 5, T = 3, N = 3, C = 300, H = 7, reverse = true, qref = true },
  { seed = 6, T = 8, N = 3, C = 1, H = 7, h0 = true, lengths = true },
  { seed = 8, T = 5, N = 17, C = 5, H = 1, h0 = true, lengths = true, reverse = true },
  { seed = 9, T = 4, N = 3, C = 5, H = 7, h0 = true, qref = true, name = "every operator 16-bit (two int8 planes per operand)",
    cfg = function() return uniform_config(16, { ["gate.z_out"] = { bitwidth = 16, is_unsigned = true } }, "u16") end },
  { seed = 10, T = 5, N = 3, C = 5, H = 7, h0 = true, lengths = true, qref = false,
    name = "unsigned asymmetric weights and inputs, asymmetric output.h, 12-bit h with 4-bit R",
    cfg = function()
      return uniform_config(8, {
        ["weight.W"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true },
        ["weight.R"] = { bitwidth = 4, is_symmetric = false, is_unsigned = true },
        ["weight.bw"] = { bitwidth = 8, is_symmetric = false, is_unsigned = false },
        ["input.x"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true },
        ["output.h"] = { bitwidth = 12, is_symmetric = false, is_unsigned = false },
        ["op.rRh"] = { bitwidth = 20, is_symmetric = false },   -- the 128-bit cell
      }, "asym")
    end },
  { seed = 11, T = 6, N = 3, C = 5, H = 130, lengths = true, reverse = true, name = "signed asymmetric 8-bit weights",
    cfg = function()
      return uniform_config(8, { ["weight.W"] = { bitwidth = 8, is_symmetric = false }, ["weight.R"] = { bitwidth = 8, is_symmetric = false } },
                            "asym8")
    end },
  -- the tensor-core step (the forced fallback path on <= 16-bit operands): tiles of 32 units x
  -- 64 batch rows, H not a multiple of 32, N above and below 64, both plane counts of R and h
  { seed = 13, T = 5, N = 70, C = 9, H = 300, h0 = true, lengths = true, reverse = true,
    name = "several unit and batch tiles, both partial" },
  { seed = 14, T = 4, N = 1, C = 3, H = 300, h0 = true, qref = true, name = "one batch row, 8-bit, R and h asymmetric unsigned",
    cfg = function()
      return uniform_config(8, { ["weight.R"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true },
                                 ["output.h"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } }, "u8h")
    end },
  { seed = 15, T = 5, N = 17, C = 5, H = 130, h0 = true, lengths = true,
    name = "16-bit unsigned asymmetric R, 12-bit unsigned asymmetric h (two planes each)",
    cfg = function()
      return uniform_config(8, { ["weight.R"] = { bitwidth = 16, is_symmetric = false, is_unsigned = true },
                                 ["output.h"] = { bitwidth = 12, is_symmetric = false, is_unsigned = true } }, "r16h12")
    end },
  { seed = 16, T = 4, N = 66, C = 5, H = 300, lengths = true, reverse = true,
    name = "12-bit signed asymmetric R (two planes), 8-bit unsigned h",
    cfg = function()
      return uniform_config(8, { ["weight.R"] = { bitwidth = 12, is_symmetric = false },
                                 ["output.h"] = { bitwidth = 8, is_unsigned = true } }, "r12h8u")
    end },
  { seed = 17, T = 4, N = 3, C = 5, H = 130, h0 = true, qref = true, name = "4-bit unsigned R, 16-bit signed asymmetric h (two planes)",
    cfg = function()
      return uniform_config(8, { ["weight.R"] = { bitwidth = 4, is_unsigned = true },
                                 ["output.h"] = { bitwidth = 16, is_symmetric = false } }, "r4h16")
    end },
  -- the W x GEMM's tiles (kernels/wx_gemm.cuh: 128 or 64 time rows x 128 output rows, K tiles of
  -- 64 through a 4-deep ring): several partial tiles along every dimension, more K tiles than
  -- the ring holds, odd 3H (element-wise stores) and even 3H (paired stores)
  { seed = 18, T = 3, N = 100, C = 200, H = 50, h0 = true, lengths = true,
    name = "W x: T N = 300, 3H = 150, C = 200 (partial tiles, 4 K tiles), every operator 16-bit (two planes)",
    cfg = function() return uniform_config(16, { ["weight.W"] = { bitwidth = 16, is_symmetric = false, is_unsigned = true } }, "wx16") end },
  { seed = 19, T = 2, N = 150, C = 330, H = 45, reverse = true, name = "W x: odd 3H = 135, T N = 300, C = 330 (6 K tiles, partial)" },
  { seed = 20, T = 1, N = 2, C = 70, H = 45, h0 = true, name = "W x: T N = 2 (one partial time tile), 8-bit asymmetric unsigned W",
    cfg = function() return uniform_config(8, { ["weight.W"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } }, "wx8a") end },
}

describe("integer GRU on CUDA == CPU, bit for bit #gpu", function()
  if skip_without_cuda(pending) then return end

  for _, c in ipairs(CASES) do
    local label = string.format("seed %d: T=%d N=%d C=%d H=%d%s%s%s%s", c.seed, c.T, c.N, c.C, c.H, c.h0 and " h0" or "",
                                c.lengths and " lengths" or "", c.reverse and " reverse" or "", c.name and (" (" .. c.name .. ")") or "")
    it(label, function()
      local lq, w = calibrated(c.seed, c.cfg and c.cfg() or random_config(c.seed), c.T, c.N, c.C, c.H)
      local inp = inputs(c, w)
      local ref = cpu_reference(c, lq, w, inp)
      for _, path in ipairs({ "fallback", "persistent" }) do
        with_path(path, function()
          local hg = layer_on("cuda", lq, c.C, c.H)
          local o = forward("cuda", hg, inp, true)
          for _, k in ipairs({ "xq", "xmask", "hq", "cell", "y", "hn" }) do same(o[k], ref[k], path .. " " .. k) end
          local oi = forward("cuda", hg, inp, false)
          same(oi.y, ref.y, path .. " inference y")
          same(oi.hn, ref.hn, path .. " inference hn")
        end)
      end
    end)
  end

  it("a forced persistent path on operands above 16 bits is a clear error; auto and fallback match the CPU", function()
    local c = { seed = 12, T = 5, N = 3, C = 5, H = 7, h0 = true, lengths = true }
    local cfg = uniform_config(8, { ["input.x"] = { bitwidth = 20, is_symmetric = false }, ["output.h"] = { bitwidth = 18, is_symmetric = false } },
                               "wide")
    local lq, w = calibrated(c.seed, cfg, c.T, c.N, c.C, c.H)
    local inp = inputs(c, w)
    local ref = forward("cpu", layer_on("cpu", lq, c.C, c.H), inp, true)
    with_path("persistent", function()
      assert.raises_match(function() forward("cuda", layer_on("cuda", lq, c.C, c.H), inp, true) end,
                          "the persistent integer GRU kernel needs output.h and weight.R of at most 16 bits (got 18 and 8)")
    end)
    for _, path in ipairs({ "auto", "fallback" }) do
      with_path(path, function()
        local o = forward("cuda", layer_on("cuda", lq, c.C, c.H), inp, true)
        for _, k in ipairs({ "xq", "xmask", "hq", "cell", "y", "hn" }) do same(o[k], ref[k], path .. " " .. k) end
      end)
    end
  end)
end)

gpu_describe("integer GRU on CUDA: STE backward, determinism, calibration #gpu", function()

  -- shape: the persistent backward's forced {cluster, rows, splits} (qg_ctx_set_persist_shape), or
  -- nil (chosen); the fallback path ignores it
  local BCASES = {
    { seed = 21, T = 6, N = 3, C = 5, H = 7, h0 = true, lengths = true, reverse = true },
    { seed = 22, T = 5, N = 17, C = 300, H = 130, h0 = true },
    { seed = 23, T = 7, N = 1, C = 1, H = 1, lengths = true },
    { seed = 24, T = 9, N = 17, C = 5, H = 7, lengths = true, reverse = true, shape = { 2, 8, 0 } },
    { seed = 25, T = 5, N = 3, C = 5, H = 130, h0 = true, lengths = true, reverse = true, shape = { 8, 2, 0 } },
    { seed = 26, T = 4, N = 1, C = 5, H = 130, h0 = true, shape = { 4, 1, 5 } },
    { seed = 27, T = 6, N = 17, C = 5, H = 1, h0 = true, reverse = true, shape = { 1, 4, 0 } },
    { seed = 28, T = 3, N = 3, C = 5, H = 130, lengths = true, shape = { 1, 1, 0 } },
    -- the cluster's dq exchange (st.async on two mbarriers): one step (one armed phase), two steps
    -- (both buffers once), with lengths
    { seed = 58, T = 1, N = 3, C = 5, H = 130, h0 = true, shape = { 4, 2, 0, 1 } },
    { seed = 59, T = 2, N = 5, C = 5, H = 64, lengths = true, reverse = true, shape = { 2, 4, 0, 1 } },
    { seed = 29, T = 30, N = 16, C = 40, H = 64, lengths = true },   -- long-kws-like
    -- the strict per-step product's kernel (step_product_kernel) on the fallback: two row tiles of
    -- 64 (the second of 6 rows), two unit tiles of 32 (the second of 8), K slices of 32 columns
    -- (the last of 24)
    { seed = 57, T = 4, N = 70, C = 5, H = 40, h0 = true, lengths = true },
    -- R~ forced into registers ({cluster, rows, splits, storage = 2}: bwd_reg_kernel) or shared
    -- memory (storage = 1): one lane per unit, two and four lanes, several rows, a cluster
    { seed = 41, T = 12, N = 16, C = 40, H = 64, lengths = true, shape = { 1, 1, 4, 2 } },
    { seed = 42, T = 9, N = 5, C = 7, H = 64, h0 = true, lengths = true, reverse = true, shape = { 1, 2, 2, 2 } },
    { seed = 43, T = 7, N = 3, C = 5, H = 7, h0 = true, lengths = true, shape = { 1, 1, 1, 2 } },
    { seed = 44, T = 6, N = 17, C = 5, H = 130, lengths = true, reverse = true, shape = { 8, 8, 16, 2 } },
    { seed = 45, T = 8, N = 16, C = 40, H = 64, h0 = true, shape = { 1, 1, 8, 1 } },
    -- R~ in registers with the cell on warps of its own (storage = 3: bwd_ws_kernel)
    { seed = 46, T = 12, N = 16, C = 40, H = 64, lengths = true, shape = { 1, 1, 4, 3 } },
    { seed = 47, T = 9, N = 5, C = 7, H = 64, h0 = true, lengths = true, reverse = true, shape = { 1, 1, 2, 3 } },
    { seed = 48, T = 7, N = 3, C = 5, H = 7, h0 = true, lengths = true, reverse = true, shape = { 1, 1, 1, 3 } },
    { seed = 49, T = 6, N = 17, C = 5, H = 30, h0 = true, lengths = true, shape = { 1, 1, 2, 3 } },
    -- bwd_ws_kernel's ring of copies (8 steps) and its bias sums per (row, unit): fewer steps than the
    -- ring, several turns of it with lengths and reverse, four lanes at H = 40
    { seed = 50, T = 1, N = 4, C = 5, H = 64, lengths = true, shape = { 1, 1, 2, 3 } },
    { seed = 51, T = 40, N = 16, C = 40, H = 64, h0 = true, lengths = true, reverse = true, shape = { 1, 1, 2, 3 } },
    { seed = 52, T = 25, N = 3, C = 5, H = 40, lengths = true, shape = { 1, 1, 4, 3 } },
    -- the cell's inputs prepared on warps of their own (storage = 4: bwd_ws3_kernel)
    { seed = 53, T = 12, N = 16, C = 40, H = 64, lengths = true, shape = { 1, 1, 2, 4 } },
    { seed = 54, T = 40, N = 5, C = 7, H = 64, h0 = true, lengths = true, reverse = true, shape = { 1, 1, 4, 4 } },
    { seed = 55, T = 7, N = 3, C = 5, H = 7, h0 = true, lengths = true, reverse = true, shape = { 1, 1, 1, 4 } },
    { seed = 56, T = 1, N = 17, C = 5, H = 30, h0 = true, lengths = true, shape = { 1, 1, 2, 4 } },
  }
  local gpu_ctx = clib.context("cuda")
  for _, c in ipairs(BCASES) do
    local sh = c.shape and string.format(" (persistent forced to %d CTAs x %d rows, %d splits%s)", c.shape[1], c.shape[2], c.shape[3],
                                         ({ [1] = ", R~ in shared memory", [2] = ", R~ in registers", [3] = ", R~ in registers, the cell on warps of its own",
                                           [4] = ", R~ in registers, the cell and its inputs on warps of their own" })[c.shape[4] or 0] or "") or ""
    it(string.format("seed %d: T=%d N=%d C=%d H=%d%s%s%s: STE gradients within 1e-5 of the CPU's, both paths%s; the same run twice "
                     .. "is bit-identical", c.seed, c.T, c.N, c.C, c.H, c.h0 and " h0" or "", c.lengths and " lengths" or "",
                     c.reverse and " reverse" or "", sh), function()
      local lq, w = calibrated(c.seed, random_config(c.seed), c.T, c.N, c.C, c.H)
      local inp = inputs(c, w)
      local dy, dhn, g0 = ste_inputs(c)
      local hc = layer_on("cpu", lq, c.C, c.H)
      local ref = forward("cpu", hc, inp, true)
      local gref = backward(hc, ref, dy, dhn, g0)
      for _, path in ipairs({ "fallback", "persistent" }) do
        with_path(path, function()
          local hg = layer_on("cuda", lq, c.C, c.H)
          local runs = {}
          -- the forced shape applies to the backward only (the integer forward takes it too, and
          -- a backward shape need not suit the forward)
          local ok, err = pcall(function()
            for r = 1, 2 do
              local o = forward("cuda", hg, inp, true)
              if path == "persistent" and c.shape then
                check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, c.shape[1], c.shape[2], c.shape[3], c.shape[4] or 0))
              end
              runs[r] = { o = o, g = backward(hg, o, dy, dhn, g0) }
              check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
            end
          end)
          check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
          if not ok then error(err, 0) end
          for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
            local err = U.rel_err(flat(runs[1].g[k]), flat(gref[k]))
            assert(err < 1e-5, string.format("%s %s: relative error %.3g vs the CPU", path, k, err))
            same(runs[2].g[k], runs[1].g[k], path .. " second run " .. k)
          end
          for _, k in ipairs({ "hq", "cell", "y", "hn" }) do same(runs[2].o[k], runs[1].o[k], path .. " second run " .. k) end
        end)
      end
    end)
  end

  -- the per-step kernel's two record layouts beyond the narrow one with tables: pre-activations
  -- above 16 bits store wide records (five words); with matmul.Rh at 18 bits the tables stay (all
  -- three activations at 8 bits), with gate.z_pre at 18 bits there are none (the cell computes
  -- the activations directly)
  for _, v in ipairs({ { "rh18", { ["matmul.Rh"] = { bitwidth = 18, is_symmetric = false } } },
                       { "zp18", { ["gate.z_pre"] = { bitwidth = 18, is_symmetric = false } } } }) do
    it(string.format("per-step path, wide saved records (%s): STE gradients within 1e-5 of the CPU's; the same run twice is bit-identical",
                     v[1]), function()
      local c = { seed = 34, T = 5, N = 11, C = 6, H = 70, h0 = true, lengths = true, reverse = true }
      local lq, inp, dy, dhn, g0, gref = uniform_ste_case(c, v[2], v[1], true)   -- ste_inputs' seed 334
      with_path("fallback", function()
        local hg = layer_on("cuda", lq, c.C, c.H)
        local runs = {}
        for r = 1, 2 do
          local o = forward("cuda", hg, inp, true)
          runs[r] = backward(hg, o, dy, dhn, g0)
        end
        for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
          local err = U.rel_err(flat(runs[1][k]), flat(gref[k]))
          assert(err < 1e-5, string.format("%s %s: relative error %.3g vs the CPU", v[1], k, err))
          same(runs[2][k], runs[1][k], v[1] .. " second run " .. k)
        end
      end)
    end)
  end

  -- TF32 mode on the per-step path (auto takes it above H ~ 520): with the weights, input.x and
  -- output.h at most 8 bits the backward's GEMMs run on bf16 tensor cores, each gradient split in
  -- two bf16 pieces (kernels/int_gru_backward.cu, top): every product exact, so the gradients stay
  -- within 2e-5 of the CPU's strict fp32, where TF32's 11-bit operands give ~1e-4 (so this bound
  -- also shows that the split ran). Several K slices of the per-step product (H = 130: 3) and one
  -- (H = 7). A 12-bit R or output.h keeps the TF32 GEMMs: within 5e-3. The same run twice: bit-identical.
  for _, v in ipairs({
    { "int8: bf16 split, 3 slices", {}, 2e-5, { seed = 61, T = 6, N = 17, C = 37, H = 130, h0 = true, lengths = true, reverse = true } },
    { "int8: bf16 split, one slice", {}, 2e-5, { seed = 62, T = 5, N = 3, C = 5, H = 7, lengths = true } },
    -- dx in chunks of ceil(2048 / N) steps beside the per-step loop (QGRU_SIDE_CHUNK_ROWS): 16-step
    -- chunks with lengths, 32-step chunks reversed (the last one short)
    { "int8: bf16 split, dx in chunks beside the loop", {}, 2e-5, { seed = 65, T = 40, N = 130, C = 9, H = 33, h0 = true, lengths = true } },
    { "int8: bf16 split, dx in chunks, reversed", {}, 2e-5, { seed = 66, T = 70, N = 64, C = 9, H = 33, reverse = true } },
    { "12-bit weight.R: TF32", { ["weight.R"] = { bitwidth = 12 } }, 5e-3, { seed = 63, T = 5, N = 17, C = 37, H = 130, h0 = true } },
    { "12-bit output.h: TF32", { ["output.h"] = { bitwidth = 12 } }, 5e-3, { seed = 64, T = 5, N = 17, C = 37, H = 130, lengths = true } },
  }) do
    it(string.format("TF32 mode, per-step path, %s: STE gradients within %g of the CPU's; the same run twice is bit-identical", v[1], v[3]),
       function()
      local c = v[4]
      local lq, inp, dy, dhn, g0, gref = uniform_ste_case(c, v[2], v[1])
      qgru.setMath("tf32")
      local ok, err = pcall(with_path, "fallback", function()
        local hg = layer_on("cuda", lq, c.C, c.H)
        local runs = {}
        for r = 1, 2 do runs[r] = backward(hg, forward("cuda", hg, inp, true), dy, dhn, g0) end
        for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
          local e = U.rel_err(flat(runs[1][k]), flat(gref[k]))
          assert(e < v[3], string.format("%s %s: relative error %.3g vs the CPU (bound %g)", v[1], k, e, v[3]))
          same(runs[2][k], runs[1][k], v[1] .. " second run " .. k)
        end
      end)
      qgru.setMath("strict")
      if not ok then error(err, 0) end
    end)
  end

  -- Strict mode's exact int8 split products (kernels/exact_split.cuh; tests/c/test_exact_split.cu
  -- checks the products themselves against float64), forced on (QG_SPLIT_ON: auto takes them only
  -- at large shapes) on both backward paths (the per-step product on the fallback, the after-loop
  -- GEMMs on both): STE gradients within 1e-5 of the CPU's, the same run twice bit-identical, and
  -- dx, dW, dR not bit-identical to the fp32 SGEMMs' (QG_SPLIT_OFF): the split rounds once where
  -- SGEMM rounds at every FMA, so equal bits would mean it did not run. Unsigned output.h (codes
  -- offset by 128) and asymmetric input.x (a zero-point correction) too. A 12-bit weight.R keeps
  -- the SGEMMs: the same bits as QG_SPLIT_OFF.
  for _, v in ipairs({
    { "int8", {}, true, { seed = 71, T = 6, N = 17, C = 37, H = 130, h0 = true, lengths = true, reverse = true } },
    { "int8, unsigned output.h", { ["output.h"] = { bitwidth = 8, is_unsigned = true, is_symmetric = false } }, true,
      { seed = 72, T = 5, N = 3, C = 5, H = 7, lengths = true } },
    { "12-bit weight.R", { ["weight.R"] = { bitwidth = 12 } }, false, { seed = 73, T = 5, N = 9, C = 11, H = 40, h0 = true } },
    -- N >= 128: the per-step chain as two row groups on two streams (rows 0-71 and 72-129)
    { "int8, two row groups", {}, true, { seed = 74, T = 4, N = 130, C = 9, H = 33, h0 = true, lengths = true, reverse = true } },
    -- the column maxima and dx in chunks of ceil(2048 / N) steps beside the per-step loop
    -- (QGRU_SIDE_CHUNK_ROWS, on the context's last ext stream), where the loop has two chunks or
    -- more: with row groups and lengths (16-step chunks), reversed (time rows T - 16 (k + 1) ..
    -- T - 16 k), one row group (N = 64: 32-step chunks, the last one short)
    { "int8, two row groups, dx in chunks beside the loop", {}, true, { seed = 75, T = 40, N = 130, C = 9, H = 33, h0 = true, lengths = true } },
    { "int8, dx in chunks, reversed", {}, true, { seed = 76, T = 35, N = 130, C = 9, H = 33, reverse = true } },
    { "int8, one row group, dx in chunks", {}, true, { seed = 77, T = 70, N = 64, C = 9, H = 33, lengths = true } },
    -- the per-step split in the step kernel (bwd_step1_xs_kernel): clusters of 8 blocks of 128 units
    -- (H = 1000) with per-channel zero points of weight.R (the corrections summed over the cluster);
    -- above 1024 units, the split kernel after the step kernel (xs_rows_kernel) instead. The
    -- persistent backward cannot hold these H: the per-step path only.
    { "int8, asymmetric weight.R, 8-block clusters", { ["weight.R"] = { bitwidth = 8, is_symmetric = false } }, true,
      { seed = 78, T = 3, N = 11, C = 5, H = 1000, h0 = true, lengths = true, fallback_only = true } },
    { "int8, H above a cluster's units", {}, true, { seed = 79, T = 3, N = 5, C = 3, H = 1030, reverse = true, fallback_only = true } },
  }) do
    it(string.format("strict mode, exact int8 split forced on, %s, %s: STE gradients within 1e-5 of the CPU's, %s the SGEMMs'; "
                     .. "the same run twice is bit-identical", v[4].fallback_only and "the per-step path" or "both paths", v[1],
                     v[3] and "different bits from" or "the same bits as"), function()
      local c = v[4]
      local lq, inp, dy, dhn, g0, gref = uniform_ste_case(c, v[2], v[1])
      for _, path in ipairs(c.fallback_only and { "fallback" } or { "fallback", "persistent" }) do
        local ok, err = pcall(with_path, path, function()
          local hg = layer_on("cuda", lq, c.C, c.H)
          local o = forward("cuda", hg, inp, true)
          check(gpu_ctx, lib.qg_ctx_set_exact_split(gpu_ctx, lib.QG_SPLIT_OFF))
          local plain = backward(hg, o, dy, dhn, g0)
          check(gpu_ctx, lib.qg_ctx_set_exact_split(gpu_ctx, lib.QG_SPLIT_ON))
          local runs = {}
          for r = 1, 2 do runs[r] = backward(hg, o, dy, dhn, g0) end
          for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
            local e = U.rel_err(flat(runs[1][k]), flat(gref[k]))
            assert(e < 1e-5, string.format("%s, %s %s: relative error %.3g vs the CPU", v[1], path, k, e))
            same(runs[2][k], runs[1][k], v[1] .. ", " .. path .. " second run " .. k)
          end
          for _, k in ipairs({ "dx", "dW", "dR" }) do
            local a, b = flat(runs[1][k]), flat(plain[k])
            local equal = true
            for i = 1, #a do if a[i] ~= b[i] then equal = false break end end
            assert(equal ~= v[3], string.format("%s, %s %s: %s the SGEMMs' bits", v[1], path, k, equal and "the same as" or "different from"))
          end
        end)
        check(gpu_ctx, lib.qg_ctx_set_exact_split(gpu_ctx, lib.QG_SPLIT_AUTO))
        if not ok then error(err, 0) end
      end
    end)
  end

  it("a forced persistent backward on an R~ no cluster can hold (H = 600) or a forced shape that cannot hold H is a clear error; "
     .. "auto falls back and matches the CPU", function()
    local c = { seed = 32, T = 3, N = 2, C = 3, H = 600, h0 = true }
    local lq, inp, dy, dhn, g0, gref = uniform_ste_case(c, nil, "int8", true)   -- ste_inputs' seed 332
    local hg = layer_on("cuda", lq, c.C, c.H)
    local o = forward("cuda", hg, inp, true)   -- auto path
    with_path("persistent", function()
      assert.raises_match(function() backward(hg, o, dy, dhn, g0) end,
                          "the persistent integer GRU backward needs R~ (float [3H, H], H = 600) split over the shared memory "
                          .. "of a cluster of up to 16 CTAs: 273600 bytes per CTA with 16 plus the exchanged dq")
    end)
    local g = backward(hg, o, dy, dhn, g0)   -- auto: the per-step path
    for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
      local err = U.rel_err(flat(g[k]), flat(gref[k]))
      assert(err < 1e-5, string.format("auto %s: relative error %.3g vs the CPU", k, err))
    end
    -- a forced shape of 16 CTAs cannot split H = 7 units (every CTA needs one)
    local c7 = { seed = 33, T = 3, N = 2, C = 3, H = 7 }
    local lq7, w7 = calibrated(c7.seed, uniform_config(8, nil, "int8"), c7.T, c7.N, c7.C, c7.H)
    local h7 = layer_on("cuda", lq7, c7.C, c7.H)
    local o7 = forward("cuda", h7, inputs(c7, w7), true)
    local z7 = { dx = qgru.zeros({ c7.T, c7.N, c7.C }), dW = qgru.zeros({ 3 * c7.H, c7.C }), dR = qgru.zeros({ 3 * c7.H, c7.H }),
                 dbx = qgru.zeros({ 3 * c7.H }), dbr = qgru.zeros({ 3 * c7.H }) }
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 16, 1, 0, 0))
    local ok, err = pcall(function()
      with_path("persistent", function()
        assert.raises_match(function() backward(h7, o7, qgru.zeros({ c7.T, c7.N, c7.H + 3 }), qgru.zeros({ c7.N, c7.H }), z7) end,
                            "the persistent integer GRU backward needs a forced shape that holds H = 7: 16 CTAs per cluster, 1 rows")
      end)
    end)
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
    if not ok then error(err, 0) end
    -- R~ forced into registers where no instantiated share holds 3H = 1800 per unit
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 1, 1, 0, 2))
    ok, err = pcall(function()
      with_path("persistent", function()
        assert.raises_match(function() backward(hg, o, dy, dhn, g0) end,
                            "the persistent integer GRU backward needs a forced shape that holds H = 600: 1 CTAs per cluster, 1 rows")
      end)
    end)
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
    if not ok then error(err, 0) end
  end)

  -- The per-step loop is captured into a CUDA graph on the second identical call and replayed
  -- after: the same tensors backward four times (direct, capture, replay, replay), then new length
  -- values in the same device tensor (same key: the graph reads them), then another T (a new key).
  it("the per-step backward's captured loop: repeated calls, changed lengths and a changed T all match the CPU", function()
    local c = { seed = 34, T = 7, N = 19, C = 6, H = 130, h0 = true, lengths = true, reverse = true }
    local lq, w = calibrated(c.seed, random_config(c.seed), c.T, c.N, c.C, c.H)
    local hc = layer_on("cpu", lq, c.C, c.H)
    local zero_g = function(T)
      return { dx = qgru.zeros({ T, c.N, c.C }):uniform(-0.1, 0.1), dW = qgru.zeros({ 3 * c.H, c.C }):uniform(-0.1, 0.1),
               dR = qgru.zeros({ 3 * c.H, c.H }):uniform(-0.1, 0.1), dbx = qgru.zeros({ 3 * c.H }):uniform(-0.1, 0.1),
               dbr = qgru.zeros({ 3 * c.H }):uniform(-0.1, 0.1), dh0 = qgru.zeros({ c.N, c.H }) }
    end
    with_path("fallback", function()
      local hg = layer_on("cuda", lq, c.C, c.H)
      for _, T in ipairs({ c.T, c.T + 2 }) do
        local cT = { seed = c.seed, T = T, N = c.N, C = c.C, H = c.H, h0 = true, lengths = true, reverse = true }
        local inp = inputs(cT, w)
        qgru.seed(400 + T)
        local dy = qgru.zeros({ T, c.N, c.H + 3 }):uniform(-1, 1)
        local dhn = qgru.zeros({ c.N, c.H }):uniform(-1, 1)
        local g0 = zero_g(T)
        local o = forward("cuda", hg, inp, true)
        local dyd, dhnd = copy_to(dy, "cuda"), copy_to(dhn, "cuda")
        local gd = {}
        for k, v in pairs(g0) do gd[k] = copy_to(v, "cuda") end
        for round = 1, 2 do
          if round == 2 then   -- other lengths, same device tensor; the saved state recomputed in place
            local l = {}
            for n = 1, c.N do l[n] = ((n * 5 + 3) % T) + 1 end
            inp.L = Tensor.from(l, "i64")
            o.L:copy(inp.L)
            check(gpu_ctx, lib.qg_int_gru_forward(gpu_ctx, hg, o.y.t, 2, o.hn.t, o.saved, nil, o.x.t, o.W.t, o.R.t, o.bx.t, o.br.t,
                                                  o.h0.t, o.L.t, 1))
          end
          local gref = backward(hc, forward("cpu", hc, inp, true), dy, dhn, g0)
          local first
          for r = 1, 4 do
            for k, v in pairs(g0) do gd[k]:copy(v) end
            check(gpu_ctx, lib.qg_int_gru_backward(gpu_ctx, hg, gd.dx.t, gd.dW.t, gd.dR.t, gd.dbx.t, gd.dbr.t, gd.dh0.t, dyd.t, 2,
                                                   dhnd.t, o.saved, o.h0.t, o.L.t, 1))
            local got = {}
            for _, k in ipairs({ "dx", "dW", "dR", "dbx", "dbr", "dh0" }) do
              got[k] = gd[k]:to("cpu")
              local err = U.rel_err(flat(got[k]), flat(gref[k]))
              assert(err < 1e-5, string.format("T=%d round %d call %d %s: relative error %.3g vs the CPU", T, round, r, k, err))
              if first then same(got[k], first[k], string.format("T=%d round %d call %d %s vs call 1", T, round, r, k)) end
            end
            first = first or got
          end
        end
      end
    end)
  end)

  local SCASES = {
    { seed = 31, T = 6, N = 17, C = 5, H = 130, h0 = true, lengths = true, reverse = true },
    { seed = 32, T = 4, N = 67, C = 7, H = 300, h0 = true, lengths = true, name = "12-bit h, 16-bit R",
      cfg = function()
        return uniform_config(8, { ["weight.R"] = { bitwidth = 16, is_symmetric = false },
                                   ["output.h"] = { bitwidth = 12, is_symmetric = false, is_unsigned = true } }, "stats16")
      end },
    -- the W x GEMM's observer variants over several tiles: one plane (asymmetric W), two planes
    { seed = 34, T = 3, N = 100, C = 200, H = 50, lengths = true, reverse = true, name = "W x over tiles, 8-bit asymmetric W",
      cfg = function() return uniform_config(8, { ["weight.W"] = { bitwidth = 8, is_symmetric = false } }, "obs8") end },
    { seed = 35, T = 3, N = 100, C = 200, H = 45, h0 = true, lengths = true, name = "W x over tiles, 12-bit x, 16-bit W",
      cfg = function()
        return uniform_config(8, { ["weight.W"] = { bitwidth = 16, is_symmetric = false }, ["input.x"] = { bitwidth = 12, is_symmetric = false } },
                              "obs16")
      end },
  }
  for _, c in ipairs(SCASES) do
    it(string.format("seed %d: calibration statistics observed on the GPU give the CPU's (e, z) for every operator, both paths%s",
                     c.seed, c.name and (" (" .. c.name .. ")") or ""), function()
      local lq, w = calibrated(c.seed, c.cfg and c.cfg() or random_config(c.seed), c.T, c.N, c.C, c.H)
      local inp = inputs(c, w)
      local function observe(dev, h)
        local ctx = clib.context(dev)
        local st = new_stats(dev)
        check(ctx, lib.qg_stats_reset(ctx, st.c))
        forward(dev, h, inp, false, st)
        check(ctx, lib.qg_stats_begin_histogram(ctx, st.c))
        forward(dev, h, inp, true, st)
        return st
      end
      local ref = observe("cpu", layer_on("cpu", lq, c.C, c.H))
      local rr, rc = ref.range:totable(), ref.counts:totable()
      for _, path in ipairs({ "fallback", "persistent" }) do
        with_path(path, function()
          local st = observe("cuda", layer_on("cuda", lq, c.C, c.H))
          local gr, gc = st.range:totable(), st.counts:totable()
          for op = 0, lib.QG_Q_NUM_ACT - 1 do
            local name = ffi.string(lib.qg_act_name(op))
            -- the real values before the fixed-range sigmoid / tanh outputs use each device's exp
            -- and tanh (within an ulp); every other row is exact
            local transc = op == lib.QG_Q_Z_OUT or op == lib.QG_Q_R_OUT or op == lib.QG_Q_G_OUT
            for k = 1, 4 do
              local a, b = gr[op + 1][k], rr[op + 1][k]
              if transc then assert(math.abs(a - b) <= 1e-14 * math.max(1, math.abs(b)), path .. " " .. name .. " range")
              else assert(a == b, string.format("%s %s range[%d]: %.17g vs %.17g (CPU)", path, name, k - 1, a, b)) end
            end
            local moved, total = 0, 0
            for b = 1, lib.QG_STATS_BINS do
              moved = moved + math.abs(gc[op + 1][b] - rc[op + 1][b])
              total = total + rc[op + 1][b]
            end
            if transc then assert(moved <= 2 + total * 1e-4, path .. " " .. name .. " counts")
            else assert(moved == 0, string.format("%s %s: %d counts differ from the CPU's", path, name, moved)) end
            assert.is_true(total > 0, name)
            for _, method in ipairs({ "histogram", "mse", "minmax" }) do
              local q = lq.act[op + 1]
              local function cal(dev, s)
                local ctx = clib.context(dev)
                local e, z, cost = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("double[1]")
                check(ctx, lib.qg_calibrate_row(ctx, e, z, cost, s.c, op, q.bitwidth, q.is_symmetric and 1 or 0, q.is_unsigned and 1 or 0,
                                                METHODS[method], 99.99))
                return e[0], z[0]
              end
              local ge, gz = cal("cuda", st)
              local re_, rz = cal("cpu", ref)
              assert(ge == re_ and gz == rz, string.format("%s %s %s: (e, z) = (%d, %d) on the GPU, (%d, %d) on the CPU", path, name,
                                                           method, ge, gz, re_, rz))
            end
          end
        end)
      end
    end)
  end
end)

gpu_describe("integer GRU on CUDA: the persistent kernel's 32-bit cell #gpu", function()

  -- every operator int8: within the 32-bit cell's bounds, so the persistent kernel runs
  -- qg_cell32_forward on its int32 accumulators (qg_int_gru_cell_path says so); odd H, N not a
  -- multiple of the 8-row tiles, several cluster shapes (H up to 130). cluster: where auto takes
  -- the small-H kernel (int_gru_small.cu), the cluster kernel is also forced (that many CTAs, 8
  -- rows, R in shared memory: storage 1)
  local C32 = {
    { seed = 41, T = 6, N = 17, C = 5, H = 7, h0 = true, lengths = true, reverse = true, cluster = 1 },
    { seed = 42, T = 5, N = 9, C = 40, H = 64, lengths = true, cluster = 2 },
    { seed = 43, T = 4, N = 3, C = 300, H = 130, h0 = true, reverse = true },
    { seed = 44, T = 7, N = 33, C = 3, H = 1, h0 = true, lengths = true, cluster = 1 },
    { seed = 45, T = 3, N = 17, C = 64, H = 129, h0 = true, lengths = true, reverse = true },
    -- the W x GEMM's int32 accumulators over several tiles: odd 3H (element-wise stores), even 3H
    { seed = 47, T = 18, N = 17, C = 200, H = 129, h0 = true, lengths = true, reverse = true },   -- seed 45's H and N
    { seed = 48, T = 2, N = 130, C = 130, H = 130, reverse = true },
  }
  local function compare(c, lq, w, exp_over, want_path)
    local inp = inputs(c, w)
    local ref = cpu_reference(c, lq, w, inp, exp_over)
    for _, path in ipairs({ "auto", "persistent" }) do
      with_path(path, function()
        local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
        local o = forward("cuda", hg, inp, true)
        for _, k in ipairs({ "xq", "xmask", "hq", "cell", "y", "hn" }) do same(o[k], ref[k], path .. " " .. k) end
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), path .. ": cell path after the training forward")
        local oi = forward("cuda", hg, inp, false)
        same(oi.y, ref.y, path .. " inference y")
        same(oi.hn, ref.hn, path .. " inference hn")
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), path .. ": cell path after the inference forward")
      end)
    end
    if c.cluster then
      local gctx = clib.context("cuda")
      check(gctx, lib.qg_ctx_set_persist_shape(gctx, c.cluster, 1, 0, 1))
      local ok, err = pcall(with_path, "persistent", function()
        local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
        local o = forward("cuda", hg, inp, true)
        for _, k in ipairs({ "hq", "cell", "y", "hn" }) do same(o[k], ref[k], "cluster kernel " .. k) end
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), "cluster kernel: cell path")
        same(forward("cuda", hg, inp, false).y, ref.y, "cluster kernel inference y")
      end)
      check(gctx, lib.qg_ctx_set_persist_shape(gctx, 0, 0, 0, 0))
      if not ok then error(err, 0) end
    end
    with_path("fallback", function()   -- the per-step kernels keep the general cell
      local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
      same(forward("cuda", hg, inp, false).y, ref.y, "fallback inference y")
      assert.are.equal(lib.QG_CELL_64, lib.qg_int_gru_cell_path(hg), "fallback: cell path")
    end)
  end

  for _, c in ipairs(C32) do
    it(string.format("int8, seed %d: T=%d N=%d C=%d H=%d%s%s%s: the 32-bit cell runs, every byte equals the CPU's", c.seed, c.T,
                     c.N, c.C, c.H, c.h0 and " h0" or "", c.lengths and " lengths" or "", c.reverse and " reverse" or ""), function()
      local lq, w = calibrated(c.seed, uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
      compare(c, lq, w, nil, lib.QG_CELL_32)
    end)
  end

  -- CTAs of more than 256 cells in the cluster kernel: the 32-bit cell reads its units' rows from
  -- shared memory (512 threads at most 128 registers; auto takes it there, e.g. at H 512 with 8-CTA
  -- clusters, since 16-CTA ones fit too few at once). Forced shapes of 288-320 cells; N 17 leaves
  -- the last cluster one valid row. The exchange between the CTAs is st.async counted on an
  -- mbarrier per h buffer: symmetric R (each thread pushes its own bytes), asymmetric R (the slice
  -- and the row sums of the zero-point term), 12-bit output.h (two planes).
  local WIDE_CTA = {
    { what = "symmetric int8", over = nil, shape = { 4, 1 } },
    { what = "asymmetric weight.R (row sums)", over = { ["weight.R"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } },
      shape = { 8, 2 } },
    { what = "12-bit output.h (two planes)", over = { ["output.h"] = { bitwidth = 12 } }, shape = { 4, 1 } },
  }
  for k, v in ipairs(WIDE_CTA) do
    it(string.format("%s, CTAs of %d CTAs x %d rows (the cell's rows in shared memory): every byte equals the CPU's", v.what, v.shape[1],
                     8 * v.shape[2]), function()
      local c = { seed = 60 + k, T = 7, N = 17, C = 9, H = 130, h0 = true, lengths = true, reverse = k == 2 }
      local lq, w = calibrated(c.seed, uniform_config(8, v.over, "int8"), c.T, c.N, c.C, c.H)
      local inp = inputs(c, w)
      local ref = cpu_reference(c, lq, w, inp, nil)
      local gctx = clib.context("cuda")
      check(gctx, lib.qg_ctx_set_persist_shape(gctx, v.shape[1], v.shape[2], 0, 1))
      local ok, err = pcall(with_path, "persistent", function()
        local hg = layer_on("cuda", lq, c.C, c.H)
        local o = forward("cuda", hg, inp, true)
        for _, key in ipairs({ "hq", "cell", "y", "hn" }) do same(o[key], ref[key], "wide CTAs " .. key) end
        assert.are.equal(lib.QG_CELL_32, lib.qg_int_gru_cell_path(hg), "wide CTAs: cell path")
        local oi = forward("cuda", hg, inp, false)
        same(oi.y, ref.y, "wide CTAs inference y")
        same(oi.hn, ref.hn, "wide CTAs inference hn")
      end)
      check(gctx, lib.qg_ctx_set_persist_shape(gctx, 0, 0, 0, 0))
      if not ok then error(err, 0) end
    end)
  end

  it("int8 with one unit's bias outside the 32-bit bounds: its CTA runs the general cell (device flag), same bytes", function()
    -- weight.bx channel 4 (gate z of unit 4) at 3e7 (bias_outside_32: qg_cell32_unit refuses
    -- that unit only); the 64-bit cell still holds
    local c = { seed = 46, T = 5, N = 17, C = 5, H = 130, h0 = true, lengths = true, reverse = true }
    local lq, w = calibrated(c.seed, uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
    local wb, over = bias_outside_32(w, 4)
    compare(c, lq, wb, over, lib.QG_CELL_64)
  end)

  -- The tensor-core step kernel (the per-step recurrence large H takes) in the 32-bit mode: auto
  -- with a forced persistent shape that cannot hold H (1 CTA x 8 rows: 300 units x 8 rows of
  -- cells) takes it, with W x on the tensor cores (a forced fallback keeps the fp64 W x and the
  -- general cell, asserted above); H = 300 and N of 66..70 leave partial unit and batch tiles.
  local TC32 = {
    { seed = 51, T = 5, N = 70, C = 9, H = 300, h0 = true, lengths = true, reverse = true },
    { seed = 52, T = 4, N = 70, C = 40, H = 300 },
    { seed = 53, T = 3, N = 66, C = 5, H = 300, h0 = true, lengths = true },
  }
  local function compare_step(c, lq, w, exp_over, want_path)
    local inp = inputs(c, w)
    local ref = cpu_reference(c, lq, w, inp, exp_over)
    local gpu_ctx = clib.context("cuda")
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 1, 1, 0, 0))
    local ok, err = pcall(function()
      with_path("persistent", function()   -- the forced shape cannot hold H: auto takes the per-step kernel
        assert.raises_match(function() forward("cuda", layer_on("cuda", lq, c.C, c.H, exp_over), inp, false) end,
                            "the persistent integer GRU kernel needs the int8 planes of R (H = 300, 8 and 8 bits)")
      end)
      with_path("auto", function()
        local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
        local o = forward("cuda", hg, inp, true)
        for _, k in ipairs({ "xq", "xmask", "hq", "cell", "y", "hn" }) do same(o[k], ref[k], "tensor-core step " .. k) end
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), "tensor-core step: cell path after the training forward")
        local oi = forward("cuda", hg, inp, false)
        same(oi.y, ref.y, "tensor-core step inference y")
        same(oi.hn, ref.hn, "tensor-core step inference hn")
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), "tensor-core step: cell path after the inference forward")
      end)
    end)
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
    if not ok then error(err, 0) end
  end

  for _, c in ipairs(TC32) do
    it(string.format("int8, seed %d: T=%d N=%d C=%d H=%d%s%s%s: the tensor-core step runs the 32-bit cell, every byte equals the CPU's",
                     c.seed, c.T, c.N, c.C, c.H, c.h0 and " h0" or "", c.lengths and " lengths" or "", c.reverse and " reverse" or ""),
       function()
      local lq, w = calibrated(c.seed, uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
      compare_step(c, lq, w, nil, lib.QG_CELL_32)
    end)
  end

  it("int8, the tensor-core step with one unit's bias outside the 32-bit bounds: the general cell for it (device flag), same bytes",
     function()
    -- as above: weight.bx channel 4 at 3e7 (unit 4, in the first unit tile)
    local c = { seed = 54, T = 5, N = 70, C = 5, H = 300, h0 = true, lengths = true, reverse = true }
    local lq, w = calibrated(c.seed, uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
    local wb, over = bias_outside_32(w, 4)
    compare_step(c, lq, wb, over, lib.QG_CELL_64)
  end)
end)

gpu_describe("integer GRU on CUDA: the small-H kernel (all of R in one CTA) #gpu", function()

  -- qref: the CPU against the independent reference too (cases without lengths).
  -- Forced by a persist shape of storage 2 (qg_ctx_set_persist_shape(ctx, 1, rows, splits, 2)):
  -- under the persistent path a forced shape the kernel cannot run is an error, so a case that
  -- passes ran it. rows: batch rows per CTA; splits: lanes per unit (0: chosen). cfg: nil int8
  -- everywhere (symmetric signed R and h: no zero-point term), else the named quantizers.
  local function u8rh()   -- asymmetric unsigned R and h: zero-point terms (row sums of h)
    return uniform_config(8, { ["weight.R"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true },
                               ["output.h"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } }, "u8rh")
  end
  local function r4h6()   -- 4-bit unsigned asymmetric R, 6-bit signed asymmetric h
    return uniform_config(8, { ["weight.R"] = { bitwidth = 4, is_symmetric = false, is_unsigned = true },
                               ["output.h"] = { bitwidth = 6, is_symmetric = false } }, "r4h6")
  end
  local SMALL = {
    { seed = 61, T = 6, N = 3, C = 5, H = 7, h0 = true, lengths = true, reverse = true, rows = 1 },
    { seed = 60, T = 6, N = 3, C = 5, H = 7, h0 = true, reverse = true, rows = 1, qref = true },
    { seed = 62, T = 5, N = 17, C = 9, H = 64, lengths = true, rows = 1 },
    { seed = 63, T = 4, N = 17, C = 3, H = 64, h0 = true, reverse = true, rows = 2, splits = 4, cfg = u8rh, cname = "u8rh" },
    { seed = 64, T = 5, N = 3, C = 7, H = 100, h0 = true, lengths = true, rows = 1, cfg = u8rh, cname = "u8rh" },
    { seed = 65, T = 4, N = 17, C = 33, H = 128, h0 = true, lengths = true, reverse = true, rows = 2 },
    { seed = 66, T = 7, N = 1, C = 1, H = 1, h0 = true, rows = 1, qref = true },
    { seed = 67, T = 6, N = 17, C = 5, H = 7, lengths = true, rows = 8, cfg = r4h6, cname = "r4h6" },
    { seed = 68, T = 5, N = 3, C = 3, H = 1, lengths = true, reverse = true, rows = 4, cfg = u8rh, cname = "u8rh" },
    { seed = 69, T = 4, N = 17, C = 5, H = 128, rows = 1, splits = 2, cfg = r4h6, cname = "r4h6" },
    { seed = 70, T = 5, N = 17, C = 11, H = 64, h0 = true, lengths = true, rows = 4, splits = 4 },
    -- ws: the cell over two roles of warps (storage 5: one row per CTA, one lane per unit, H <= 64);
    -- odd H (the last warp of each role partly idle), T below the W x ring's depth, every KW
    { seed = 80, T = 6, N = 3, C = 5, H = 7, h0 = true, lengths = true, reverse = true, rows = 1, ws = true },
    { seed = 81, T = 6, N = 3, C = 5, H = 7, h0 = true, reverse = true, rows = 1, ws = true, qref = true },
    { seed = 82, T = 5, N = 17, C = 9, H = 64, lengths = true, rows = 1, ws = true },
    { seed = 83, T = 4, N = 17, C = 3, H = 64, h0 = true, reverse = true, rows = 1, ws = true, cfg = u8rh, cname = "u8rh" },
    { seed = 84, T = 7, N = 1, C = 1, H = 1, h0 = true, rows = 1, ws = true, qref = true },
    { seed = 85, T = 6, N = 17, C = 5, H = 45, lengths = true, rows = 1, ws = true, cfg = r4h6, cname = "r4h6" },
    { seed = 86, T = 5, N = 3, C = 3, H = 33, lengths = true, reverse = true, rows = 1, splits = 1, ws = true, cfg = u8rh, cname = "u8rh" },
    { seed = 87, T = 1, N = 3, C = 5, H = 16, h0 = true, rows = 1, ws = true, qref = true },
    { seed = 88, T = 2, N = 17, C = 4, H = 8, lengths = true, reverse = true, rows = 1, ws = true, cfg = u8rh, cname = "u8rh" },
    { seed = 89, T = 9, N = 3, C = 40, H = 64, h0 = true, reverse = true, rows = 1, ws = true, qref = true },
    -- more CTAs than one wave holds (at most two per multiprocessor: 300 of 2 rows, 1100 of 1 row),
    -- where auto also takes the small kernel in waves (isk_choose's second pass)
    { seed = 90, T = 4, N = 600, C = 5, H = 100, h0 = true, lengths = true, rows = 2 },
    { seed = 91, T = 3, N = 1100, C = 4, H = 64, lengths = true, reverse = true, rows = 1, cfg = u8rh, cname = "u8rh" },
  }
  local gpu_ctx = clib.context("cuda")
  local function forced(c, fn)
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 1, c.rows, c.splits or 0, c.ws and 5 or 2))
    local ok, err = pcall(fn)
    check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
    if not ok then error(err, 0) end
  end
  local function compare(c, lq, w, exp_over, want_path)
    local inp = inputs(c, w)
    local ref = cpu_reference(c, lq, w, inp, exp_over)
    forced(c, function()
      with_path("persistent", function()
        local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
        local o = forward("cuda", hg, inp, true)
        for _, k in ipairs({ "xq", "xmask", "hq", "cell", "y", "hn" }) do same(o[k], ref[k], "small kernel " .. k) end
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), "small kernel: cell path after the training forward")
        local oi = forward("cuda", hg, inp, false)
        same(oi.y, ref.y, "small kernel inference y")
        same(oi.hn, ref.hn, "small kernel inference hn")
        assert.are.equal(want_path, lib.qg_int_gru_cell_path(hg), "small kernel: cell path after the inference forward")
      end)
    end)
    with_path("auto", function()   -- auto (the small kernel where it holds the layer, else the cluster kernel)
      local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
      local o = forward("cuda", hg, inp, true)
      for _, k in ipairs({ "hq", "cell", "y", "hn" }) do same(o[k], ref[k], "auto " .. k) end
      same(forward("cuda", hg, inp, false).y, ref.y, "auto inference y")
    end)
  end

  for _, c in ipairs(SMALL) do
    it(string.format("seed %d: T=%d N=%d C=%d H=%d%s%s%s, %d rows per CTA%s%s%s: every byte equals the CPU's", c.seed, c.T, c.N, c.C, c.H,
                     c.h0 and " h0" or "", c.lengths and " lengths" or "", c.reverse and " reverse" or "", c.rows,
                     c.splits and string.format(", %d lanes per unit", c.splits) or "", c.ws and ", the cell over two roles of warps" or "",
                     " (" .. (c.cname or "int8") .. ")"),
       function()
      local lq, w = calibrated(c.seed, c.cfg and c.cfg() or uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
      compare(c, lq, w, nil, lib.QG_CELL_32)
    end)
  end

  it("a unit's bias outside the 32-bit bounds: its CTA runs the general loop (device flag, cell path 64), same bytes", function()
    -- weight.bx channel 4 at 3e7, as in the persistent kernel's test above
    for _, c in ipairs({ { seed = 71, T = 5, N = 17, C = 5, H = 64, h0 = true, lengths = true, reverse = true, rows = 2 },
                         { seed = 72, T = 4, N = 3, C = 7, H = 7, lengths = true, rows = 1, cfg = u8rh },
                         { seed = 79, T = 5, N = 3, C = 7, H = 45, h0 = true, lengths = true, reverse = true, rows = 1, ws = true } }) do
      local lq, w = calibrated(c.seed, c.cfg and c.cfg() or uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
      local wb, over = bias_outside_32(w, 4)
      compare(c, lq, wb, over, lib.QG_CELL_64)
    end
  end)

  it("a forced small-H shape it cannot run (12-bit h: two planes; H = 300; 16 lanes for 2 rows of H = 64; two roles at H = 100 "
     .. "or 2 rows) is a clear error "
     .. "under the persistent path; auto takes the per-step recurrence and matches the CPU", function()
    local cases = {
      { c = { seed = 73, T = 4, N = 3, C = 5, H = 7, h0 = true, rows = 1 },
        cfg = uniform_config(8, { ["output.h"] = { bitwidth = 12, is_symmetric = false } }, "h12") },
      { c = { seed = 74, T = 3, N = 3, C = 5, H = 300, rows = 1 } },
      { c = { seed = 75, T = 3, N = 3, C = 5, H = 64, rows = 2, splits = 16 } },
      { c = { seed = 76, T = 3, N = 3, C = 5, H = 100, rows = 1, ws = true } },   -- two roles: H <= 64 only
      { c = { seed = 77, T = 3, N = 3, C = 5, H = 16, rows = 2, ws = true } },    -- two roles: one row per CTA only
    }
    for _, k in ipairs(cases) do
      local c = k.c
      local lq, w = calibrated(c.seed, k.cfg or uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
      local inp = inputs(c, w)
      local ref = forward("cpu", layer_on("cpu", lq, c.C, c.H), inp, true)
      forced(c, function()
        with_path("persistent", function()
          local ok, err = pcall(forward, "cuda", layer_on("cuda", lq, c.C, c.H), inp, true)
          assert(not ok, "a forced small-H shape that cannot run: no error")
          local want = string.format("the persistent integer GRU kernel needs a forced small-H shape (cluster 1, %d rows, %d splits) "
                                     .. "that holds the layer (H = %d, the 32-bit mode, R and h of at most 8 bits)", c.rows, c.splits or 0, c.H)
          assert(tostring(err):find(want, 1, true), "expected an error containing '" .. want .. "', got: " .. tostring(err))
        end)
        with_path("auto", function()
          local o = forward("cuda", layer_on("cuda", lq, c.C, c.H), inp, true)
          for _, key in ipairs({ "hq", "cell", "y", "hn" }) do same(o[key], ref[key], "auto " .. key) end
        end)
      end)
    end
  end)
end)

gpu_describe("integer GRU on CUDA: the GPU-wide persistent recurrence (tc_grid_kernel) #gpu", function()

  -- H = 1030: the int8 planes of R do not fit a 16-CTA cluster (68 units per CTA: 208 rows x
  -- 1104 bytes of R alone, above 227 KB), so auto and a forced persistent path take the GPU-wide
  -- kernel in the 32-bit mode (33 unit tiles, the last partial, x 1 or 2 batch groups of 64 rows,
  -- the second partial; every block resident); a forced persistent path would fail without it.
  -- Auto with a forced persistent shape (1 CTA x 8 rows) takes the per-step tc_step_kernel at the
  -- same shape: all three runs give the CPU's bytes.
  local GRID = {
    { seed = 61, T = 3, N = 66, C = 9, H = 1030, h0 = true, lengths = true, reverse = true, want = lib.QG_CELL_32 },
    -- H = 1024, the bench's large shape: K = H with no padding (Kp = 1024; the H = 1030 cases pad
    -- K to 1088), two batch groups, the second partial. Auto takes tc_grid_kernel here as well
    -- (ncu, bench/gpu_runs/s32_ld_h200_ncu1024.csv)
    { seed = 68, T = 3, N = 70, C = 9, H = 1024, h0 = true, lengths = true, want = lib.QG_CELL_32,
      name = "H = 1024: K unpadded" },
    { seed = 62, T = 4, N = 3, C = 5, H = 1030, h0 = true, want = lib.QG_CELL_32,
      name = "8-bit unsigned asymmetric R and h (the zero-point term of the h row sums)",
      cfg = function()
        return uniform_config(8, { ["weight.R"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true },
                                   ["output.h"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } }, "u8h")
      end },
    -- a bias code at 2^-31 (a per-channel bias near zero), 26 exponents below z_pre's W x: the
    -- exact alignment would shift W x past 2^29, the sticky form of qg_cell32_sum holds it
    { seed = 63, T = 3, N = 17, C = 5, H = 1030, lengths = true, want = lib.QG_CELL_32,
      exp_over = { slot = lib.QG_W_BX, exps = { [4] = 31 } }, name = "unit 4's bias at 2^-31: the 32-bit cell's sticky alignment" },
    -- bias_outside_32: no 32-bit form holds unit 4's z_pre sum, the general cell runs for it only
    { seed = 67, T = 3, N = 17, C = 5, H = 1030, lengths = true, want = lib.QG_CELL_64, outside32 = 4,
      name = "unit 4's bias 3e7: the general cell for it" },
    -- W x: with int8 W and x the grid kernel's inference and training forwards take cuBLASLt's
    -- plane products and add the zero-point terms bconst[j] + offW[j] SX[tn] themselves
    -- (kernels/int_gru_wx_lt.cuh; SX staged in shared memory by cp.async a step ahead); the
    -- forced shape's tc_step_kernel keeps wx_gemm_kernel (the terms in its epilogue). Asymmetric
    -- unsigned W and x make both terms non-zero; T N and C odd (partial tiles, Kp padding), 3H = 3090 not a multiple of 8
    -- (qwx rows padded to 3096); C % 4 == 0 takes the four-column x quantization.
    { seed = 64, T = 3, N = 33, C = 37, H = 1030, h0 = true, lengths = true, want = lib.QG_CELL_32,
      name = "unsigned asymmetric W and x: both zero-point terms of W x, odd T N and C",
      cfg = function()
        return uniform_config(8, { ["weight.W"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true },
                                   ["input.x"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } }, "u8wx")
      end },
    { seed = 65, T = 2, N = 65, C = 64, H = 1030, h0 = true, lengths = true, reverse = true, want = lib.QG_CELL_32,
      name = "signed asymmetric W and x, C % 4 == 0: the four-column x quantization",
      cfg = function()
        return uniform_config(8, { ["weight.W"] = { bitwidth = 8, is_symmetric = false },
                                   ["input.x"] = { bitwidth = 8, is_symmetric = false } }, "a8wx")
      end },
    -- 12-bit x (two planes): W x stays on wx_gemm_kernel (the zero-point terms in its epilogue)
    -- under the grid kernel as well
    { seed = 66, T = 3, N = 5, C = 8, H = 1030, h0 = true, want = lib.QG_CELL_32,
      name = "12-bit asymmetric x: two planes, wx_gemm_kernel under the grid kernel",
      cfg = function()
        return uniform_config(8, { ["input.x"] = { bitwidth = 12, is_symmetric = false },
                                   ["weight.W"] = { bitwidth = 8, is_symmetric = false, is_unsigned = true } }, "x12")
      end },
  }
  for _, c in ipairs(GRID) do
    it(string.format("int8, seed %d: T=%d N=%d C=%d H=%d%s%s%s%s: auto, persistent and the per-step kernel give the CPU's bytes", c.seed,
                     c.T, c.N, c.C, c.H, c.h0 and " h0" or "", c.lengths and " lengths" or "", c.reverse and " reverse" or "",
                     c.name and (" (" .. c.name .. ")") or ""), function()
      local lq, w = calibrated(c.seed, c.cfg and c.cfg() or uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
      local exp_over = c.exp_over
      if c.outside32 then w, exp_over = bias_outside_32(w, c.outside32) end
      local inp = inputs(c, w)
      local ref = cpu_reference(c, lq, w, inp, exp_over)
      local gpu_ctx = clib.context("cuda")
      for _, run in ipairs({ { path = "auto" }, { path = "persistent" }, { path = "auto", shape = true } }) do
        local what = run.path .. (run.shape and " (forced shape: tc_step_kernel)" or " (tc_grid_kernel)")
        if run.shape then check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 1, 1, 0, 0)) end
        local ok, err = pcall(function()
          with_path(run.path, function()
            local hg = layer_on("cuda", lq, c.C, c.H, exp_over)
            local o = forward("cuda", hg, inp, true)
            for _, k in ipairs({ "xq", "xmask", "hq", "cell", "y", "hn" }) do same(o[k], ref[k], what .. " " .. k) end
            assert.are.equal(c.want, lib.qg_int_gru_cell_path(hg), what .. ": cell path after the training forward")
            local oi = forward("cuda", hg, inp, false)
            same(oi.y, ref.y, what .. " inference y")
            same(oi.hn, ref.hn, what .. " inference hn")
            assert.are.equal(c.want, lib.qg_int_gru_cell_path(hg), what .. ": cell path after the inference forward")
          end)
        end)
        check(gpu_ctx, lib.qg_ctx_set_persist_shape(gpu_ctx, 0, 0, 0, 0))
        if not ok then error(err, 0) end
      end
    end)
  end

  -- The grid kernel's W x on cuBLASLt runs as a captured CUDA graph from the second call with the
  -- same workspace on (int_gru_wx_lt.cuh lt_wx_run, kernels/gru.cu's graph cache): the graph reads its
  -- operands (W's and x's planes in the workspace) at every launch. Four inference forwards of one
  -- layer with new x every call and a new W from the third (run alone: direct, captured, replayed,
  -- replayed) must each give the CPU's bytes.
  it("W x on cuBLASLt as a captured graph: four inference forwards with new x and W give the CPU's bytes", function()
    local c = { seed = 69, T = 3, N = 33, C = 16, H = 1030 }
    local lq, w = calibrated(c.seed, uniform_config(8, nil, "int8"), c.T, c.N, c.C, c.H)
    local hg, hc = layer_on("cuda", lq, c.C, c.H), layer_on("cpu", lq, c.C, c.H)
    for r = 1, 4 do
      local inp = inputs({ seed = c.seed + r, T = c.T, N = c.N, C = c.C, H = c.H }, w)
      if r >= 3 then inp.W = w.W:clone():mul(r == 3 and 0.5 or -0.75) end
      local ref = forward("cpu", hc, inp, false)
      local o = forward("cuda", hg, inp, false)
      same(o.y, ref.y, "call " .. r .. " y")
      same(o.hn, ref.hn, "call " .. r .. " hn")
      assert.are.equal(lib.QG_CELL_32, lib.qg_int_gru_cell_path(hg), "call " .. r .. ": the grid kernel's 32-bit cell")
    end
  end)
end)
