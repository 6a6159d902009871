-- int_gru_paths_spec.lua: every integer arithmetic the CPU layer picks (qg_int_gru_cell_path: the
-- vectorized 32-bit cell with byte or float32 GEMMs, the general 64- and 128-bit cell) against the
-- independent Lua reference (tests/lua/qref.lua), bit for bit, with H = 19 so the vector loops run
-- a full vector and a remainder; the vectorized STE backward against the reference's float64
-- section 4; and the same codes and gradients, bit for bit, on 1, 2 and 3 threads.
local qgru = require("qgru")
local U = require("testutil")
local R = require("qref")
local nn, quant = qgru.nn, qgru.quant
local lib = require("qgru.clib").lib

local T, N, C, H = 5, 3, 5, 19

local function ref_quantizers(lq)
  local A, Wq = {}, {}
  local names = { ["weight.W"] = "W", ["weight.R"] = "R", ["weight.bw"] = "bx", ["weight.br"] = "br" }
  for op, q in pairs(lq:quantizers()) do
    local e, z = q:get()
    if q.per_channel then Wq[names[op]] = { bits = q.bitwidth, uns = q.is_unsigned, e = e, z = z }
    else A[op] = { bits = q.bitwidth, uns = q.is_unsigned, e = e, z = z } end
  end
  return A, Wq
end

local function weights_of(gru, d)
  local w = gru.weights[0][d]
  return { W = w.W:totable(), R = w.R:totable(), bx = w.bx:totable(), br = w.br:totable() }
end

-- A bidirectional quantized GRU calibrated on two batches, config cfg; optional edit(gru).
local function build(seed, cfg, edit)
  qgru.seed(seed)
  local gru = nn.GRU(C, H, { bidirectional = true })
  for _, p in ipairs(gru:namedParameters()) do p.param:uniform(-0.6, 0.6) end
  quant.prepare(gru, cfg)
  quant.calibrate(gru, { qgru.zeros({ T, N, C }):uniform(-1.5, 1.5), qgru.zeros({ T, N, C }):uniform(-1.5, 1.5) },
                  { method = "minmax", passes = 2 })
  if edit then edit(gru) end
  gru:training()
  return gru
end

local function rRh20()
  local oc = {}
  for _, op in ipairs(quant.OPS) do oc[op] = { bitwidth = 8 } end
  oc["op.rRh"] = { bitwidth = 20, is_symmetric = false }
  return quant.fromTable(qgru.json.decode(qgru.json.encode({ GRU_config = { operator_config = oc } })), "rRh20")
end

local CASES = {
  { name = "8-bit (byte GEMMs where the CPU has VNNI)", cfg = function() return quant.uniform(8) end,
    paths = { [lib.QG_CELL_32_BYTES] = true, [lib.QG_CELL_32] = true } },
  { name = "8-bit activations, 12-bit weights (float32 GEMMs)", cfg = function() return quant.uniform(8, { weight_bits = 12 }) end,
    paths = { [lib.QG_CELL_32] = true } },
  { name = "16-bit (the general 64-bit cell)", cfg = function() return quant.uniform(16) end, paths = { [lib.QG_CELL_64] = true } },
  { name = "a 20-bit op.rRh (the general 128-bit cell)", cfg = rRh20, paths = { [lib.QG_CELL_128] = true } },
}

describe("integer GRU cell paths == independent Lua reference, bit for bit", function()
  for k, c in ipairs(CASES) do
    it(c.name, function()
      local gru = build(30 + k, c.cfg())
      local x = qgru.zeros({ T, N, C }):uniform(-1.5, 1.5)
      local h0 = qgru.zeros({ 2, N, H }):uniform(-0.8, 0.8)
      local y = gru:forward({ x, h0 })
      local out = {}
      for t = 1, T do out[t] = {} for n = 1, N do out[t][n] = {} end end
      for d = 0, 1 do
        local lq = gru.qstate.layers[d]
        local path = lib.qg_int_gru_cell_path(lq.handle)
        assert(c.paths[path], string.format("direction %d ran cell path %d", d, path))
        local A, Wq = ref_quantizers(lq)
        local F = R.layer(A, Wq, weights_of(gru, d), x:totable(), h0:totable()[d + 1], d == 1)
        local hq = lq.last.hq:totable()
        for s = 0, T do
          for n = 1, N do
            for i = 1, H do
              if hq[s + 1][n][i] ~= F.hq[s][n][i] then
                error(string.format("dir %d step %d row %d unit %d: C code %d, reference %d", d, s, n, i, hq[s + 1][n][i], F.hq[s][n][i]))
              end
            end
          end
        end
        for t = 1, T do for n = 1, N do for i = 1, H do out[t][n][d * H + i] = F.y[t][n][i] end end end
      end
      assert.are.same(U.flatten(out), U.flatten(y:totable()))
    end)
  end

  it("8-bit: the vectorized STE backward == float64 reference of section 4", function()
    local gru = build(41, quant.uniform(8))
    local x = qgru.zeros({ T, N, C }):uniform(-1.5, 1.5)
    local h0 = qgru.zeros({ 2, N, H }):uniform(-0.8, 0.8)
    gru:forward({ x, h0 })
    local G = qgru.zeros({ T, N, 2 * H }):uniform(-1, 1)
    gru:zeroGrad()
    local gin = gru:backward({ x, h0 }, G)
    local Gt = G:totable()
    local dx_ref
    for d = 0, 1 do
      local lq = gru.qstate.layers[d]
      local A, Wq = ref_quantizers(lq)
      local F = R.layer(A, Wq, weights_of(gru, d), x:totable(), h0:totable()[d + 1], d == 1)
      local dy = {}
      for t = 1, T do dy[t] = {} for n = 1, N do dy[t][n] = {} for i = 1, H do dy[t][n][i] = Gt[t][n][d * H + i] end end end
      local B = R.backward(F, dy)
      local g = gru.grads[0][d]
      for _, kk in ipairs({ { "W", "dW" }, { "R", "dR" }, { "bx", "dbx" }, { "br", "dbr" } }) do
        local err = U.rel_err(U.flatten(g[kk[1]]:totable()), U.flatten(B[kk[2]]))
        assert(err < 1e-4, string.format("dir %d %s: relative error %.3g", d, kk[1], err))
      end
      local err = U.rel_err(U.flatten(gin[2]:select(d + 1):totable()), U.flatten(B.dh0))
      assert(err < 1e-4, string.format("dir %d dh0: relative error %.3g", d, err))
      local flat = U.flatten(B.dx)
      if not dx_ref then dx_ref = flat else for i = 1, #flat do dx_ref[i] = dx_ref[i] + flat[i] end end
    end
    local err = U.rel_err(U.flatten(gin[1]:totable()), dx_ref)
    assert(err < 1e-4, string.format("dx: relative error %.3g", err))
  end)
end)

describe("integer GRU on 1, 2 and 3 threads", function()
  for _, c in ipairs({ { "8-bit", function() return quant.uniform(8) end }, { "16-bit", function() return quant.uniform(16) end } }) do
    it(c[1] .. ": the same codes, outputs and gradients, bit for bit (rows are split over threads)", function()
      local N7 = 37   -- three chunks of rows (16, 16, 5)
      local lengths = {}
      for n = 1, N7 do lengths[n] = (n * 7) % T + 1 end
      local results = {}
      for _, threads in ipairs({ 1, 2, 3 }) do
        qgru.setNumThreads(threads)
        local gru = build(51, c[2]())
        local x = qgru.zeros({ T, N7, C }):uniform(-1.5, 1.5)
        local h0 = qgru.zeros({ 2, N7, H }):uniform(-0.8, 0.8)
        local input = { x, h0, lengths = lengths }
        local y = gru:forward(input)
        local G = qgru.zeros({ T, N7, 2 * H }):uniform(-1, 1)
        gru:zeroGrad()
        local gin = gru:backward(input, G)
        local all = U.flatten(y:totable())
        U.flatten(gin[1]:totable(), all)
        U.flatten(gin[2]:totable(), all)
        for _, e in ipairs(gru:namedParameters()) do U.flatten(e.grad:totable(), all) end
        for d = 0, 1 do U.flatten(gru.qstate.layers[d].last.hq:totable(), all) end
        results[threads] = all
      end
      qgru.setNumThreads(2)
      for threads = 2, 3 do
        assert.are.equal(#results[1], #results[threads])
        for i = 1, #results[1] do
          if results[threads][i] ~= results[1][i] then
            error(string.format("%d threads: value %d is %.9g, one thread gives %.9g", threads, i, results[threads][i], results[1][i]))
          end
        end
      end
    end)
  end
end)
