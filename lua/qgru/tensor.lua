-- tensor.lua: the Tensor class, a Lua object owning one qg_tensor (ffi.gc + idempotent :free()).
-- Shapes are Lua tables ({2, 3}); dtypes and devices are strings ("f32", "cpu"). A view keeps a
-- reference to the tensor whose memory it uses, so the memory outlives the view.
local clib = require("qgru.clib")
local class = require("qgru.class")

local ffi, lib, check = clib.ffi, clib.lib, clib.check

local Tensor = class("qgru.Tensor")

local bit = require("bit")
local band, bor = bit.band, bit.bor

local dims_buf = ffi.new("int64_t[4]")

-- ---- floats crossing into Lua ----
-- LuaJIT keeps its own values in the NaN space of doubles (NaN tagging): a NaN with an odd
-- payload, read from an FFI float or double, can come back as a wrong value, nil, or crash the
-- process. Every float read here goes through these readers, which look at the bits first and
-- return the canonical NaN built in Lua for any NaN pattern. x ~= x is no test: the bad value
-- is already in a Lua slot by then.
local NAN = 0 / 0
local u32p = ffi.typeof("const uint32_t*")

local function read_f32(p, i)
  local b = ffi.cast(u32p, p)[i]
  if band(b, 0x7F800000) == 0x7F800000 and band(b, 0x007FFFFF) ~= 0 then return NAN end
  return tonumber(p[i])
end

local function read_f64(p, i)
  local w = ffi.cast(u32p, p)
  local hi, lo = w[2 * i + 1], w[2 * i]   -- little-endian
  if band(hi, 0x7FF00000) == 0x7FF00000 and bor(band(hi, 0x000FFFFF), lo) ~= 0 then return NAN end
  return tonumber(p[i])
end

local function read_int(p, i) return tonumber(p[i]) end

-- A reader read(p, i) for the values of a typed pointer of dtype dt (0-based i).
local function reader(dt)
  if dt == "f32" then return read_f32 elseif dt == "f64" then return read_f64 end
  return read_int
end
Tensor.readF32, Tensor.readF64, Tensor.reader = read_f32, read_f64, reader
-- The value of a double* (one element), NaN patterns canonicalised.
function Tensor.double(p) return read_f64(p, 0) end

-- A number as printed in tensors: nan, inf and -inf spelled out.
local function format_float(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" elseif v == -math.huge then return "-inf" end
  return string.format("%.4g", v)
end
Tensor.formatFloat = format_float
local out_buf = ffi.new("qg_tensor*[1]")

local function shape_str(shape)
  return "[" .. table.concat(shape, ", ") .. "]"
end
Tensor.shape_str = shape_str

local function wrap(ptr, base)
  local self = setmetatable({}, Tensor)
  self.t = ffi.gc(ptr, lib.qg_tensor_free)
  self._base = base
  return self
end

-- Tensor.new(shape, dtype, device): a zero-filled tensor. shape is a table of 1..4 sizes.
function Tensor.new(shape, dtype, device)
  dtype, device = dtype or "f32", device or "cpu"
  if type(shape) ~= "table" or #shape < 1 or #shape > 4 then
    error("qgru.Tensor: shape must be a table of 1..4 sizes, got " .. tostring(shape), 2)
  end
  local dt = clib.dtypes[dtype]
  if not dt then error("qgru.Tensor: unknown dtype '" .. tostring(dtype) .. "' (f32 f64 i8 u8 i16 i32 i64)", 2) end
  for i, d in ipairs(shape) do
    if type(d) ~= "number" or d < 0 or d % 1 ~= 0 then
      error("qgru.Tensor: size " .. i .. " of " .. shape_str(shape) .. " is not a non-negative integer", 2)
    end
    dims_buf[i - 1] = d
  end
  local ctx = clib.context(device)
  check(ctx, lib.qg_tensor_create(ctx, out_buf, dt, clib.devices[device], #shape, dims_buf))
  return wrap(out_buf[0])
end

-- Wraps a qg_tensor* produced by the C library (ownership passes to Lua).
function Tensor.adopt(ptr) return wrap(ptr) end

function Tensor:free()
  if self.t ~= nil then
    lib.qg_tensor_free(ffi.gc(self.t, nil))
    self.t = nil
  end
end

local function live(self)
  local t = self.t
  if t == nil then error("qgru.Tensor: use after :free()", 3) end
  return t
end

function Tensor:ctx() return clib.context(self:device()) end
function Tensor:cdata() return live(self) end
function Tensor:dtype() return clib.dtype_names[tonumber(live(self).dtype)] end
function Tensor:device() return clib.device_names[tonumber(live(self).device)] end
function Tensor:dim() return tonumber(live(self).ndim) end
function Tensor:numel() return tonumber(live(self).numel) end
function Tensor:size(i)
  local t = live(self)
  if i then return tonumber(t.dims[i - 1]) end
  return self:shape()
end
function Tensor:shape()
  local t, s = live(self), {}
  for i = 0, t.ndim - 1 do s[i + 1] = tonumber(t.dims[i]) end
  return s
end
function Tensor:sameShape(shape)
  local t = live(self)
  if #shape ~= t.ndim then return false end
  for i = 1, #shape do if shape[i] ~= tonumber(t.dims[i - 1]) then return false end end
  return true
end

-- A typed pointer to the data of a CPU tensor (for Lua loops; 0-based indexing).
-- Tensor.keepAlive(...): a use of the given tensors, nothing else. A tensor read or written through
-- a raw pointer (:ptr()) must stay alive until the last access: the pointer does not keep it, and
-- LuaJIT may collect a local after its last use (the JIT drops dead slots) or once a tail call has
-- replaced the frame that held it (`return build(1)` did: totable of a temporary host copy read
-- its last elements from freed memory, glibc's free-chunk size there). Call it after the last
-- access through the pointer. The use is a store into a module table (the JIT cannot drop it as
-- it could drop a pure function of the arguments, and the trace must keep the handle until then).
local keep_sink = { n = 0 }
function Tensor.keepAlive(...)
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if type(v) == "table" and v.t ~= nil then keep_sink.n = v.t.ndim end
  end
end

function Tensor:ptr()
  local t = live(self)
  if t.device ~= lib.QG_CPU then error("qgru.Tensor:ptr(): the tensor is on " .. self:device() .. "; call :to('cpu') first", 2) end
  return ffi.cast(clib.ctypes[self:dtype()] .. "*", t.data)
end

-- A view of count elements starting at offset with the given shape (shares memory).
function Tensor:view(shape, offset)
  local t = live(self)
  for i, d in ipairs(shape) do dims_buf[i - 1] = d end
  local ctx = self:ctx()
  check(ctx, lib.qg_tensor_view(ctx, out_buf, t, offset or 0, #shape, dims_buf))
  return wrap(out_buf[0], self._base or self)
end

-- Rows [first, first + count) along dim 0 (1-based first), as a view.
function Tensor:narrow(first, count)
  local s = self:shape()
  if first < 1 or count < 0 or first - 1 + count > s[1] then
    error(string.format("qgru.Tensor:narrow(%d, %d): out of range for dim 1 of size %d", first, count, s[1]), 2)
  end
  local row = self:numel() / math.max(s[1], 1)
  s[1] = count
  return self:view(s, (first - 1) * row)
end

-- Row i along dim 0 (1-based) with that dim dropped, as a view.
function Tensor:select(i)
  local s = self:shape()
  if #s < 2 then error("qgru.Tensor:select: needs a tensor of 2+ dims", 2) end
  local v = self:narrow(i, 1)
  table.remove(s, 1)
  return v:view(s)
end

function Tensor:copy(src)
  local ctx = clib.context(self:device() == "cuda" and "cuda" or src:device())
  check(ctx, lib.qg_copy(ctx, live(self), live(src)))
  return self
end

function Tensor:clone() return Tensor.new(self:shape(), self:dtype(), self:device()):copy(self) end

-- to("cuda"), to("cpu"), to("f64"): a converted copy, or self when nothing changes. A dtype
-- conversion runs on the tensor's own device (C casts, as qg_copy documents).
function Tensor:to(what)
  if clib.devices[what] then
    if what == self:device() then return self end
    return Tensor.new(self:shape(), self:dtype(), what):copy(self)
  elseif clib.dtypes[what] then
    if what == self:dtype() then return self end
    return Tensor.new(self:shape(), what, self:device()):copy(self)
  end
  error("qgru.Tensor:to: expected a device (cpu, cuda) or a dtype (f32 f64 i8 u8 i16 i32 i64), got " .. tostring(what), 2)
end

function Tensor:fill(v)
  local ctx = self:ctx()
  check(ctx, lib.qg_fill(ctx, live(self), v))
  return self
end
function Tensor:zero() return self:fill(0) end

function Tensor:uniform(lo, hi)
  local ctx = self:ctx()
  check(ctx, lib.qg_uniform(ctx, live(self), lo or 0, hi or 1))
  return self
end
function Tensor:normal(mean, std)
  local ctx = self:ctx()
  check(ctx, lib.qg_normal(ctx, live(self), mean or 0, std or 1))
  return self
end

-- self += alpha * x
function Tensor:add(alpha, x)
  if x == nil then alpha, x = 1, alpha end
  local ctx = self:ctx()
  check(ctx, lib.qg_axpy(ctx, live(self), alpha, live(x)))
  return self
end
function Tensor:mul(alpha)
  local ctx = self:ctx()
  check(ctx, lib.qg_scale(ctx, live(self), alpha))
  return self
end

local dbl = ffi.new("double[1]")
function Tensor:sumsq()
  local ctx = self:ctx()
  check(ctx, lib.qg_sum_squares(ctx, dbl, live(self)))
  return read_f64(dbl, 0)
end

-- Index of the largest value of each row of an [N, K] tensor, as an i64 [N] tensor (0-based) on
-- the tensor's device.
function Tensor:argmax()
  local out = Tensor.new({ self:size(1) }, "i64", self:device())
  local ctx = self:ctx()
  check(ctx, lib.qg_argmax_rows(ctx, out.t, live(self)))
  return out
end

-- Rows of self picked by an i64 index tensor (0-based), into out (created when nil).
function Tensor:index(idx, out)
  local s = self:shape()
  s[1] = idx:numel()
  out = out or Tensor.new(s, self:dtype(), self:device())
  local ctx = self:ctx()
  check(ctx, lib.qg_index_select(ctx, out.t, live(self), idx.t))
  return out
end

-- The first two dims swapped, into out (created when nil).
function Tensor:transpose01(out)
  local s = self:shape()
  s[1], s[2] = s[2], s[1]
  out = out or Tensor.new(s, self:dtype(), self:device())
  local ctx = self:ctx()
  check(ctx, lib.qg_transpose01(ctx, out.t, live(self)))
  return out
end

-- Element at 1-based indices (any device; a CUDA read copies one tensor to the host).
local function flat_index(self, ...)
  local n, s, idx = select("#", ...), self:shape(), 0
  if n ~= #s then error(string.format("qgru.Tensor: %d indices for a %d-dim tensor", n, #s), 3) end
  for i = 1, n do
    local v = select(i, ...)
    if type(v) ~= "number" or v % 1 ~= 0 then error(string.format("qgru.Tensor: index %d must be an integer, got %s", i, tostring(v)), 3) end
    if v < 1 or v > s[i] then error(string.format("qgru.Tensor: index %d is %d, outside 1..%d", i, v, s[i]), 3) end
    idx = idx * s[i] + (v - 1)
  end
  return idx
end
function Tensor:get(...)
  local src = self:device() == "cpu" and self or self:to("cpu")
  local v = reader(self:dtype())(src:ptr(), flat_index(self, ...))
  Tensor.keepAlive(src)   -- the host copy is read through a raw pointer: no tail call, see keepAlive
  return v
end
function Tensor:set(...)
  local n = select("#", ...)
  local v = select(n, ...)
  if self:device() ~= "cpu" then error("qgru.Tensor:set: only on cpu tensors", 2) end
  if type(v) ~= "number" then error("qgru.Tensor:set: the value must be a number, got " .. type(v), 2) end
  local idx = flat_index(self, unpack({ ... }, 1, n - 1))
  self:ptr()[idx] = v
  return self
end

-- Nested Lua tables of numbers.
function Tensor:totable()
  local src = self:device() == "cpu" and self or self:to("cpu")
  local p, s, read = src:ptr(), src:shape(), reader(src:dtype())
  local pos = 0
  local function build(d)
    local t = {}
    for i = 1, s[d] do
      if d == #s then t[i] = read(p, pos); pos = pos + 1 else t[i] = build(d + 1) end
    end
    return t
  end
  local out = build(1)
  Tensor.keepAlive(src, self)   -- not `return build(1)`: see keepAlive
  return out
end

-- Tensor.from(nested_table, dtype, device)
function Tensor.from(tbl, dtype, device)
  if type(tbl) ~= "table" then error("qgru.tensor: expected a (nested) table of numbers, got " .. type(tbl), 2) end
  local shape, t = {}, tbl
  while type(t) == "table" do shape[#shape + 1] = #t; t = t[1] end
  local out = Tensor.new(shape, dtype or "f32", "cpu")
  local p, pos = out:ptr(), 0
  local function fill(v, d, where)
    if d > #shape then
      if type(v) ~= "number" then error("qgru.tensor: element " .. where .. " is " .. type(v) .. ", not a number", 4) end
      p[pos] = v; pos = pos + 1
      return
    end
    if type(v) ~= "table" or #v ~= shape[d] then
      error(string.format("qgru.tensor: ragged table at %s (expected %d entries)", where, shape[d]), 4)
    end
    for i = 1, shape[d] do fill(v[i], d + 1, where .. "[" .. i .. "]") end
  end
  fill(tbl, 1, "t")
  return (device and device ~= "cpu") and out:to(device) or out
end

-- Non-finite values (NaN of any bit pattern, +-inf) of a float tensor: count, and the 1-based
-- flat index of the first one (nil when there is none). Integer tensors have none. Counted in C on
-- the tensor's device (qg_count_nonfinite): a CUDA tensor is not copied to the host.
local count_buf, first_buf = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
function Tensor:countNonFinite()
  local ctx = self:ctx()
  check(ctx, lib.qg_count_nonfinite(ctx, count_buf, first_buf, live(self)))
  local count = tonumber(count_buf[0])
  return count, count > 0 and tonumber(first_buf[0]) + 1 or nil
end

-- A printable summary: shape, dtype, device and up to 8 values per row, 6 rows.
function Tensor:__tostring()
  if self.t == nil then return "qgru.Tensor (freed)" end
  local s = self:shape()
  local head = string.format("qgru.Tensor %s %s %s", shape_str(s), self:dtype(), self:device())
  if self:numel() == 0 then return head end
  local cols = s[#s]
  local rows = self:numel() / cols
  -- the rows shown, as one copy of a prefix view for a CUDA tensor
  local src = self:device() == "cpu" and self or self:view({ math.min(rows, 6) * cols }, 0):to("cpu")
  local p = src:ptr()
  local isfloat = self:dtype() == "f32" or self:dtype() == "f64"
  local read = reader(self:dtype())
  local lines = { head }
  for r = 0, math.min(rows, 6) - 1 do
    local vals = {}
    for c = 0, math.min(cols, 8) - 1 do
      local v = read(p, r * cols + c)
      vals[#vals + 1] = isfloat and format_float(v) or tostring(v)
    end
    if cols > 8 then vals[#vals + 1] = "..." end
    lines[#lines + 1] = "  " .. table.concat(vals, " ")
  end
  if rows > 6 then lines[#lines + 1] = string.format("  ... (%d rows)", rows) end
  Tensor.keepAlive(src)   -- read through a raw pointer: see keepAlive
  return table.concat(lines, "\n")
end

return Tensor
