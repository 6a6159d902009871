-- quant_api_spec.lua: quantizer arithmetic against hand-computed cases, requantization against
-- its definition (exhaustively over small ranges), calibration against a brute-force search over
-- the same cost, configs (the seed's three examples, presets, bad input), setBitwidth, export ->
-- import -> identical outputs, and the AIMET file's fields and offset sign.
local qgru = require("qgru")
local clib = require("qgru.clib")
local U = require("testutil")
local R = require("qref")
local nn, quant, json = qgru.nn, qgru.quant, qgru.json
local ffi, lib = clib.ffi, clib.lib
local ctx = clib.context("cpu")

local function spec(bits, uns, e, z)
  local s = ffi.new("qg_qspec")
  s.bitwidth, s.is_unsigned, s.exp2_inv, s.zero_point = bits, uns and 1 or 0, e, z or 0
  return s
end
local q64, m32 = ffi.new("int64_t[1]"), ffi.new("int[1]")
local function quantize(x, bits, uns, e, z)
  clib.check(ctx, lib.qg_quantize_scalar(ctx, q64, m32, x, spec(bits, uns, e, z)))
  return tonumber(q64[0]), m32[0]
end
local function requant(v, s, bits, uns, e, z)
  clib.check(ctx, lib.qg_requant_scalar(ctx, q64, m32, v, s, spec(bits, uns, e, z)))
  return tonumber(q64[0]), m32[0]
end

describe("quantizer arithmetic (hand-computed)", function()
  it("rounds half to even", function()
    assert.are.same({ 0, 1 }, { quantize(0.5, 8, false, 0) })
    assert.are.same({ 2, 1 }, { quantize(1.5, 8, false, 0) })
    assert.are.same({ 0, 1 }, { quantize(-0.5, 8, false, 0) })
    assert.are.same({ -2, 1 }, { quantize(-2.5, 8, false, 0) })
    assert.are.same({ 2, 1 }, { quantize(2.5, 8, false, 0) })
    assert.are.same({ 1, 1 }, { quantize(0.3, 8, false, 2) })      -- 1.2 -> 1
    assert.are.same({ 2, 1 }, { quantize(0.375, 8, false, 2) })    -- 1.5 -> 2
  end)
  it("clamps at both ends, with the mask", function()
    assert.are.same({ 127, 0 }, { quantize(200, 8, false, 0) })
    assert.are.same({ -128, 0 }, { quantize(-129, 8, false, 0) })
    assert.are.same({ -128, 1 }, { quantize(-128, 8, false, 0) })
    assert.are.same({ 127, 1 }, { quantize(127.4, 8, false, 0) })
    assert.are.same({ 127, 0 }, { quantize(127.5, 8, false, 0) })  -- rne(127.5) = 128 > 127
  end)
  it("unsigned grids and zero points", function()
    assert.are.same({ 0, 0 }, { quantize(-0.1, 8, true, 4) })
    assert.are.same({ 255, 1 }, { quantize(255 / 256, 8, true, 8) })
    assert.are.same({ 255, 0 }, { quantize(1.0, 8, true, 8) })
    assert.are.same({ 10, 1 }, { quantize(0.0, 4, true, 2, 10) })   -- zero maps to z
    assert.are.same({ 15, 0 }, { quantize(2.0, 4, true, 2, 10) })   -- 8 + 10 = 18 -> 15
  end)
  it("1-bit and 32-bit grids", function()
    assert.are.same({ -1, 1 }, { quantize(-0.7, 1, false, 0) })
    assert.are.same({ 0, 0 }, { quantize(0.7, 1, false, 0) })       -- signed 1-bit: {-1, 0}
    assert.are.same({ 1, 1 }, { quantize(0.7, 1, true, 0) })
    assert.are.same({ 2147483647, 0 }, { quantize(1e12, 32, false, 0) })
    assert.are.same({ -2147483648, 1 }, { quantize(-2147483648, 32, false, 0) })
    assert.are.same({ 4294967295, 1 }, { quantize(4294967295, 32, true, 0) })
    assert.are.same({ 123456789, 1 }, { quantize(123456789.25, 32, false, 0) })
  end)
  it("negative exponents (scales above 1)", function()
    assert.are.same({ 3, 1 }, { quantize(12, 8, false, -2) })       -- 12 / 4
    assert.are.same({ 2, 1 }, { quantize(10, 8, false, -2) })       -- 2.5 -> 2
    assert.are.same({ 4, 1 }, { quantize(14, 8, false, -2) })       -- 3.5 -> 4
    assert.are.same({ -119, 1 }, { quantize(-1e9, 8, false, -23) }) -- -1e9 / 2^23 = -119.2
  end)
  it("per channel: one exponent and zero point per row", function()
    local x = qgru.tensor({ { 0.5, 1.25, -3 }, { 0.5, 1.25, -3 } })
    local fq, codes, mask = qgru.zeros({ 2, 3 }), qgru.zeros({ 2, 3 }, "i32"), qgru.zeros({ 2, 3 }, "u8")
    local exps, zps = qgru.tensor({ 1, 3 }, "i32"), qgru.tensor({ 0, 2 }, "i32")
    clib.check(ctx, lib.qg_fake_quant(ctx, fq.t, codes.t, mask.t, x.t, exps.t, zps.t, 4, 0))
    -- row 0 (e=1, z=0): 1, 2.5->2, -6 ; row 1 (e=3, z=2): 4+2=6, 10+2=12->7 (clip), -24+2=-22->-8 (clip)
    assert.are.same({ { 1, 2, -6 }, { 6, 7, -8 } }, codes:totable())
    assert.are.same({ { 1, 1, 1 }, { 1, 0, 0 } }, mask:totable())
    assert.are.same({ { 0.5, 1, -3 }, { 0.5, 0.625, -1.25 } }, fq:totable())
  end)
end)

describe("requantization", function()
  it("equals quant(v * 2^-s) exhaustively over small ranges of v, s, e, z", function()
    local n = 0
    for _, bits in ipairs({ 3, 8 }) do
      for _, uns in ipairs({ false, true }) do
        local qmin, qmax = R.grid(bits, uns)
        for _, z in ipairs({ qmin, 0 > qmin and 0 or qmin + 1, math.floor((qmin + qmax) / 2), qmax }) do
          for e = -3, 6 do
            for s = -4, 9 do
              for v = -300, 300 do
                local want, wm = R.quant(v * 2 ^ -s, { bits = bits, uns = uns, e = e, z = z })
                local got, gm = requant(v, s, bits, uns, e, z)
                if got ~= want or gm ~= wm then
                  error(string.format("v=%d s=%d -> b=%d%s e=%d z=%d: got %d/%d, want %d/%d", v, s, bits, uns and "u" or "", e, z, got, gm, want, wm))
                end
                n = n + 1
              end
            end
          end
        end
      end
    end
    assert.is_true(n > 600000)
  end)
  it("rounds ties to even in the right shift", function()
    assert.are.same({ 0, 1 }, { requant(1, 1, 8, false, 0, 0) })    -- 0.5 -> 0
    assert.are.same({ 2, 1 }, { requant(3, 1, 8, false, 0, 0) })    -- 1.5 -> 2
    assert.are.same({ -2, 1 }, { requant(-5, 1, 8, false, 0, 0) })  -- -2.5 -> -2
    assert.are.same({ 12, 1 }, { requant(3, 0, 8, false, 2, 0) })   -- left shift is exact
  end)
end)

-- ---- calibration vs brute force ----
local function samples(kind, n, seed)
  math.randomseed(seed)
  local t = qgru.zeros({ n }, "f64")
  local p = t:ptr()
  for i = 0, n - 1 do
    local u1, u2 = math.random(), math.random()
    local g = math.sqrt(-2 * math.log(1 - u1)) * math.cos(2 * math.pi * u2)
    if kind == "gaussian" then p[i] = 0.8 * g + 0.3
    elseif kind == "uniform" then p[i] = -0.5 + 2.5 * u1
    else p[i] = g / math.max(math.abs(math.sqrt(-2 * math.log(1 - math.random())) * math.cos(2 * math.pi * math.random())), 0.05) * 0.2 end  -- heavy tails
  end
  return t
end

local function stats_of(t)
  local range, counts = qgru.zeros({ 1, 4 }, "f64"), qgru.zeros({ 1, lib.QG_STATS_BINS }, "i64")
  local st = ffi.new("qg_stats")
  st.range, st.counts = range.t, counts.t
  clib.check(ctx, lib.qg_stats_reset(ctx, st))
  clib.check(ctx, lib.qg_stats_add(ctx, st, 0, t.t))
  clib.check(ctx, lib.qg_stats_begin_histogram(ctx, st))
  clib.check(ctx, lib.qg_stats_add(ctx, st, 0, t.t))
  -- totable(): one row as {min, max, lo, hi, counts...} (the layout the references read)
  return { stats = st, range = range, counts = counts, totable = function()
    local row = range:totable()[1]
    for _, c in ipairs(counts:totable()[1]) do row[#row + 1] = c end
    return { row }
  end }
end

-- The brute-force reference, from QUANT_SPEC.md section 5 and the candidate set documented in
-- core/calib.c, on the same histogram.
local function ref_minmax(lo, hi, bits, sym, uns)
  lo, hi = math.min(lo, 0), math.max(hi, 0)
  local qmin, qmax = R.grid(bits, uns)
  if hi <= lo then return bits - 1, 0 end
  if sym then
    local m = uns and hi or math.max(-lo, hi)
    return math.floor(math.log(math.max(qmax, 1) / m) / math.log(2)), 0
  end
  local e = math.floor(math.log((qmax - qmin) / (hi - lo)) / math.log(2))
  local z = qmin - R.rne(lo * 2 ^ e)
  if R.rne(hi * 2 ^ e) + z > qmax then e = e - 1; z = qmin - R.rne(lo * 2 ^ e) end
  return e, z
end

local function ref_search(row, bits, sym, uns, clip_w)
  local lo, hi = math.min(row[1], 0), math.max(row[2], 0)
  local e0, z0 = ref_minmax(row[1], row[2], bits, sym, uns)
  local qmin, qmax = R.grid(bits, uns)
  local bw = (row[4] - row[3]) / 2048
  local best, be, bz = math.huge, e0, z0
  for e = e0, e0 + 8 do
    local zs = { 0 }
    if not sym then
      zs = {}
      local W = (qmax - qmin) * 2 ^ -e
      local a, b = math.min(lo, hi - W), math.max(lo, hi - W)
      for k = 0, 20 do
        local z = math.max(qmin, math.min(qmax, qmin - R.rne((a + (b - a) * k / 20) * 2 ^ e)))
        if z ~= zs[#zs] then zs[#zs + 1] = z end
      end
    end
    for _, z in ipairs(zs) do
      local q = { bits = bits, uns = uns, e = e, z = z }
      local cost = 0
      for b = 0, 2047 do
        local c = row[5 + b]
        if c > 0 then
          local mid = row[3] + (b + 0.5) * bw
          local code, m = R.quant(mid, q)
          local d = mid - R.deq(code, q)
          cost = cost + c * (m == 1 and 1 or clip_w) * d * d
        end
      end
      if cost < best then best, be, bz = cost, e, z end
    end
  end
  return be, bz
end

describe("calibration methods vs brute force over the same cost", function()
  local e32, z32, cost = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("double[1]")
  local function calibrate(st, bits, sym, uns, method, pct)
    clib.check(ctx, lib.qg_calibrate_row(ctx, e32, z32, cost, st.stats, 0, bits, sym and 1 or 0, uns and 1 or 0, method, pct or 99.99))
    return e32[0], z32[0]
  end
  for _, kind in ipairs({ "gaussian", "uniform", "heavy" }) do
    for _, q in ipairs({ { 8, false, false }, { 4, false, false }, { 8, true, false }, { 6, true, true }, { 8, false, true } }) do
      local bits, sym, uns = q[1], q[2], q[3]
      it(string.format("%s samples, %d-bit %s %s", kind, bits, sym and "symmetric" or "asymmetric", uns and "unsigned" or "signed"), function()
        local t = samples(kind, 4000, bits * 7 + (sym and 1 or 0))
        if uns then local p = t:ptr() for i = 0, t:numel() - 1 do p[i] = math.abs(p[i]) end end
        local st = stats_of(t)
        local row = st.totable()[1]
        assert.are.same({ ref_minmax(row[1], row[2], bits, sym, uns) }, { calibrate(st, bits, sym, uns, lib.QG_CALIB_MINMAX) })
        assert.are.same({ ref_search(row, bits, sym, uns, 3) }, { calibrate(st, bits, sym, uns, lib.QG_CALIB_HISTOGRAM) })
        assert.are.same({ ref_search(row, bits, sym, uns, 1) }, { calibrate(st, bits, sym, uns, lib.QG_CALIB_MSE) })
        -- percentile: clip (100 - p) / 2 % of the samples in each tail, then minmax
        local vals = U.flatten(t:totable())
        table.sort(vals)
        local pe = calibrate(st, bits, sym, uns, lib.QG_CALIB_PERCENTILE, 99)
        local k = math.floor(#vals * 0.005)
        local re_ = ref_minmax(vals[k + 1], vals[#vals - k], bits, sym, uns)
        assert.is_true(math.abs(pe - re_) <= 1, "percentile exponent " .. pe .. " vs " .. re_)
        assert.is_true(pe >= ref_minmax(row[1], row[2], bits, sym, uns))   -- clipping the tails never widens
      end)
    end
  end
  it("a degenerate (all-zero) range gives e = b - 1, z = 0", function()
    local st = stats_of(qgru.zeros({ 10 }, "f64"))
    for _, m in ipairs({ lib.QG_CALIB_MINMAX, lib.QG_CALIB_HISTOGRAM, lib.QG_CALIB_MSE }) do
      assert.are.same({ 7, 0 }, { calibrate(st, 8, false, false, m) })
    end
  end)
  it("weights per channel: each row calibrated from its own values", function()
    local w = qgru.tensor({ { 0.5, -0.25, 0.1 }, { 4, -3, 1 }, { 0.01, 0.02, -0.015 } })
    local exps, zps = qgru.zeros({ 3 }, "i32"), qgru.zeros({ 3 }, "i32")
    clib.check(ctx, lib.qg_calibrate_channels(ctx, exps.t, zps.t, w.t, 8, 1, 0, lib.QG_CALIB_MINMAX, 99.99))
    -- e = floor(log2(127 / max|row|)): 127/0.5 -> 7, 127/4 -> 4, 127/0.02 -> 12
    assert.are.same({ 7, 4, 12 }, exps:totable())
    assert.are.same({ 0, 0, 0 }, zps:totable())
  end)
  it("a layer derives its weight quantizers itself (qg_int_gru_calibrate_weight) and reads them back", function()
    local H = 1
    local out = ffi.new("qg_int_gru*[1]")
    clib.check(ctx, lib.qg_int_gru_create(ctx, out, 2, H))
    local g = ffi.gc(out[0], lib.qg_int_gru_free)
    local exps, zps = qgru.zeros({ 3 }, "i32"), qgru.zeros({ 3 }, "i32")
    -- W [3, 2]: 127 / max|row| = 254 -> 7; 31.75 -> 4; a row of zeros is degenerate: e = b - 1 = 7
    local W = qgru.tensor({ { 0.5, -0.25 }, { 4, -3 }, { 0, 0 } })
    clib.check(ctx, lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_W, W.t, 8, 1, 0, lib.QG_CALIB_MINMAX, 99.99))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_W, exps.t, zps.t))
    assert.are.same({ 7, 4, 7 }, exps:totable())
    assert.are.same({ 0, 0, 0 }, zps:totable())
    -- bx [3], 8-bit symmetric: 127 / 3 = 42.3 -> 5, 127 / 0.75 = 169.3 -> 7, 127 / 2 = 63.5 -> 5
    local bx = qgru.tensor({ 3, 0.75, -2 })
    clib.check(ctx, lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_BX, bx.t, 8, 1, 0, lib.QG_CALIB_MINMAX, 99.99))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_BX, exps.t, zps.t))
    assert.are.same({ 5, 7, 5 }, exps:totable())
    assert.are.same({ 0, 0, 0 }, zps:totable())
    -- W again, 8-bit unsigned asymmetric: [-1, 3]: 255 / 4 = 63.75 -> e = 5, z = 0 - rne(-32) = 32
    -- (rne(96) + 32 = 128 fits); [-1.5, 253.5] / 64: 255 / 3.984375 = 64 -> e = 6, z = -rne(-1.5) = 2,
    -- but rne(253.5) + 2 = 256 clips, so e = 5: z = -rne(-0.75) = 1 (rne(126.75) + 1 = 128 fits);
    -- zeros: degenerate
    local Wa = qgru.tensor({ { -1, 3 }, { -1.5 / 64, 253.5 / 64 }, { 0, 0 } })
    clib.check(ctx, lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_W, Wa.t, 8, 0, 1, lib.QG_CALIB_MINMAX, 99.99))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_W, exps.t, zps.t))
    assert.are.same({ 5, 5, 7 }, exps:totable())
    assert.are.same({ 32, 1, 0 }, zps:totable())
    clib.check(ctx, lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_W, W.t, 8, 1, 0, lib.QG_CALIB_MINMAX, 99.99))
    -- the other methods give qg_calibrate_channels' answer (the same rows, the same code)
    local R3 = qgru.zeros({ 3, 1 }):uniform(-2, 2)
    local e2, z2 = qgru.zeros({ 3 }, "i32"), qgru.zeros({ 3 }, "i32")
    clib.check(ctx, lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_R, R3.t, 6, 0, 0, lib.QG_CALIB_HISTOGRAM, 99.99))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_R, exps.t, zps.t))
    clib.check(ctx, lib.qg_calibrate_channels(ctx, e2.t, z2.t, R3.t, 6, 0, 0, lib.QG_CALIB_HISTOGRAM, 99.99))
    assert.are.same(e2:totable(), exps:totable())
    assert.are.same(z2:totable(), zps:totable())
    -- bad input names the weight and changes nothing
    local st = lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_W, bx.t, 8, 1, 0, lib.QG_CALIB_MINMAX, 99.99)
    assert.are_not.equal(lib.QG_OK, st)
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("W", 1, true))
    st = lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_W, W.t, 8, 1, 0, lib.QG_CALIB_PERCENTILE, 10)
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("percentile", 1, true), ffi.string(lib.qg_last_error(ctx)))
    st = lib.qg_int_gru_calibrate_weight(ctx, g, lib.QG_W_W, W.t, 0, 1, 0, lib.QG_CALIB_MINMAX, 99.99)
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("bitwidth", 1, true))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_W, exps.t, nil))
    assert.are.same({ 7, 4, 7 }, exps:totable())
    st = lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_BR, exps.t, zps.t)
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("not been set", 1, true))
    -- all four in one call (what tracking runs): checked completely before anything is applied
    local specs = ffi.new("qg_wcalib[4]")
    for i = 0, 3 do specs[i].calibrate, specs[i].bitwidth, specs[i].is_symmetric, specs[i].method = 1, 8, 1, lib.QG_CALIB_MINMAX end
    local Rr = qgru.tensor({ { 1 }, { -0.5 }, { 0.25 } })
    local W2 = qgru.tensor({ { 1, 0 }, { 2, 0 }, { 0.125, 0 } })
    st = lib.qg_int_gru_calibrate_weights(ctx, g, specs, W2.t, Rr.t, bx.t, W.t)   -- br has the wrong shape
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("br", 1, true), ffi.string(lib.qg_last_error(ctx)))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_W, exps.t, nil))
    assert.are.same({ 7, 4, 7 }, exps:totable())   -- W unchanged
    specs[3].calibrate = 0
    clib.check(ctx, lib.qg_int_gru_calibrate_weights(ctx, g, specs, W2.t, Rr.t, bx.t, nil))
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_W, exps.t, nil))
    assert.are.same({ 6, 5, 9 }, exps:totable())   -- 127 / 1 = 127, / 2 = 63.5, / 0.125 = 1016
    clib.check(ctx, lib.qg_int_gru_weight_quant(ctx, g, lib.QG_W_R, exps.t, nil))
    assert.are.same({ 6, 7, 8 }, exps:totable())
  end)

  -- the symmetric 8-bit minmax rule per row of a [12, 3] weight: the largest e with max|row| 2^e <= 127
  local function minmax_exps(W)
    local want = {}
    for r = 1, 12 do
      local m = 0
      for c = 1, 3 do m = math.max(m, math.abs(W:get(r, c))) end
      local e = 31
      while e > -31 and m * 2 ^ e > 127 do e = e - 1 end
      want[r] = e
    end
    return want
  end

  it("tracked weight quantizers describe the weights of the last forward, and q.exps shows them", function()
    qgru.seed(5)
    local gru = nn.GRU(3, 4)
    quant.prepare(gru, quant.uniform(8))
    quant.calibrate(gru, { qgru.zeros({ 5, 2, 3 }):uniform(-1, 1) }, { method = "minmax" })
    local W = gru.weights[0][0].W
    W:narrow(1, 1, 1):mul(64)   -- row 0 grows 64x: its exponent drops by 6
    gru:forward(qgru.zeros({ 5, 2, 3 }):uniform(-1, 1))
    local q = quant.get(gru, "l0.fwd.weight.W")
    local want = minmax_exps(W)
    assert.are.same(want, q.exps:totable())
    assert.are.same(want, (q:get()))
  end)

  it("a tracked weight quantizer whose recorded method is no calibration method re-derives by the minmax rule", function()
    -- the recorded method is whatever set (e, z) last: "set", "pinned", or any string a checkpoint
    -- holds (quant.setState takes any string; the fuzzer's regression
    -- checkpoint-weight-method-empty-nil-in-calibrate had "" and the forward raised)
    qgru.seed(5)
    local gru = nn.GRU(3, 4)
    quant.prepare(gru, quant.uniform(8))
    quant.calibrate(gru, { qgru.zeros({ 5, 2, 3 }):uniform(-1, 1) }, { method = "histogram" })
    local q = quant.get(gru, "l0.fwd.weight.W")
    q.method = ""
    gru.weights[0][0].W:narrow(1, 2, 1):mul(16)
    gru:forward(qgru.zeros({ 5, 2, 3 }):uniform(-1, 1))
    assert.are.same(minmax_exps(gru.weights[0][0].W), q.exps:totable())
    assert.are.equal("minmax", q.method)
  end)

  it("leaves fixed sigmoid/tanh output quantizers untouched", function()
    qgru.seed(3)
    local gru = nn.GRU(2, 3)
    quant.prepare(gru, quant.uniform(8))
    quant.calibrate(gru, { qgru.zeros({ 4, 2, 2 }):uniform(-5, 5) }, { method = "histogram" })
    local z, g = quant.get(gru, "gru.l0.fwd.gate.z_out"), quant.get(gru, "l0.fwd.gate.g_out")
    assert.are.same({ 8, 0, "fixed" }, { z.e, z.z, z.method })
    assert.are.same({ 7, 0, "fixed" }, { g.e, g.z, g.method })
  end)
end)
