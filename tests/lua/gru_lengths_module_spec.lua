-- gru_lengths_module_spec.lua: variable-length batches through nn.GRU, float and quantized,
-- multi-layer and bidirectional with h0: a batch run with per-row lengths equals running each
-- row alone at its own length (outputs, h_n, input and h0 gradients, parameter gradients as the
-- sum over rows); padded steps give zero output and zero input gradient, whatever gradient
-- arrives there; calibration counts only valid steps; bad lengths are clear errors.
local qgru = require("qgru")
local U = require("testutil")
local nn, quant = qgru.nn, qgru.quant

local T, N, C, H, L = 7, 4, 3, 5, 2
local LENGTHS = { 7, 1, 4, 6 }

-- rows [1..len] of column n of a [T][N][K] table as a [len][1][K] tensor
local function row_of(tab, n, len)
  local out = {}
  for t = 1, len do out[t] = { tab[t][n] } end
  return qgru.tensor(out)
end

local function h0_row(h0tab, n)
  local out = {}
  for k = 1, #h0tab do out[k] = { h0tab[k][n] } end
  return qgru.tensor(out)
end

local function grads_of(gru)
  local out = {}
  for _, e in ipairs(gru:namedParameters()) do out[e.name] = U.flatten(e.grad:totable()) end
  return out
end

local function build(seed, quantized)
  qgru.seed(seed)
  local gru = nn.GRU(C, H, { layers = L, bidirectional = true })
  if quantized then
    quant.prepare(gru, quant.uniform(8, { weight_bits = 6 }))
    local calib = { qgru.zeros({ T, N, C }):uniform(-1, 1), qgru.zeros({ T, N, C }):uniform(-1, 1) }
    quant.calibrate(gru, calib, { method = "histogram", passes = 2 })
    quant.freeze(gru)
    gru.qstate.track_weights = false
  end
  gru:training()
  return gru
end

for _, quantized in ipairs({ false, true }) do
  local kind = quantized and "quantized (integer step, STE)" or "float"
  describe("nn.GRU with per-row lengths, " .. kind, function()
    it("equals each row run alone at its own length: y, h_n, dx, dh0, parameter gradients", function()
      local gru = build(5, quantized)
      local D = gru.dirs
      local x = qgru.zeros({ T, N, C }):uniform(-1, 1)
      local h0 = qgru.zeros({ L * D, N, H }):uniform(-0.5, 0.5)
      local G = qgru.zeros({ T, N, D * H }):uniform(-1, 1)   -- also at padded steps: must be ignored
      local y = gru:forward({ x, h0, lengths = LENGTHS }):totable()
      local hn = gru.h_n:totable()
      gru:zeroGrad()
      local gin = gru:backward({ x, h0, lengths = LENGTHS }, G)
      local dx, dh0 = gin[1]:totable(), gin[2]:totable()
      local batch_grads = grads_of(gru)

      local xt, h0t, Gt = x:totable(), h0:totable(), G:totable()
      local sum = {}
      local tol = quantized and 0 or 1e-5
      for n = 1, N do
        local len = LENGTHS[n]
        local yn = gru:forward({ row_of(xt, n, len), h0_row(h0t, n) }):totable()
        local hnn = gru.h_n:totable()
        gru:zeroGrad()
        local gn = gru:backward({ row_of(xt, n, len), h0_row(h0t, n) }, row_of(Gt, n, len))
        local dxn, dh0n = gn[1]:totable(), gn[2]:totable()
        for t = 1, T do
          for j = 1, D * H do
            if t <= len then
              assert.is_true(math.abs(y[t][n][j] - yn[t][1][j]) <= tol, string.format("y row %d t %d j %d: %.9g vs %.9g", n, t, j, y[t][n][j], yn[t][1][j]))
            else
              assert.are.equal(0, y[t][n][j])
            end
          end
          for k = 1, C do
            if t <= len then
              assert.is_true(math.abs(dx[t][n][k] - dxn[t][1][k]) <= math.max(tol, 1e-6) * 10, string.format("dx row %d t %d", n, t))
            else
              assert.are.equal(0, dx[t][n][k])
            end
          end
        end
        for k = 1, L * D do
          for i = 1, H do
            assert.is_true(math.abs(hn[k][n][i] - hnn[k][1][i]) <= tol, string.format("h_n[%d] row %d", k, n))
            assert.is_true(math.abs(dh0[k][n][i] - dh0n[k][1][i]) <= 1e-5, string.format("dh0[%d] row %d", k, n))
          end
        end
        for name, g in pairs(grads_of(gru)) do
          sum[name] = sum[name] or {}
          for i, v in ipairs(g) do sum[name][i] = (sum[name][i] or 0) + v end
        end
      end
      for name, g in pairs(batch_grads) do
        assert.is_true(U.rel_err(g, sum[name]) < 1e-5, name .. ": rel err " .. U.rel_err(g, sum[name]))
      end
    end)

    it("rejects a length of 0, above T, or the wrong count, naming the row", function()
      local gru = build(6, quantized)
      local x = qgru.zeros({ T, N, C }):uniform(-1, 1)
      assert.raises_match(function() gru:forward({ x, lengths = { 7, 0, 4, 6 } }) end, "lengths[2] = 0")
      assert.raises_match(function() gru:forward({ x, lengths = { 7, 8, 4, 6 } }) end, "lengths[2] = 8")
      assert.raises_match(function() gru:forward({ x, lengths = { 7, 1 } }) end, "expected 4 entries")
    end)
  end)
end

describe("calibration with lengths", function()
  it("counts only valid steps: padding with huge values changes nothing", function()
    local function calibrated(pad)
      qgru.seed(9)
      local gru = nn.GRU(C, H)
      quant.prepare(gru, quant.uniform(8))
      local x = qgru.zeros({ T, N, C }):uniform(-1, 1)
      local p = x:ptr()
      for t = 0, T - 1 do
        for n = 0, N - 1 do
          if t >= LENGTHS[n + 1] then for k = 0, C - 1 do p[(t * N + n) * C + k] = pad end end
        end
      end
      quant.calibrate(gru, { { x, lengths = LENGTHS } }, { method = "histogram", passes = 2 })
      local out = {}
      for _, e in ipairs(quant.quantizers(gru)) do out[e.name] = { e.quantizer:get() } end
      return out
    end
    assert.are.same(calibrated(0), calibrated(1000))
  end)
end)
