-- quant_step_spec.lua: the C integer GRU step against the independent Lua reference written from
-- QUANT_SPEC.md (tests/lua/qref.lua), bit for bit: several seeds, multi-layer, bidirectional,
-- T up to 20, mixed bitwidths (2, 4, 8, 12, 16), asymmetric and unsigned quantizers; the STE
-- backward against the reference's float64 section-4 formulas (same masks); and, with every
-- operator at 16 bits and wide ranges, the STE gradient against the float gradient.
local qgru = require("qgru")
local U = require("testutil")
local R = require("qref")
local nn, quant = qgru.nn, qgru.quant

local BITS = { 2, 4, 8, 12, 16 }

-- A config table with random bitwidths and signedness for every operator (seeded Lua RNG).
local function random_config(seed)
  math.randomseed(seed)
  local oc = {}
  for _, op in ipairs(quant.OPS) do
    local e = {}
    local w = op:match("^weight") ~= nil
    e.bitwidth = BITS[math.random(#BITS)]
    if w then e.bitwidth = math.max(e.bitwidth, 4) end
    if op == "gate.z_pre" or op == "gate.r_pre" or op == "gate.g_pre" or op == "input.x" or op == "output.h"
        or op == "matmul.Wx" or op == "matmul.Rh" or op == "op.rRh" then
      e.bitwidth = math.max(e.bitwidth, 4)
    end
    e.is_symmetric = w and (math.random() < 0.7) or (math.random() < 0.3)
    e.is_unsigned = (not w) and math.random() < 0.25
    if op == "gate.z_out" or op == "gate.r_out" then e.is_unsigned = math.random() < 0.7 end
    oc[op] = e
  end
  -- seed 7: one 20-bit operator, so the C layer runs its 128-bit cell (wider than 16 bits)
  if seed == 7 then oc["op.rRh"].bitwidth = 20; oc["op.rRh"].is_symmetric = false end
  return quant.fromTable(qgru.json.decode(qgru.json.encode({ GRU_config = { operator_config = oc } })), "random" .. seed)
end

local function weights_of(gru, l, d)
  local w = gru.weights[l][d]
  return { W = w.W:totable(), R = w.R:totable(), bx = w.bx:totable(), br = w.br:totable() }
end

-- Builds, calibrates and runs a quantized GRU; returns it, its input, h0 and output.
local function setup(seed, T, N, C, H, L, bidir, with_h0, method)
  qgru.seed(seed)
  local gru = nn.GRU(C, H, { layers = L, bidirectional = bidir })
  for _, p in ipairs(gru:namedParameters()) do p.param:uniform(-0.7, 0.7) end
  local x = qgru.zeros({ T, N, C }):uniform(-1.5, 1.5)
  local h0 = with_h0 and qgru.zeros({ L * gru.dirs, N, H }):uniform(-0.8, 0.8) or nil
  quant.prepare(gru, random_config(seed))
  local calib = {}
  for i = 1, 2 do calib[i] = qgru.zeros({ T, N, C }):uniform(-1.5, 1.5) end
  quant.calibrate(gru, calib, { method = method or "minmax", passes = 2 })
  gru:training()
  local input = h0 and { x, h0 } or x
  local y = gru:forward(input)
  return gru, x, h0, y, input
end

describe("integer GRU step: C == independent Lua reference, bit for bit", function()
  local cases = {
    { seed = 1, T = 6, N = 2, C = 3, H = 4, L = 1, bidir = false, h0 = false },
    { seed = 2, T = 20, N = 2, C = 3, H = 3, L = 1, bidir = true, h0 = true },
    { seed = 3, T = 8, N = 3, C = 2, H = 4, L = 2, bidir = true, h0 = true, method = "histogram" },
    { seed = 4, T = 12, N = 1, C = 4, H = 5, L = 3, bidir = false, h0 = false, method = "mse" },
    { seed = 5, T = 5, N = 2, C = 3, H = 3, L = 2, bidir = false, h0 = true },
    { seed = 6, T = 10, N = 2, C = 5, H = 2, L = 1, bidir = true, h0 = false, method = "percentile" },
    { seed = 7, T = 9, N = 3, C = 3, H = 4, L = 2, bidir = true, h0 = true },
  }
  for _, c in ipairs(cases) do
    it(string.format("seed %d: T=%d N=%d C=%d H=%d layers=%d%s%s", c.seed, c.T, c.N, c.C, c.H, c.L,
                     c.bidir and " bidirectional" or "", c.h0 and " h0" or ""), function()
      local gru, x, h0, y = setup(c.seed, c.T, c.N, c.C, c.H, c.L, c.bidir, c.h0, c.method)
      local D = gru.dirs
      local inp = x:totable()
      local h0t = h0 and h0:totable() or nil
      local bits_seen = {}
      for l = 0, c.L - 1 do
        local out = {}
        for t = 1, c.T do out[t] = {} for n = 1, c.N do out[t][n] = {} end end
        for d = 0, D - 1 do
          local lq = gru.qstate.layers[l * D + d]
          local A, Wq = U.qref_quantizers(lq)
          for _, q in pairs(A) do bits_seen[q.bits] = true end
          local F = R.layer(A, Wq, weights_of(gru, l, d), inp, h0t and h0t[l * D + d + 1] or nil, d == 1)
          -- output.h codes of every step
          local hq = lq.last.hq:totable()
          for s = 0, c.T do
            for n = 1, c.N do
              for i = 1, c.H do
                if hq[s + 1][n][i] ~= F.hq[s][n][i] then
                  error(string.format("layer %d dir %d step %d: C code %d, reference %d", l, d, s, hq[s + 1][n][i], F.hq[s][n][i]))
                end
              end
            end
          end
          for t = 1, c.T do for n = 1, c.N do for i = 1, c.H do out[t][n][d * c.H + i] = F.y[t][n][i] end end end
        end
        inp = out
      end
      assert.are.same(U.flatten(inp), U.flatten(y:totable()))
      local n = 0
      for _ in pairs(bits_seen) do n = n + 1 end
      assert.is_true(n >= 2)
    end)
  end
end)

describe("STE backward == float64 reference of section 4 (same masks)", function()
  for _, c in ipairs({ { seed = 11, bidir = false, h0 = true }, { seed = 12, bidir = true, h0 = true }, { seed = 13, bidir = true, h0 = false } }) do
    it("seed " .. c.seed .. (c.bidir and " bidirectional" or ""), function()
      local T, N, C, H = 7, 2, 3, 4
      local gru, x, h0, y, input = setup(c.seed, T, N, C, H, 1, c.bidir, c.h0)
      local D = gru.dirs
      local G = qgru.zeros({ T, N, D * H }):uniform(-1, 1)
      gru:zeroGrad()
      local gin = gru:backward(input, G)
      local Gt = G:totable()
      local dx_ref
      for d = 0, D - 1 do
        local lq = gru.qstate.layers[d]
        local A, Wq = U.qref_quantizers(lq)
        local F = R.layer(A, Wq, weights_of(gru, 0, d), x:totable(), h0 and h0:totable()[d + 1] or nil, d == 1)
        local dy = {}
        for t = 1, T do dy[t] = {} for n = 1, N do dy[t][n] = {} for i = 1, H do dy[t][n][i] = Gt[t][n][d * H + i] end end end
        local B = R.backward(F, dy)
        local g = gru.grads[0][d]
        for _, k in ipairs({ { "W", "dW" }, { "R", "dR" }, { "bx", "dbx" }, { "br", "dbr" } }) do
          local err = U.rel_err(U.flatten(g[k[1]]:totable()), U.flatten(B[k[2]]))
          assert(err < 1e-4, string.format("dir %d %s: relative error %.3g", d, k[1], err))
        end
        if h0 then
          local err = U.rel_err(U.flatten(gin[2]:select(d + 1):totable()), U.flatten(B.dh0))
          assert(err < 1e-4, string.format("dir %d dh0: relative error %.3g", d, err))
        end
        local flat = U.flatten(B.dx)
        if not dx_ref then dx_ref = flat else for i = 1, #flat do dx_ref[i] = dx_ref[i] + flat[i] end end
      end
      local dx = h0 and gin[1] or gin
      local err = U.rel_err(U.flatten(dx:totable()), dx_ref)
      assert(err < 1e-4, string.format("dx: relative error %.3g", err))
    end)
  end
end)

describe("STE at 16 bits with wide ranges", function()
  it("is within 1e-2 relative of the float gradient", function()
    qgru.seed(21)
    local model = nn.Sequential():add(nn.GRU(3, 8, { bidirectional = true })):add(nn.Last()):add(nn.Linear(16, 4))
    local x = qgru.zeros({ 6, 4, 3 }):uniform(-1, 1)
    local y = qgru.tensor({ 0, 3, 1, 2 }, "i64")
    local ce = nn.CrossEntropy()
    local function grads()
      model:training()
      model:zeroGrad()
      local out = model:forward(x)
      ce:forward(out, y)
      model:backward(x, ce:backward(out, y))
      local g = {}
      for _, p in ipairs(model:namedParameters()) do g[p.name] = U.flatten(p.grad:totable()) end
      return g
    end
    local float = grads()
    quant.prepare(model, quant.uniform(16))
    quant.calibrate(model, { x, qgru.zeros({ 6, 4, 3 }):uniform(-1.2, 1.2) }, { method = "minmax", passes = 2 })
    -- widen every activation range 4x (e - 2) so nothing clips
    for _, e in ipairs(quant.quantizers(model)) do
      local q = e.quantizer
      if not q.per_channel and not q.fixed then q:set(q.e - 2, q.is_symmetric and 0 or math.floor(q.z / 4)) end
    end
    local qat = grads()
    for name, g in pairs(float) do
      local err = U.rel_err(qat[name], g)
      assert(err < 1e-2, string.format("%s: relative error %.3g", name, err))
    end
  end)
end)
