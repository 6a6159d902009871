-- gradcheck_spec.lua: analytic gradients of qgru's float32 kernels against central finite
-- differences of an independent float64 reference (tests/lua/testutil.lua). The loss is
-- sum(output .* G) for a fixed random G, so gradOutput = G. Criterion: max|a - r| / max|r| < 1e-4.
local qgru = require("qgru")
local U = require("testutil")
local nn = qgru.nn

local function params_of(gru)
  local P = {}
  for l = 0, gru.layers - 1 do
    P[l] = {}
    for d = 0, gru.dirs - 1 do
      local w = gru.weights[l][d]
      P[l][d] = { W = w.W:totable(), R = w.R:totable(), bx = w.bx:totable(), br = w.br:totable() }
    end
  end
  return P
end

local function check_gru(opts)
  local T, N, C, H, L = opts.T, opts.N, opts.C, opts.H, opts.layers
  qgru.seed(opts.seed)
  local gru = nn.GRU(C, H, { layers = L, bidirectional = opts.bidirectional })
  -- Larger weights than the default init, so the gates are away from their linear region.
  for _, p in ipairs(gru:namedParameters()) do p.param:uniform(-0.8, 0.8) end
  local D = gru.dirs
  local x = qgru.zeros({ T, N, C }):uniform(-1, 1)
  local h0 = opts.h0 and qgru.zeros({ L * D, N, H }):uniform(-0.9, 0.9) or nil
  local G = qgru.zeros({ T, N, D * H }):uniform(-1, 1)
  local input = h0 and { x, h0 } or x

  gru:zeroGrad()
  local y = gru:forward(input)
  local gin = gru:backward(input, G)

  -- float64 reference forward matches the float32 kernel
  local P, xt, h0t, Gf = params_of(gru), x:totable(), h0 and h0:totable() or nil, U.flatten(G:totable())
  local yref = U.gru(P, xt, h0t, L, D, H)
  assert.is_true(U.max_abs_diff(U.flatten(y:totable()), U.flatten(yref)) < 1e-5)

  local function loss() return U.dot(U.flatten((U.gru(P, xt, h0t, L, D, H))), Gf) end
  for l = 0, L - 1 do
    for d = 0, D - 1 do
      for _, name in ipairs({ "W", "R", "bx", "br" }) do
        local num = U.numgrad(loss, P[l][d][name])
        local ana = U.flatten(gru.grads[l][d][name]:totable())
        local err = U.rel_err(ana, num)
        assert(err < 1e-4, string.format("l%d.%d.%s: relative error %.3g", l, d, name, err))
      end
    end
  end
  local dx = h0 and gin[1] or gin
  local err = U.rel_err(U.flatten(dx:totable()), U.numgrad(loss, xt))
  assert(err < 1e-4, string.format("dx: relative error %.3g", err))
  if h0 then
    err = U.rel_err(U.flatten(gin[2]:totable()), U.numgrad(loss, h0t))
    assert(err < 1e-4, string.format("dh0: relative error %.3g", err))
  end
end

describe("GRU gradients vs float64 finite differences", function()
  it("one layer, forward only direction, no h0", function()
    check_gru({ T = 5, N = 2, C = 3, H = 4, layers = 1, bidirectional = false, h0 = false, seed = 11 })
  end)
  it("two layers, bidirectional, with h0", function()
    check_gru({ T = 4, N = 2, C = 3, H = 4, layers = 2, bidirectional = true, h0 = true, seed = 12 })
  end)
  it("three layers, unidirectional, with h0, batch of 3", function()
    check_gru({ T = 3, N = 3, C = 2, H = 3, layers = 3, bidirectional = false, h0 = true, seed = 13 })
  end)
  it("accumulates gradients over two backward calls", function()
    qgru.seed(5)
    local gru = nn.GRU(3, 4)
    local x, G = qgru.zeros({ 3, 2, 3 }):uniform(-1, 1), qgru.zeros({ 3, 2, 4 }):uniform(-1, 1)
    gru:zeroGrad(); gru:forward(x); gru:backward(x, G)
    local once = U.flatten(gru.grads[0][0].W:totable())
    gru:forward(x); gru:backward(x, G)
    local twice = U.flatten(gru.grads[0][0].W:totable())
    for i = 1, #once do assert.is_true(math.abs(twice[i] - 2 * once[i]) <= 1e-6 * math.max(1, math.abs(once[i]))) end
  end)
end)

describe("Linear gradients vs float64 finite differences", function()
  it("dW, db and dx for 2-D and 3-D inputs", function()
    for _, shape in ipairs({ { 4, 5 }, { 3, 2, 5 } }) do
      qgru.seed(21)
      local lin = nn.Linear(5, 3)
      local x = qgru.zeros(shape):uniform(-1, 1)
      local oshape = { unpack(shape) }
      oshape[#oshape] = 3
      local G = qgru.zeros(oshape):uniform(-1, 1)
      lin:zeroGrad()
      lin:forward(x)
      local gin = lin:backward(x, G)
      local W, b, xt, Gf = lin.weight:totable(), lin.bias:totable(), U.flatten(x:totable()), U.flatten(G:totable())
      local rows = #xt / 5
      local function loss()
        local s = 0
        for r = 0, rows - 1 do
          for o = 1, 3 do
            local v = b[o]
            for i = 1, 5 do v = v + W[o][i] * xt[r * 5 + i] end
            s = s + v * Gf[r * 3 + o]
          end
        end
        return s
      end
      assert.is_true(U.rel_err(U.flatten(lin.gradWeight:totable()), U.numgrad(loss, W)) < 1e-4)
      assert.is_true(U.rel_err(U.flatten(lin.gradBias:totable()), U.numgrad(loss, b)) < 1e-4)
      assert.is_true(U.rel_err(U.flatten(gin:totable()), U.numgrad(loss, xt)) < 1e-4)
    end
  end)
end)

describe("loss gradients vs float64 finite differences", function()
  it("cross-entropy with logits", function()
    qgru.seed(31)
    local logits = qgru.zeros({ 4, 5 }):uniform(-3, 3)
    local target = qgru.tensor({ 0, 4, 2, 2 }, "i64")
    local ce = nn.CrossEntropy()
    local loss = ce:forward(logits, target)
    local lt = logits:totable()
    local tt = { 0, 4, 2, 2 }
    assert.is_true(math.abs(loss - U.cross_entropy(lt, tt)) < 1e-6)
    local num = U.numgrad(function() return U.cross_entropy(lt, tt) end, lt)
    assert.is_true(U.rel_err(U.flatten(ce:backward(logits, target):totable()), num) < 1e-4)
  end)
  it("mean squared error", function()
    qgru.seed(32)
    local p, t = qgru.zeros({ 3, 4 }):uniform(-2, 2), qgru.zeros({ 3, 4 }):uniform(-2, 2)
    local mse = nn.MSE()
    local pt, tt = U.flatten(p:totable()), U.flatten(t:totable())
    assert.is_true(math.abs(mse:forward(p, t) - U.mse(pt, tt)) < 1e-6)
    local num = U.numgrad(function() return U.mse(pt, tt) end, pt)
    assert.is_true(U.rel_err(U.flatten(mse:backward(p, t):totable()), num) < 1e-4)
  end)
  it("the whole classifier: GRU -> Last -> Linear -> cross-entropy", function()
    qgru.seed(33)
    local model = nn.Sequential():add(nn.GRU(3, 4)):add(nn.Last()):add(nn.Linear(4, 3))
    local x, y = qgru.zeros({ 4, 2, 3 }):uniform(-1, 1), qgru.tensor({ 2, 0 }, "i64")
    local ce = nn.CrossEntropy()
    model:zeroGrad()
    local out = model:forward(x)
    ce:forward(out, y)
    model:backward(x, ce:backward(out, y))
    local gru, lin = model.modules[1], model.modules[3]
    local P, xt = params_of(gru), x:totable()
    local W, b = lin.weight:totable(), lin.bias:totable()
    local function loss()
      local yy = U.gru(P, xt, nil, 1, 1, 4)
      local last, logits = yy[#yy], {}
      for n = 1, 2 do
        logits[n] = {}
        for o = 1, 3 do
          local v = b[o]
          for i = 1, 4 do v = v + W[o][i] * last[n][i] end
          logits[n][o] = v
        end
      end
      return U.cross_entropy(logits, { 2, 0 })
    end
    assert.is_true(U.rel_err(U.flatten(gru.grads[0][0].R:totable()), U.numgrad(loss, P[0][0].R)) < 1e-4)
    assert.is_true(U.rel_err(U.flatten(lin.gradWeight:totable()), U.numgrad(loss, W)) < 1e-4)
    assert.is_true(U.rel_err(U.flatten(model.gradInput:totable()), U.numgrad(loss, xt)) < 1e-4)
  end)
end)
