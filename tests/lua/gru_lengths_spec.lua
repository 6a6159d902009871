-- gru_lengths_spec.lua: the float GRU's C API (qg_gru_forward / qg_gru_backward, one layer and
-- one direction) with per-row lengths and with the statistics observer.
--   * forward with lengths == each row run alone at its own length (T' = L_n), both directions,
--     and == the float64 reference of tests/lua/testutil.lua on the truncated row;
--   * gradients with lengths == central finite differences of the float64 reference, both
--     directions, lengths 1..T, with gradOutput non-zero at padded steps (it must be ignored);
--   * a length of 0 or > T (or a wrong dtype) is an error naming the row;
--   * the observer's min/max equal the float64 reference's operator values on valid steps only,
--     and each row's counts sum to the number of values observed there.
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local U = require("testutil")

local lib, ffi = clib.lib, clib.ffi

local function ctx() return clib.context("cpu") end
local function check(st) clib.check(ctx(), st, 2) end

-- Random single-layer parameters as nested tables (1-based, gate blocks z, r, g).
local function params(C, H, scale)
  local function t(shape) return Tensor.new(shape, "f32"):uniform(-scale, scale) end
  return { W = t({ 3 * H, C }), R = t({ 3 * H, H }), bx = t({ 3 * H }), br = t({ 3 * H }) }
end

local function to_tables(p)
  return { W = p.W:totable(), R = p.R:totable(), bx = p.bx:totable(), br = p.br:totable() }
end

local function from_tables(pt)
  return { W = Tensor.from(pt.W, "f32"), R = Tensor.from(pt.R, "f32"), bx = Tensor.from(pt.bx, "f32"),
           br = Tensor.from(pt.br, "f32") }
end

-- Runs qg_gru_forward; returns y, hs, gates tensors.
local function forward(p, x, h0, lengths, reverse, train, stats)
  local T, N, H = x:size(1), x:size(2), p.R:size(2)
  local y, hs = Tensor.new({ T, N, H }, "f32"):fill(7), Tensor.new({ T + 1, N, H }, "f32")
  local gates = train and Tensor.new({ T, N, 4 * H }, "f32") or nil
  check(lib.qg_gru_forward(ctx(), y.t, 0, hs.t, gates and gates.t or nil, stats, x.t, p.W.t, p.R.t, p.bx.t, p.br.t,
                           h0 and h0.t or nil, lengths and lengths.t or nil, reverse))
  return y, hs, gates
end

-- The row n (1-based) of x [T, N, C] truncated to its first L time indices, as a [L, 1, C] tensor.
local function row_alone(x, n, L)
  local xt, out = x:totable(), {}
  for t = 1, L do out[t] = { xt[t][n] } end
  return Tensor.from(out, "f32")
end

-- float64 reference of one row alone: y [L][H] and the final state [H] (U.gru runs both
-- directions when D = 2; the reverse one is the second half).
local function ref_row(pt, xt, h0t, n, L, reverse, H)
  local xs = {}
  for t = 1, L do xs[t] = { xt[t][n] } end
  local P = { [0] = { [0] = pt, [1] = pt } }
  local D = reverse == 1 and 2 or 1
  local h0 = nil
  if h0t then h0 = {} for d = 1, D do h0[d] = { h0t[n] } end end
  local y, hn = U.gru(P, xs, h0, 1, D, H)
  local ys = {}
  for t = 1, L do
    ys[t] = {}
    for i = 1, H do ys[t][i] = y[t][1][(D - 1) * H + i] end
  end
  return ys, hn[D][1]
end

describe("float GRU with per-row lengths", function()
  local T, N, C, H = 5, 5, 3, 4
  local lens = { 5, 1, 3, 2, 4 }   -- every length 1..T

  for _, reverse in ipairs({ 0, 1 }) do
    for _, with_h0 in ipairs({ false, true }) do
      it(string.format("forward == each row alone at its length (%s, h0 %s)", reverse == 1 and "reverse" or "forward",
                       tostring(with_h0)), function()
        qgru.seed(101 + reverse)
        local p = params(C, H, 0.8)
        local x = Tensor.new({ T, N, C }, "f32"):uniform(-1, 1)
        local h0 = with_h0 and Tensor.new({ N, H }, "f32"):uniform(-0.9, 0.9) or nil
        local lengths = Tensor.from(lens, "i64")
        local y, hs = forward(p, x, h0, lengths, reverse, true)
        local yb, hsb = y:totable(), hs:totable()
        local pt, xt, h0t = to_tables(p), x:totable(), h0 and h0:totable() or nil
        for n = 1, N do
          local L = lens[n]
          local h0n = h0 and Tensor.from({ h0t[n] }, "f32") or nil
          local y1, hs1 = forward(p, row_alone(x, n, L), h0n, nil, reverse, false)
          local y1t, hs1t = y1:totable(), hs1:totable()
          local yr, hnr = ref_row(pt, xt, h0t, n, L, reverse, H)
          for t = 1, T do
            for i = 1, H do
              if t <= L then
                assert.is_true(math.abs(yb[t][n][i] - y1t[t][1][i]) <= 1e-6, "y vs alone")
                assert.is_true(math.abs(yb[t][n][i] - yr[t][i]) <= 1e-5, "y vs float64 reference")
              else
                assert.are.equal(0, yb[t][n][i])   -- padded time index: zero output
              end
            end
          end
          for i = 1, H do   -- hs[T] is the final state h_n of the row
            assert.is_true(math.abs(hsb[T + 1][n][i] - hs1t[L + 1][1][i]) <= 1e-6, "h_n vs alone")
            assert.is_true(math.abs(hsb[T + 1][n][i] - hnr[i]) <= 1e-5, "h_n vs float64 reference")
          end
        end
        -- inference (no gates) gives the same output
        local yi = forward(p, x, h0, lengths, reverse, false)
        assert.is_true(U.max_abs_diff(U.flatten(yi:totable()), U.flatten(yb)) == 0)
      end)
    end

    it(string.format("gradients with lengths 1..T vs float64 finite differences (%s)",
                     reverse == 1 and "reverse" or "forward"), function()
      local T2, N2, C2, H2 = 4, 4, 2, 3
      local lens2 = { 4, 1, 3, 2 }
      qgru.seed(201 + reverse)
      local p = params(C2, H2, 0.8)
      local x = Tensor.new({ T2, N2, C2 }, "f32"):uniform(-1, 1)
      local h0 = Tensor.new({ N2, H2 }, "f32"):uniform(-0.9, 0.9)
      local G = Tensor.new({ T2, N2, H2 }, "f32"):uniform(-1, 1)      -- non-zero at padded steps too
      local Ghn = Tensor.new({ N2, H2 }, "f32"):uniform(-1, 1)
      local lengths = Tensor.from(lens2, "i64")
      local _, hs, gates = forward(p, x, h0, lengths, reverse, true)
      local g = { W = Tensor.new({ 3 * H2, C2 }, "f32"), R = Tensor.new({ 3 * H2, H2 }, "f32"),
                  bx = Tensor.new({ 3 * H2 }, "f32"), br = Tensor.new({ 3 * H2 }, "f32") }
      local dx, dh0 = Tensor.new({ T2, N2, C2 }, "f32"), Tensor.new({ N2, H2 }, "f32")
      check(lib.qg_gru_backward(ctx(), dx.t, g.W.t, g.R.t, g.bx.t, g.br.t, dh0.t, G.t, 0, Ghn.t, x.t, p.W.t, p.R.t,
                                hs.t, gates.t, lengths.t, reverse))

      local pt, xt, h0t, Gt, Ghnt = to_tables(p), x:totable(), h0:totable(), G:totable(), Ghn:totable()
      local function loss()
        local s = 0
        for n = 1, N2 do
          local L = lens2[n]
          local yr, hnr = ref_row(pt, xt, h0t, n, L, reverse, H2)
          for t = 1, L do for i = 1, H2 do s = s + yr[t][i] * Gt[t][n][i] end end
          for i = 1, H2 do s = s + hnr[i] * Ghnt[n][i] end
        end
        return s
      end
      for _, name in ipairs({ "W", "R", "bx", "br" }) do
        local err = U.rel_err(U.flatten(g[name]:totable()), U.numgrad(loss, pt[name]))
        assert(err < 1e-4, string.format("%s: relative error %.3g", name, err))
      end
      local dxt = dx:totable()
      local err = U.rel_err(U.flatten(dxt), U.numgrad(loss, xt))
      assert(err < 1e-4, string.format("dx: relative error %.3g", err))
      for n = 1, N2 do      -- padded time indices get exactly zero gradient
        for t = lens2[n] + 1, T2 do for c = 1, C2 do assert.are.equal(0, dxt[t][n][c]) end end
      end
      err = U.rel_err(U.flatten(dh0:totable()), U.numgrad(loss, h0t))
      assert(err < 1e-4, string.format("dh0: relative error %.3g", err))
      -- a bidirectional layer writes its columns at an offset: same gradients through dy's offset
      local G2 = Tensor.new({ T2, N2, 2 * H2 }, "f32")
      local G2t = G2:totable()
      for t = 1, T2 do for n = 1, N2 do for i = 1, H2 do G2t[t][n][H2 + i] = Gt[t][n][i] end end end
      G2 = Tensor.from(G2t, "f32")
      local gW = Tensor.new({ 3 * H2, C2 }, "f32")
      local tmp = { R = Tensor.new({ 3 * H2, H2 }, "f32"), bx = Tensor.new({ 3 * H2 }, "f32"), br = Tensor.new({ 3 * H2 }, "f32") }
      check(lib.qg_gru_backward(ctx(), nil, gW.t, tmp.R.t, tmp.bx.t, tmp.br.t, nil, G2.t, H2, Ghn.t, x.t, p.W.t, p.R.t,
                                hs.t, gates.t, lengths.t, reverse))
      assert.is_true(U.max_abs_diff(U.flatten(gW:totable()), U.flatten(g.W:totable())) <= 1e-6)
      -- no dy at all: only the final states carry a gradient
      local gR, gW2 = Tensor.new({ 3 * H2, H2 }, "f32"), Tensor.new({ 3 * H2, C2 }, "f32")
      check(lib.qg_gru_backward(ctx(), nil, gW2.t, gR.t, tmp.bx.t, tmp.br.t,
                                nil, nil, 0, Ghn.t, x.t, p.W.t, p.R.t, hs.t, gates.t, lengths.t, reverse))
      local function loss_hn()
        local s = 0
        for n = 1, N2 do
          local _, hnr = ref_row(pt, xt, h0t, n, lens2[n], reverse, H2)
          for i = 1, H2 do s = s + hnr[i] * Ghnt[n][i] end
        end
        return s
      end
      err = U.rel_err(U.flatten(gR:totable()), U.numgrad(loss_hn, pt.R))
      assert(err < 1e-4, string.format("R (no dy): relative error %.3g", err))
    end)
  end

  -- Sizes that reach every path of the packed GEMM kernel: 3H = 120 columns (full 64-column
  -- groups and a partial one), 9 rows (groups of 4 and remainders); then H = 52 (dq R and dR with
  -- a partial 16-column panel inside a full group) and T*N = 300 (dR in two blocks of sums).
  local shapes = {
    { T = 3, N = 9, C = 20, H = 40, lens = { 3, 1, 2, 3, 3, 2, 1, 3, 2 } },
    { T = 6, N = 50, C = 5, H = 52, lens = {} },
  }
  for n = 1, 50 do shapes[2].lens[n] = (n * 7) % 6 + 1 end
  for _, shape in ipairs(shapes) do
  it(string.format("larger sizes (T=%d N=%d C=%d H=%d): forward vs float64, gradients along random directions",
                   shape.T, shape.N, shape.C, shape.H), function()
    local T4, N4, C4, H4, lens4 = shape.T, shape.N, shape.C, shape.H, shape.lens
    for _, reverse in ipairs({ 0, 1 }) do
      qgru.seed(501 + reverse)
      local p = params(C4, H4, 0.3)
      local x = Tensor.new({ T4, N4, C4 }, "f32"):uniform(-1, 1)
      local h0 = Tensor.new({ N4, H4 }, "f32"):uniform(-0.9, 0.9)
      local G = Tensor.new({ T4, N4, H4 }, "f32"):uniform(-1, 1)
      local lengths = Tensor.from(lens4, "i64")
      local y, hs, gates = forward(p, x, h0, lengths, reverse, true)
      local g = { W = Tensor.new({ 3 * H4, C4 }, "f32"), R = Tensor.new({ 3 * H4, H4 }, "f32"),
                  bx = Tensor.new({ 3 * H4 }, "f32"), br = Tensor.new({ 3 * H4 }, "f32") }
      local dx, dh0 = Tensor.new({ T4, N4, C4 }, "f32"), Tensor.new({ N4, H4 }, "f32")
      check(lib.qg_gru_backward(ctx(), dx.t, g.W.t, g.R.t, g.bx.t, g.br.t, dh0.t, G.t, 0, nil, x.t, p.W.t, p.R.t,
                                hs.t, gates.t, lengths.t, reverse))
      local pt, xt, h0t, Gt, yt = to_tables(p), x:totable(), h0:totable(), G:totable(), y:totable()
      local function loss(check_y)
        local s = 0
        for n = 1, N4 do
          local yr = ref_row(pt, xt, h0t, n, lens4[n], reverse, H4)
          for t = 1, lens4[n] do
            for i = 1, H4 do
              s = s + yr[t][i] * Gt[t][n][i]
              if check_y then assert(math.abs(yr[t][i] - yt[t][n][i]) <= 1e-5, "y vs float64 reference") end
            end
          end
        end
        return s
      end
      loss(true)
      local tables = { W = pt.W, R = pt.R, bx = pt.bx, br = pt.br, x = xt, h0 = h0t }
      local grads = { W = g.W, R = g.R, bx = g.bx, br = g.br, x = dx, h0 = dh0 }
      for _, name in ipairs({ "W", "R", "bx", "br", "x", "h0" }) do
        local vals = U.flatten(tables[name])
        local dir = {}
        for k = 1, #vals do dir[k] = math.sin(k * 12.9898 + #name) end   -- a fixed "random" direction
        local eps = 1e-5
        local function at(e)
          local v = {}
          for k = 1, #vals do v[k] = vals[k] + e * dir[k] end
          U.unflatten_into(tables[name], v)
          return loss(false)
        end
        local num = (at(eps) - at(-eps)) / (2 * eps)
        at(0)
        local ana = U.dot(U.flatten(grads[name]:totable()), dir)
        assert(math.abs(ana - num) <= 1e-4 * math.max(1, math.abs(num)),
               string.format("%s: directional derivative %.8g, finite differences %.8g", name, ana, num))
      end
    end
  end)
  end

  it("gives the same results on 1, 2 and 3 threads (rows are split over threads)", function()
    local T3, N3, C3, H3 = 6, 7, 3, 5
    qgru.seed(401)
    local p = params(C3, H3, 0.8)
    local x = Tensor.new({ T3, N3, C3 }, "f32"):uniform(-1, 1)
    local G = Tensor.new({ T3, N3, H3 }, "f32"):uniform(-1, 1)
    local lengths = Tensor.from({ 6, 1, 3, 2, 5, 4, 6 }, "i64")
    local results = {}
    for _, threads in ipairs({ 1, 2, 3 }) do
      qgru.setNumThreads(threads)
      for _, reverse in ipairs({ 0, 1 }) do
        local y, hs, gates = forward(p, x, nil, lengths, reverse, true)
        local g = { Tensor.new({ T3, N3, C3 }, "f32"), Tensor.new({ 3 * H3, C3 }, "f32"), Tensor.new({ 3 * H3, H3 }, "f32"),
                    Tensor.new({ 3 * H3 }, "f32"), Tensor.new({ 3 * H3 }, "f32"), Tensor.new({ N3, H3 }, "f32") }
        check(lib.qg_gru_backward(ctx(), g[1].t, g[2].t, g[3].t, g[4].t, g[5].t, g[6].t, G.t, 0, nil, x.t, p.W.t, p.R.t,
                                  hs.t, gates.t, lengths.t, reverse))
        local all = U.flatten(y:totable())
        for _, t in ipairs(g) do U.flatten(t:totable(), all) end
        results[#results + 1] = all
      end
    end
    qgru.setNumThreads(2)
    for k = 3, #results do
      local err = U.rel_err(results[k], results[(k - 1) % 2 + 1])
      assert(err <= 1e-6, string.format("run %d differs from one thread: %.3g", k, err))
    end
  end)

  it("a length of 0 or > T, or lengths of the wrong dtype or shape, is a clear error", function()
    local p = params(C, H, 0.5)
    local x = Tensor.new({ T, N, C }, "f32"):uniform(-1, 1)
    local y, hs = Tensor.new({ T, N, H }, "f32"), Tensor.new({ T + 1, N, H }, "f32")
    local function fwd(lengths)
      return lib.qg_gru_forward(ctx(), y.t, 0, hs.t, nil, nil, x.t, p.W.t, p.R.t, p.bx.t, p.br.t, nil, lengths.t, 0)
    end
    local function msg() return ffi.string(lib.qg_last_error(ctx())) end
    assert.are.equal(lib.QG_ERR_ARG, fwd(Tensor.from({ 5, 1, 0, 2, 4 }, "i64")))
    assert.is_truthy(msg():find("lengths[2] = 0", 1, true))
    assert.is_truthy(msg():find("1..5", 1, true))
    assert.are.equal(lib.QG_ERR_ARG, fwd(Tensor.from({ 6, 1, 1, 2, 4 }, "i64")))
    assert.is_truthy(msg():find("lengths[0] = 6", 1, true))
    assert.are.equal(lib.QG_ERR_ARG, fwd(Tensor.from({ 5, 1, 1, 2, -3 }, "i64")))
    assert.is_truthy(msg():find("lengths[4] = -3", 1, true))
    assert.are.equal(lib.QG_ERR_ARG, fwd(Tensor.from({ 5, 1, 1, 2, 4 }, "f32")))
    assert.is_truthy(msg():find("lengths", 1, true))
    assert.are.equal(lib.QG_ERR_ARG, fwd(Tensor.from({ 5, 1, 1, 2 }, "i64")))
    assert.is_truthy(msg():find("lengths", 1, true))
    -- the backward checks them too
    local gates = Tensor.new({ T, N, 4 * H }, "f32")
    local dW, dR, db = Tensor.new({ 3 * H, C }, "f32"), Tensor.new({ 3 * H, H }, "f32"), Tensor.new({ 3 * H }, "f32")
    local bad = Tensor.from({ 5, 1, 9, 2, 4 }, "i64")
    assert.are.equal(lib.QG_ERR_ARG, lib.qg_gru_backward(ctx(), nil, dW.t, dR.t, db.t, db.t, nil, y.t, 0, nil, x.t, p.W.t,
                                                         p.R.t, hs.t, gates.t, bad.t, 0))
    assert.is_truthy(msg():find("lengths[2] = 9", 1, true))
  end)
end)

describe("float GRU statistics observer", function()
  local Q = { x = 0, h = 1, wx = 2, rh = 3, zpre = 4, rpre = 5, gpre = 6, zout = 7, rout = 8, gout = 9, rrh = 10,
              old = 11, new = 12 }
  local LO, HI, BINS = -2, 2, tonumber(lib.QG_STATS_BINS)

  -- float64 reference: every operator's values on valid steps, per row of the observer.
  local function ref_values(pt, xt, h0t, lens, reverse, C, H)
    local v = {}
    for k = 0, 12 do v[k] = {} end
    local function add(k, val) v[k][#v[k] + 1] = val end
    local sig = function(a) return 1 / (1 + math.exp(-a)) end
    local tanh = function(a) local e = math.exp(2 * a); return (e - 1) / (e + 1) end
    for n = 1, #lens do
      local L = lens[n]
      local h = {}
      for i = 1, H do h[i] = h0t and h0t[n][i] or 0 end
      if h0t then for i = 1, H do add(Q.h, h[i]) end end
      for t = 1, L do
        for c = 1, C do add(Q.x, xt[t][n][c]) end
        for j = 1, 3 * H do
          local a = 0
          for c = 1, C do a = a + pt.W[j][c] * xt[t][n][c] end
          add(Q.wx, a)
        end
      end
      for s = 1, L do
        local t = reverse == 1 and L + 1 - s or s
        local wx, rh = {}, {}
        for j = 1, 3 * H do
          local a, b = 0, 0
          for c = 1, C do a = a + pt.W[j][c] * xt[t][n][c] end
          for i = 1, H do b = b + pt.R[j][i] * h[i] end
          wx[j], rh[j] = a, b
          add(Q.rh, b)
        end
        local hn = {}
        for i = 1, H do
          local zpre = wx[i] + pt.bx[i] + rh[i] + pt.br[i]
          local rpre = wx[H + i] + pt.bx[H + i] + rh[H + i] + pt.br[H + i]
          local z, r = sig(zpre), sig(rpre)
          local q = rh[2 * H + i] + pt.br[2 * H + i]
          local gpre = wx[2 * H + i] + pt.bx[2 * H + i] + r * q
          local g = tanh(gpre)
          hn[i] = z * h[i] + (1 - z) * g
          add(Q.zpre, zpre); add(Q.rpre, rpre); add(Q.zout, z); add(Q.rout, r); add(Q.rh, q); add(Q.rrh, r * q)
          add(Q.gpre, gpre); add(Q.gout, g); add(Q.old, z * h[i]); add(Q.new, (1 - z) * g); add(Q.h, hn[i])
        end
        h = hn
      end
    end
    return v
  end

  for _, reverse in ipairs({ 0, 1 }) do
    it(string.format("min/max and counts equal the float64 reference on valid steps only (%s)",
                     reverse == 1 and "reverse" or "forward"), function()
      local T, N, C, H = 5, 4, 3, 4
      local lens = { 5, 2, 1, 4 }
      qgru.seed(301 + reverse)
      local p = params(C, H, 0.7)
      local x = Tensor.new({ T, N, C }, "f32"):uniform(-1, 1)
      local xt = x:totable()
      -- padded time indices hold values far outside every valid one: observing them would show
      for n = 1, N do for t = lens[n] + 1, T do for c = 1, C do xt[t][n][c] = 50 + t end end end
      x = Tensor.from(xt, "f32")
      local h0 = Tensor.new({ N, H }, "f32"):uniform(-0.9, 0.9)
      local range, counts = Tensor.new({ 13, 4 }, "f64"), Tensor.new({ 13, BINS }, "i64")
      for k = 1, 13 do range:set(k, 1, math.huge); range:set(k, 2, -math.huge); range:set(k, 3, LO); range:set(k, 4, HI) end
      local stats = ffi.new("qg_stats")
      stats.range, stats.counts = range.t, counts.t
      for _, train in ipairs({ false, true }) do
        -- observed twice (inference, then training): the second call adds to the same rows
        forward(p, x, h0, Tensor.from(lens, "i64"), reverse, train, stats)
      end
      local v = ref_values(to_tables(p), xt, h0:totable(), lens, reverse, C, H)
      local rt, ct = range:totable(), counts:totable()
      for k = 0, 12 do
        local mn, mx = math.huge, -math.huge
        local want = {}
        for b = 1, BINS do want[b] = 0 end
        for _, val in ipairs(v[k]) do
          mn, mx = math.min(mn, val), math.max(mx, val)
          local f = (val - LO) / (HI - LO) * BINS
          local b = f < 0 and 0 or (f >= BINS and BINS - 1 or math.floor(f))
          want[b + 1] = want[b + 1] + 2
        end
        assert(math.abs(rt[k + 1][1] - mn) <= 1e-5 and math.abs(rt[k + 1][2] - mx) <= 1e-5,
               string.format("row %d: min/max %g %g, reference %g %g", k, rt[k + 1][1], rt[k + 1][2], mn, mx))
        local total, diff = 0, 0
        for b = 1, BINS do total = total + ct[k + 1][b]; diff = diff + math.abs(ct[k + 1][b] - want[b]) end
        assert(total == 2 * #v[k], string.format("row %d: %d counts, %d values observed", k, total, 2 * #v[k]))
        -- float32 vs float64 may put a value on the other side of a bin edge (width 0.002)
        assert(diff <= 4, string.format("row %d: histograms differ by %d", k, diff))
      end
      -- the statistics do not change the output
      local y1 = forward(p, x, h0, Tensor.from(lens, "i64"), reverse, false, stats)
      local y2 = forward(p, x, h0, Tensor.from(lens, "i64"), reverse, false, nil)
      assert.is_true(U.max_abs_diff(U.flatten(y1:totable()), U.flatten(y2:totable())) <= 1e-6)
    end)
  end

  it("rejects statistics tensors of the wrong shape or dtype", function()
    local p = params(2, 3, 0.5)
    local x = Tensor.new({ 2, 2, 2 }, "f32")
    local y, hs = Tensor.new({ 2, 2, 3 }, "f32"), Tensor.new({ 3, 2, 3 }, "f32")
    local stats = ffi.new("qg_stats")
    local range, counts = Tensor.new({ 13, 4 }, "f64"), Tensor.new({ 13, BINS }, "f64")
    stats.range, stats.counts = range.t, counts.t
    assert.are.equal(lib.QG_ERR_ARG, lib.qg_gru_forward(ctx(), y.t, 0, hs.t, nil, stats, x.t, p.W.t, p.R.t, p.bx.t,
                                                        p.br.t, nil, nil, 0))
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx())):find("stats.counts", 1, true))
  end)
end)
