-- golden_spec.lua: qgru's GRU forward against a golden file made by PyTorch nn.GRU
-- (tests/gen_gru_golden.py: random weights, T=5, N=3, C=4, H=6, 2 layers, bidirectional, h0).
-- The weights are imported through qgru.importTorchGRU, so the PyTorch name mapping and the
-- r,z,n -> z,r,g gate reorder are checked too. Criterion: max abs error < 1e-5.
local qgru = require("qgru")
local U = require("testutil")
local serialize = qgru.serialize

local golden = "tests/data/gru_golden.safetensors"

describe("GRU forward vs the PyTorch nn.GRU golden file", function()
  it("matches y and h_n after importing the PyTorch state dict", function()
    local g = serialize.load(golden)
    local gru = qgru.nn.GRU(4, 6, { layers = 2, bidirectional = true })
    qgru.importTorchGRU(gru, golden)
    local y = gru:forward({ g.x, g.h0 })
    assert.are.same({ 5, 3, 12 }, y:shape())
    local err_y = U.max_abs_diff(U.flatten(y:totable()), U.flatten(g.y:totable()))
    local err_h = U.max_abs_diff(U.flatten(gru.h_n:totable()), U.flatten(g.h_n:totable()))
    assert(err_y < 1e-5, "y max abs error " .. err_y)
    assert(err_h < 1e-5, "h_n max abs error " .. err_h)
    -- the golden output is not trivially small (the comparison means something)
    local m = 0
    for _, v in ipairs(U.flatten(g.y:totable())) do m = math.max(m, math.abs(v)) end
    assert.is_true(m > 0.1)
  end)
  it("reorders the gates: importing without the reorder would not match", function()
    local g = serialize.load(golden)
    -- PyTorch's first row block of weight_ih_l0 is the reset gate r = qgru's second block.
    local gru = qgru.nn.GRU(4, 6, { layers = 2, bidirectional = true })
    qgru.importTorchGRU(gru, golden)
    local W = gru.weights[0][0].W
    local torchW = g.weight_ih_l0
    for j = 1, 4 do
      assert.are.equal(torchW:get(1, j), W:get(6 + 1, j))   -- r: torch row 1 -> qgru row 7
      assert.are.equal(torchW:get(6 + 1, j), W:get(1, j))   -- z: torch row 7 -> qgru row 1
      assert.are.equal(torchW:get(13, j), W:get(13, j))     -- n/g stays
    end
  end)
  it("rejects a state dict of another shape, leaving the GRU unchanged", function()
    qgru.seed(3)
    local gru = qgru.nn.GRU(4, 5, { layers = 2, bidirectional = true })
    local before = U.flatten(gru.weights[0][0].R:totable())
    assert.raises_match(function() qgru.importTorchGRU(gru, golden) end, "weight_hh_l0: file has f32 [18, 6], expected f32 [15, 5]")
    assert.are.same(before, U.flatten(gru.weights[0][0].R:totable()))
    local uni = qgru.nn.GRU(4, 6, { layers = 3 })
    assert.raises_match(function() qgru.importTorchGRU(uni, golden) end, "missing weight_ih_l2")
  end)
end)
