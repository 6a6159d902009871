-- modules_spec.lua: module behaviour beyond gradients: batch_first equals time-major on the
-- transposed data, parameter names, printing, evaluate() saving nothing for backward, h_n.
local qgru = require("qgru")
local U = require("testutil")
local nn = qgru.nn

describe("nn modules", function()
  it("batch_first GRU and Last give the time-major results on transposed data", function()
    qgru.seed(4)
    local tm = nn.Sequential():add(nn.GRU(3, 5, { bidirectional = true })):add(nn.Last()):add(nn.Linear(10, 2))
    qgru.seed(4)
    local bf = nn.Sequential():add(nn.GRU(3, 5, { bidirectional = true, batch_first = true }))
      :add(nn.Last({ batch_first = true })):add(nn.Linear(10, 2))
    local x = qgru.zeros({ 6, 4, 3 }):uniform(-1, 1)
    local G = qgru.zeros({ 4, 2 }):uniform(-1, 1)
    local xb = x:transpose01()
    assert.are.same(tm:forward(x):totable(), bf:forward(xb):totable())
    tm:zeroGrad(); bf:zeroGrad()
    local gt, gb = tm:backward(x, G), bf:backward(xb, G)
    assert.are.same(gt:transpose01():totable(), gb:totable())
    assert.are.same(tm.modules[1].grads[0][1].R:totable(), bf.modules[1].grads[0][1].R:totable())
  end)
  it("names parameters by path, layer and direction", function()
    local m = nn.Sequential():add(nn.GRU(3, 4, { layers = 2, bidirectional = true })):add(nn.Linear(8, 2))
    local names = {}
    for _, p in ipairs(m:namedParameters()) do names[#names + 1] = p.name end
    assert.are.equal("1.l0.fwd.W", names[1])
    assert.are.equal("1.l1.bwd.br", names[16])
    assert.are.same({ "2.weight", "2.bias" }, { names[17], names[18] })
    -- 3H x C + 3H x H + 2 x 3H per layer and direction
    local expected = 2 * (12 * 3 + 12 * 4 + 24) + 2 * (12 * 8 + 12 * 4 + 24) + 8 * 2 + 2
    assert.are.equal(expected, m:numParameters())
  end)
  it("prints the model as a tree with parameter counts", function()
    local s = tostring(nn.Sequential():add(nn.GRU(28, 128)):add(nn.Last()):add(nn.Linear(128, 10)))
    assert.are.equal(table.concat({
      "nn.Sequential {  -- 61962 parameters",
      "  (1) nn.GRU(28 -> 128, layers=1)  -- 60672 parameters",
      "  (2) nn.Last()",
      "  (3) nn.Linear(128 -> 10)  -- 1290 parameters",
      "}" }, "\n"), s)
  end)
  it("h_n holds the last state of each layer and direction", function()
    qgru.seed(8)
    local g = nn.GRU(2, 3, { bidirectional = true })
    local x = qgru.zeros({ 4, 1, 2 }):uniform(-1, 1)
    local y = g:forward(x)
    -- forward direction ends at t = T, backward at t = 1
    local yl = y:select(4):totable()[1]
    assert.are.same({ yl[1], yl[2], yl[3] }, g.h_n:select(1):totable()[1])
    local yb = y:select(1):totable()[1]
    assert.are.same({ yb[4], yb[5], yb[6] }, g.h_n:select(2):totable()[1])
  end)
  it("initialises uniformly in +-1/sqrt(H), like PyTorch", function()
    qgru.seed(1)
    local g = nn.GRU(10, 16)
    local vals = U.flatten(g.weights[0][0].R:totable())
    local lo, hi = math.huge, -math.huge
    for _, v in ipairs(vals) do lo, hi = math.min(lo, v), math.max(hi, v) end
    assert.is_true(lo >= -0.25 and hi < 0.25 and lo < -0.23 and hi > 0.23)
  end)
end)
