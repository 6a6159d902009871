-- data_spec.lua: the IDX reader on the real Fashion-MNIST files (Debian's dataset-fashion-mnist),
-- the .npy reader and writer, the batch iterator, and bad files.
local qgru = require("qgru")
local U = require("testutil")
local data = qgru.data

local dir = data.fashionMNISTDir()

describe("IDX loader on the real Fashion-MNIST files", function()
  it("reads the test labels: 10000 of them, the first ones as published", function()
    local y = data.idx(dir .. "/t10k-labels-idx1-ubyte.gz")
    assert.are.same({ 10000 }, y:shape())
    assert.are.equal("u8", y:dtype())
    -- The first test items are: ankle boot, pullover, trouser, trouser, shirt, trouser, coat, shirt.
    local first = {}
    for i = 1, 8 do first[i] = y:get(i) end
    assert.are.same({ 9, 2, 1, 1, 6, 1, 4, 6 }, first)
    local counts = {}
    local p = y:ptr()
    for i = 0, 9999 do counts[p[i]] = (counts[p[i]] or 0) + 1 end
    for c = 0, 9 do assert.are.equal(1000, counts[c]) end   -- the test set is balanced
  end)
  it("reads the training images: 60000 x 28 x 28, pixels 0..255, first label 9", function()
    local x = data.idx(dir .. "/train-images-idx3-ubyte.gz")
    assert.are.same({ 60000, 28, 28 }, x:shape())
    local p, lo, hi = x:ptr(), 255, 0
    for i = 0, x:numel() - 1 do local v = p[i]; if v < lo then lo = v end; if v > hi then hi = v end end
    assert.are.equal(0, lo)
    assert.are.equal(255, hi)
    local y = data.idx(dir .. "/train-labels-idx1-ubyte.gz")
    assert.are.same({ 60000 }, y:shape())
    assert.are.equal(9, y:get(1))
    assert.are.equal(0, y:get(2))
  end)
  it("builds normalized row sequences", function()
    local ds = data.fashionMNIST("test", { limit = 100 })
    assert.are.equal(100, ds.n)
    assert.are.same({ 100, 28, 28 }, ds.x:shape())
    local raw = data.idx(dir .. "/t10k-images-idx3-ubyte.gz")
    -- pixel (row 14, col 15) of image 1, normalized as (v / 255 - 0.2860) / 0.3530
    local v = raw:get(1, 14, 15)
    assert.is_true(math.abs(ds.x:get(1, 14, 15) - (v / 255 - 0.2860) / 0.3530) < 1e-5)
  end)
end)

describe("bad data files", function()
  it("missing file", function()
    assert.raises_match(function() data.idx("/no/such/file.gz") end, "cannot open '/no/such/file.gz'")
    assert.raises_match(function() data.fashionMNIST("train", { dir = "/nonexistent" }) end, "cannot open")
    assert.raises_match(function() data.fashionMNIST("validation") end, "split must be 'train' or 'test'")
  end)
  it("truncated and corrupt IDX", function()
    local p = U.tmpname(".idx")
    U.write_bytes(p, "\0\0\8\1\0\0\0\10" .. "12345")        -- promises 10 bytes, has 5
    assert.raises_match(function() data.idx(p) end, "truncated")
    U.write_bytes(p, "PK\3\4garbage")
    assert.raises_match(function() data.idx(p) end, "not an IDX file")
    U.write_bytes(p, "\0\0\8")
    assert.raises_match(function() data.idx(p) end, "too short")
    os.remove(p)
  end)
  it("npy round trip, and corrupt npy files", function()
    local p = U.tmpname(".npy")
    local t = qgru.tensor({ { 1.5, -2 }, { 3, 4.25 } })
    data.saveNpy(p, t)
    local back = data.npy(p)
    assert.are.same({ { 1.5, -2 }, { 3, 4.25 } }, back:totable())
    local bytes = U.read_bytes(p)
    U.write_bytes(p, bytes:sub(1, #bytes - 3))
    assert.raises_match(function() data.npy(p) end, "truncated")
    U.write_bytes(p, "\147NUMPY\1\0" .. string.char(#"{'descr': '>c16', 'fortran_order': False, 'shape': (2,), }", 0)
                  .. "{'descr': '>c16', 'fortran_order': False, 'shape': (2,), }")
    assert.raises_match(function() data.npy(p) end, "unsupported dtype '>c16'")
    U.write_bytes(p, "not numpy at all")
    assert.raises_match(function() data.npy(p) end, "not a .npy file")
    os.remove(p)
  end)
  it("reads an .npy file written by NumPy (little-endian <f4, shape (2, 3))", function()
    -- bytes as numpy.save writes them for np.arange(6, dtype='<f4').reshape(2, 3)
    local hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
    hdr = hdr .. string.rep(" ", 64 - 10 - #hdr - 1) .. "\n"
    local body = ""
    for _, b in ipairs({ "\0\0\0\0", "\0\0\128\63", "\0\0\0\64", "\0\0\64\64", "\0\0\128\64", "\0\0\160\64" }) do body = body .. b end
    local p = U.tmpname(".npy")
    U.write_bytes(p, "\147NUMPY\1\0" .. string.char(#hdr, 0) .. hdr .. body)
    assert.are.same({ { 0, 1, 2 }, { 3, 4, 5 } }, data.npy(p):totable())
    os.remove(p)
  end)
end)

describe("batch iterator", function()
  it("covers every sample once per epoch, time-major, in a (seed, epoch)-determined order", function()
    local ds = data.adding(10, 6, 3)
    local function order(seed, epoch, start)
      local seen = {}
      for x, y in ds:batches(4, { shuffle = true, seed = seed, epoch = epoch, start = start }) do
        assert.are.equal(6, x:size(1))
        assert.are.equal(2, x:size(3))
        for n = 1, x:size(2) do seen[#seen + 1] = y:get(n, 1) end
      end
      return seen
    end
    local a, b, c = order(1, 1), order(1, 1), order(1, 2)
    assert.are.equal(10, #a)
    assert.are.same(a, b)
    assert.are_not.same(a, c)
    -- starting at batch 1 gives the tail of the same order (resume)
    local tail = order(1, 1, 1)
    assert.are.same({ unpack(a, 5) }, tail)
  end)
  it("adding problem targets equal the sum of the two marked values", function()
    local ds = data.adding(5, 8, 7)
    for i = 1, 5 do
      local s, marks = 0, 0
      for t = 1, 8 do if ds.x:get(i, t, 2) == 1 then s = s + ds.x:get(i, t, 1); marks = marks + 1 end end
      assert.are.equal(2, marks)
      assert.is_true(math.abs(ds.y:get(i, 1) - s) < 1e-6)
    end
  end)
end)
