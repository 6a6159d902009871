-- tensor_spec.lua: Tensor basics against hand-computed values, printing, ownership, the API
-- header contract, and (tagged gpu) CUDA memory: cpu <-> cuda copies. GPU tests are skipped with
-- a clear line where there is no CUDA device.
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local Tensor = qgru.Tensor

describe("Tensor", function()
  it("creates, views, copies and converts", function()
    local t = qgru.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    assert.are.same({ 2, 3 }, t:shape())
    assert.are.equal("f32", t:dtype())
    assert.are.equal("cpu", t:device())
    assert.are.same({ 4, 5, 6 }, t:select(2):totable())
    assert.are.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, t:transpose01():totable())
    assert.are.equal(91, t:sumsq())
    local v = t:narrow(2, 1)
    v:fill(7)
    assert.are.same({ { 1, 2, 3 }, { 7, 7, 7 } }, t:totable())   -- views share memory
    local i = t:to("i64")
    assert.are.equal("i64", i:dtype())
    assert.are.same({ { 1, 2, 3 }, { 7, 7, 7 } }, i:totable())
    assert.are.same({ 2, 0 }, qgru.tensor({ { 0, 1, 5 }, { 9, 2, 3 } }):argmax():totable())   -- 0-based
    local c = t:clone():add(2, t):mul(0.5)
    assert.are.same({ { 1.5, 3, 4.5 }, { 10.5, 10.5, 10.5 } }, c:totable())
  end)
  it("prints shape, dtype, device and truncated values", function()
    local s = tostring(qgru.zeros({ 10, 20 }))
    assert.is_truthy(s:find("qgru.Tensor [10, 20] f32 cpu", 1, true))
    assert.is_truthy(s:find("...", 1, true))
    assert.is_truthy(s:find("(10 rows)", 1, true))
  end)
  it("free() is idempotent and use after free is an error", function()
    local t = qgru.zeros({ 3 })
    t:free(); t:free()
    assert.raises_match(function() t:numel() end, "use after :free()")
    assert.are.equal("qgru.Tensor (freed)", tostring(t))
  end)
  -- totable ended in `return build(1)`: the tail call dropped the frame that held the receiver,
  -- so a temporary tensor (a host copy of a CUDA tensor, or any `Tensor.new(..):totable()`) could
  -- be collected while its last elements were still read through a raw pointer; they then came
  -- back as glibc's free-chunk size (6.3e-41 as a float for this shape). Sizes of tens of kB (not
  -- mmapped, not cached per thread) in a loop that lets the GC run: every element must be 7.
  it("totable and get of a temporary read its memory before it can be collected", function()
    local bad = 0
    for _ = 1, 200 do
      local t = Tensor.new({ 5, 17, 133 }, "f32"):fill(7):totable()
      for a = 1, 5 do for b = 1, 17 do for c = 1, 133 do if t[a][b][c] ~= 7 then bad = bad + 1 end end end end
      if Tensor.new({ 5, 17, 133 }, "f32"):fill(7):get(5, 17, 133) ~= 7 then bad = bad + 1 end
    end
    assert.are.equal(0, bad)
  end)
  it("same seed draws the same numbers; uniform stays in range", function()
    qgru.seed(5); local a = qgru.rand({ 1000 }):totable()
    qgru.seed(5); local b = qgru.rand({ 1000 }):totable()
    assert.are.same(a, b)
    for _, v in ipairs(a) do assert.is_true(v >= 0 and v < 1) end
    local n = qgru.randn({ 20000 })
    local mean = 0
    for _, v in ipairs(n:totable()) do mean = mean + v end
    mean = mean / 20000
    assert.is_true(math.abs(mean) < 0.05 and math.abs(n:sumsq() / 20000 - 1) < 0.05)
  end)
  it("the library's ABI matches the header and sizes agree", function()
    assert.are.equal(clib.lib.QGRU_ABI_VERSION, clib.lib.qgru_abi_version())
    assert.are.equal(4, clib.lib.qg_dtype_size(clib.lib.QG_F32))
    assert.are.equal(8, clib.lib.qg_dtype_size(clib.lib.QG_I64))
  end)
end)

describe("CUDA tensors #gpu", function()
  if skip_without_cuda(pending) then
    it("a cuda tensor without a device is a clear error", function()
      assert.raises_match(function() qgru.zeros({ 2 }, "f32", "cuda") end, "cannot create a cuda context")
    end)
    return
  end
  it("copies cpu -> cuda -> cpu exactly, for every dtype", function()
    for _, dt in ipairs({ "f32", "f64", "i8", "u8", "i16", "i32", "i64" }) do
      local a = qgru.tensor({ { 1, 2, 3 }, { 4, 5, 126 } }, dt, "cpu")
      local g = a:to("cuda")
      assert.are.equal("cuda", g:device())
      local g2 = g:clone()                         -- device to device
      assert.are.same(a:totable(), g2:to("cpu"):totable())
    end
  end)
  it("fill, zero, views and random init on the device match the host", function()
    local g = qgru.zeros({ 4, 5 }, "f32", "cuda"):fill(2.5)
    assert.are.same({ 2.5, 2.5, 2.5, 2.5, 2.5 }, g:select(3):to("cpu"):totable())
    qgru.seed(9); local c = qgru.rand({ 100 }, "f32", "cpu"):totable()
    qgru.seed(9); local d = qgru.rand({ 100 }, "f32", "cuda"):to("cpu"):totable()
    assert.are.same(c, d)
  end)
  it("model:to('cuda') moves parameters and the forward runs there, with the CPU's result", function()
    qgru.seed(4)
    local m = qgru.nn.Sequential():add(qgru.nn.GRU(3, 4, { device = "cpu" })):add(qgru.nn.Last()):add(qgru.nn.Linear(4, 2, { device = "cpu" }))
    local x = qgru.zeros({ 2, 2, 3 }, "f32", "cpu"):uniform(-1, 1)
    local want = m:forward(x):totable()
    m:to("cuda")
    assert.are.equal("cuda", m.modules[1].weights[0][0].W:device())
    local got = m:forward(x:to("cuda"))
    assert.are.equal("cuda", got:device())
    got = got:to("cpu"):totable()
    for i = 1, 2 do for j = 1, 2 do
      assert.is_true(math.abs(got[i][j] - want[i][j]) <= 1e-5 * (1 + math.abs(want[i][j])), string.format("[%d][%d] %.9g vs %.9g", i, j, got[i][j], want[i][j]))
    end end
  end)

end)
