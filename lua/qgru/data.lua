-- data.lua: datasets and batch iterators.
--   data.fashionMNIST(split, {dir=, limit=})  Fashion-MNIST from the Debian package's IDX .gz
--                                             files, each image's 28 rows as a sequence (T=28,
--                                             C=28), normalized with the training set's mean/std
--   data.Dataset(x, y)                        x [n, T, C] f32, y [n] i64 (or [n, k] f32)
--   ds:batches(bs, {shuffle=, seed=, epoch=, start=, drop_last=})
--                                             yields x [T, bs, C] time-major and y [bs];
--                                             the order is a pure function of (seed, epoch)
--   data.idx(path), data.npy(path), data.saveNpy(path, t)
--   data.adding(n, T, seed)                   the adding problem (regression, for quick tests)
local class = require("qgru.class")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")

local ffi, lib, check = clib.ffi, clib.lib, clib.check

local data = {}

local out_buf = ffi.new("qg_tensor*[1]")

-- Unknown option names are errors (a typo must not be ignored silently).
local function check_opts(fn, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then error("qgru: " .. fn .. ": options must be a table, got " .. type(opts), 3) end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do names[#names + 1] = a end
      table.sort(names)
      error(string.format("qgru: %s: unknown option '%s' (%s)", fn, tostring(k), table.concat(names, ", ")), 3)
    end
  end
  return opts
end

-- Warnings about loaded data (replaceable, e.g. by a test).
data.warn = function(msg) io.stderr:write(msg, "\n") end

function data.idx(path)
  if type(path) ~= "string" then error("qgru: data.idx: expected a file path, got " .. type(path), 2) end
  local ctx = clib.context("cpu")
  check(ctx, lib.qg_idx_load(ctx, out_buf, path))
  return Tensor.adopt(out_buf[0])
end

-- A .npy file as a tensor; NaN or Inf values are reported (data.warn) with the file's name.
function data.npy(path)
  if type(path) ~= "string" then error("qgru: data.npy: expected a file path, got " .. type(path), 2) end
  local ctx = clib.context("cpu")
  check(ctx, lib.qg_npy_load(ctx, out_buf, path))
  local t = Tensor.adopt(out_buf[0])
  local n, first = t:countNonFinite()
  if n > 0 then
    data.warn(string.format("qgru: warning: %s: %d non-finite value%s (first at element %d)", path, n, n == 1 and "" or "s", first))
  end
  return t
end

-- Saves t (any device: a CUDA tensor is copied to the host first) as a .npy file.
function data.saveNpy(path, t)
  if t:device() ~= "cpu" then t = t:to("cpu") end
  local ctx = clib.context("cpu")
  check(ctx, lib.qg_npy_save(ctx, path, t.t))
end

-- ---- Dataset ----
local Dataset = class("data.Dataset")
data.Dataset = Dataset

function Dataset:__init(x, y, name)
  if x:size(1) ~= y:size(1) then
    error(string.format("qgru: data.Dataset: x has %d samples but y has %d", x:size(1), y:size(1)), 3)
  end
  if x:dim() ~= 3 then error("qgru: data.Dataset: x must be [n, T, C], got " .. Tensor.shape_str(x:shape()), 3) end
  self.x, self.y, self.name = x, y, name or "dataset"
  self.n = x:size(1)
end

function Dataset:size() return self.n end

function Dataset:numBatches(bs, drop_last)
  return drop_last and math.floor(self.n / bs) or math.ceil(self.n / bs)
end

-- Iterates batches of a (seed, epoch)-determined order, starting at batch index opts.start
-- (0-based; resume uses it). The yielded tensors are reused from batch to batch.
function Dataset:batches(bs, opts)
  opts = check_opts("batches", opts, { shuffle = true, seed = true, epoch = true, start = true, drop_last = true })
  if type(bs) ~= "number" or bs < 1 or bs % 1 ~= 0 then error("qgru: batches: batch size must be a positive integer, got " .. tostring(bs), 2) end
  local n, T, C = self.n, self.x:size(2), self.x:size(3)
  local order = Tensor.new({ n }, "i64")
  if opts.shuffle then
    local ctx = clib.context("cpu")
    -- The order depends on (seed, epoch) only: resuming mid-epoch rebuilds the same order.
    check(ctx, lib.qg_randperm(ctx, order.t, (opts.seed or 0) * 1000003 + (opts.epoch or 1)))
  else
    local p = order:ptr()
    for i = 0, n - 1 do p[i] = i end
  end
  local nb = self:numBatches(bs, opts.drop_last)
  local b = opts.start or 0
  local cache = {}
  local ydims = self.y:shape()
  return function()
    if b >= nb then return nil end
    local first = b * bs
    local count = math.min(bs, n - first)
    b = b + 1
    local c = cache[count]
    if not c then
      local ys = { count, unpack(ydims, 2) }
      c = { idx = Tensor.new({ count }, "i64"), xb = Tensor.new({ count, T, C }, self.x:dtype()),
            xt = Tensor.new({ T, count, C }, self.x:dtype()), yb = Tensor.new(ys, self.y:dtype()) }
      cache[count] = c
    end
    c.idx:copy(order:narrow(first + 1, count))
    self.x:index(c.idx, c.xb)
    c.xb:transpose01(c.xt)
    self.y:index(c.idx, c.yb)
    return c.xt, c.yb, b
  end
end

-- ---- Fashion-MNIST ----
local FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530   -- training-set pixel statistics (of x / 255)
local FMNIST_FILES = {
  train = { "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz" },
  test = { "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz" },
}

function data.fashionMNISTDir()
  return os.getenv("QGRU_FASHION_MNIST") or "/usr/share/datasets/fashion-mnist"
end

function data.fashionMNIST(split, opts)
  opts = check_opts("data.fashionMNIST", opts, { dir = true, limit = true })
  if opts.limit ~= nil and (type(opts.limit) ~= "number" or opts.limit % 1 ~= 0 or opts.limit < 1) then
    error("qgru: data.fashionMNIST: limit must be a positive integer, got " .. tostring(opts.limit), 2)
  end
  if opts.dir ~= nil and type(opts.dir) ~= "string" then error("qgru: data.fashionMNIST: dir must be a string, got " .. type(opts.dir), 2) end
  local files = FMNIST_FILES[split]
  if not files then error("qgru: data.fashionMNIST: split must be 'train' or 'test', got " .. tostring(split), 2) end
  local dir = opts.dir or data.fashionMNISTDir()
  local images = data.idx(dir .. "/" .. files[1])
  local labels = data.idx(dir .. "/" .. files[2])
  if images:dim() ~= 3 or images:size(2) ~= 28 or images:size(3) ~= 28 or labels:dim() ~= 1 or images:size(1) ~= labels:size(1) then
    error(string.format("qgru: data.fashionMNIST: unexpected shapes %s and %s in %s", Tensor.shape_str(images:shape()),
                        Tensor.shape_str(labels:shape()), dir), 2)
  end
  local n = images:size(1)
  if opts.limit and opts.limit < n then
    n = opts.limit
    images, labels = images:narrow(1, n), labels:narrow(1, n)
  end
  local x = Tensor.new({ n, 28, 28 }, "f32"):copy(images)
  local p, a, b = x:ptr(), 1 / (255 * FMNIST_STD), -FMNIST_MEAN / FMNIST_STD
  for i = 0, x:numel() - 1 do p[i] = p[i] * a + b end
  local y = Tensor.new({ n }, "i64"):copy(labels)
  return Dataset.new(x, y, "fashion-mnist/" .. split)
end

-- ---- synthetic: the adding problem (Hochreiter & Schmidhuber) ----
-- x [n, T, 2]: channel 1 uniform [0, 1), channel 2 marks two positions; y [n, 1] = sum of the
-- two marked values.
function data.adding(n, T, seed)
  local saved = ffi.new("uint64_t[4]")
  local ctx = clib.context("cpu")
  check(ctx, lib.qg_rng_get_state(ctx, saved))
  check(ctx, lib.qg_rng_seed(ctx, seed or 1))
  local x = Tensor.new({ n, T, 2 }, "f32")
  local vals = Tensor.new({ n, T }, "f64"):uniform(0, 1)
  local picks = Tensor.new({ n, 2 }, "f64"):uniform(0, 1)
  check(ctx, lib.qg_rng_set_state(ctx, saved))
  local y = Tensor.new({ n, 1 }, "f32")
  local xp, vp, pp, yp = x:ptr(), vals:ptr(), picks:ptr(), y:ptr()
  local half = math.floor(T / 2)
  for i = 0, n - 1 do
    local a = math.floor(pp[2 * i] * half)
    local b = half + math.floor(pp[2 * i + 1] * (T - half))
    local s = 0
    for t = 0, T - 1 do
      xp[(i * T + t) * 2] = vp[i * T + t]
      if t == a or t == b then xp[(i * T + t) * 2 + 1] = 1; s = s + vp[i * T + t] end
    end
    yp[i] = s
  end
  return Dataset.new(x, y, "adding")
end

return data
