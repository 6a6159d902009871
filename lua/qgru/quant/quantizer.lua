-- quant/quantizer.lua: one quantizer: an operator of one GRU layer and direction (per tensor), or
-- a weight (per channel, 3H channels). It holds the configuration (bitwidth, symmetric, unsigned),
-- the calibrated or pinned parameters (exp2_inv e and zero_point z; tensors for per-channel), the
-- calibrated real range and method, and its state: fixed (sigmoid/tanh outputs), pinned (from the
-- config), frozen (calibration leaves it alone), calibrated.
-- Grids, fixed ranges and the rounding rule come from the C library (core/quant.c): nothing
-- here re-implements them. A quantizer of a C layer pushes every change to it (owner:push).
--
-- Per-channel parameters live in the host tensors q.exps and q.zps (i32 [channels]). Weight
-- quantizers that track their weights are derived by the C layer itself (on a GPU, on the
-- device, without waiting for it): the owner then marks the host tensors stale (:markDerived)
-- and :sync() pulls the layer's current values into them (owner:pull). Every reader in the
-- library (get, scale, print, setBitwidth, quant.state / export / exportWeights, moving the
-- model) syncs first, so it sees the values the next forward uses; code that reads q.exps or
-- q.zps directly calls q:sync() first (a no-op unless the layer changed them on a GPU).
local class = require("qgru.class")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")

local ffi, lib = clib.ffi, clib.lib
local Quantizer = class("quant.Quantizer")

local function grid(bits, uns)
  local ctx = clib.context("cpu")
  local lo, hi = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
  clib.check(ctx, lib.qg_quant_grid(ctx, bits, uns and 1 or 0, lo, hi), 3)
  return tonumber(lo[0]), tonumber(hi[0])
end
Quantizer.grid = grid

-- e, z of the fixed output ranges: sigmoid [0, 1), tanh [-1, 1).
local function fixed_params(kind, bits, uns)
  local ctx = clib.context("cpu")
  local e, z = ffi.new("int32_t[1]"), ffi.new("int32_t[1]")
  clib.check(ctx, lib.qg_fixed_range(ctx, e, z, kind == "sigmoid" and 0 or 1, bits, uns and 1 or 0), 3)
  return e[0], z[0]
end
Quantizer.fixed_params = fixed_params

-- opts: name, op, spec (normalized config entry), channels (per-channel count), owner (for invalidation)
function Quantizer:__init(opts)
  local s = opts.spec
  self.name, self.op, self.owner, self.slot = opts.name, opts.op, opts.owner, opts.slot
  self.bitwidth, self.is_symmetric, self.is_unsigned = s.bitwidth, s.is_symmetric, s.is_unsigned
  self.per_channel = s.per_channel and true or false
  self.channels = opts.channels or 1
  self.fixed = s.fixed and require("qgru.quant.config").FIXED[opts.op] or nil
  self.pinned, self.frozen, self.calibrated = false, false, false
  if self.per_channel then
    self.exps = Tensor.new({ self.channels }, "i32")
    self.zps = Tensor.new({ self.channels }, "i32")
  end
  if self.fixed then
    local e, z = fixed_params(self.fixed, self.bitwidth, self.is_unsigned)
    self:set(e, z, { method = "fixed" })
  end
  if s.exp2_inv ~= nil then
    self:set(s.exp2_inv, s.zero_point or 0, { method = "pinned" })
    self.pinned = true
  end
end

-- Pushes the current parameters to the owning C layer (which validates them).
function Quantizer:invalidate() if self.owner then self.owner:push(self) end end

-- The owning C layer has derived new per-channel parameters (maybe still on the device): the
-- host tensors are pulled from it when next read.
function Quantizer:markDerived() self._stale = true end

-- Pulls stale per-channel parameters from the owning layer (waits for its device then).
function Quantizer:sync()
  if self._stale then self.owner:pull(self) end
  return self
end

-- Sets e and z (numbers, or per-channel lists / numbers broadcast over the channels).
function Quantizer:set(e, z, info)
  info = info or {}
  local qmin, qmax = grid(self.bitwidth, self.is_unsigned)
  local function one(ev, zv, where)
    if type(ev) ~= "number" or ev % 1 ~= 0 or ev < -31 or ev > 31 then
      error(string.format("qgru: %s%s: exp2_inv must be an integer in -31..31, got %s", self.name, where, tostring(ev)), 4)
    end
    if type(zv) ~= "number" or zv % 1 ~= 0 or zv < qmin or zv > qmax then
      error(string.format("qgru: %s%s: zero_point must be an integer in [%d, %d], got %s", self.name, where, qmin, qmax, tostring(zv)), 4)
    end
  end
  if self.per_channel then
    local es = type(e) == "table" and e or nil
    local zs = type(z) == "table" and z or nil
    if (es and #es ~= self.channels) or (zs and #zs ~= self.channels) then
      error(string.format("qgru: %s: expected %d per-channel values, got %d", self.name, self.channels, es and #es or #zs), 3)
    end
    for c = 1, self.channels do one(es and es[c] or e, zs and zs[c] or z, "[" .. (c - 1) .. "]") end
    local ep, zp = self.exps:ptr(), self.zps:ptr()
    for c = 1, self.channels do ep[c - 1] = es and es[c] or e; zp[c - 1] = zs and zs[c] or z end
    self._stale = false
  else
    one(e, z, "")
    self.e, self.z = e, z
  end
  self.method = info.method or self.method
  if info.range then self.range = info.range end
  self.calibrated = true
  self:invalidate()
  return self
end

-- Per-tensor: e, z. Per-channel: lists.
function Quantizer:get()
  if not self.per_channel then return self.e, self.z end
  self:sync()
  local es, zs, ep, zp = {}, {}, self.exps:ptr(), self.zps:ptr()
  for c = 1, self.channels do es[c], zs[c] = ep[c - 1], zp[c - 1] end
  return es, zs
end

function Quantizer:ready() return self.calibrated end
function Quantizer:freeze() self.frozen = true; return self:sync() end
function Quantizer:unfreeze() self.frozen = false; return self end
function Quantizer:pin(e, z) self:set(e, z or 0, { method = "pinned" }); self.pinned = true; return self end
function Quantizer:unpin() self.pinned = false; return self end
-- Calibration may change it: not fixed (unless asked), pinned or frozen.
function Quantizer:calibratable() return not self.fixed and not self.pinned and not self.frozen end

function Quantizer:scale()
  if self.per_channel then
    local es = self:get()
    local s = {}
    for i, e in ipairs(es) do s[i] = 2 ^ -e end
    return s
  end
  return self.e and 2 ^ -self.e or nil
end

-- Changes the bitwidth keeping the real range: e grows by n - b, z scales by 2^(n - b)
-- (rounded half to even, clamped to the new grid).
function Quantizer:setBitwidth(n)
  if type(n) ~= "number" or n % 1 ~= 0 or n < 1 or n > 32 then
    error("qgru: " .. self.name .. ":setBitwidth: expected an integer 1..32, got " .. tostring(n), 2)
  end
  local d = n - self.bitwidth
  local was = self.calibrated
  local es, zs = self:get()
  self.bitwidth = n
  if not was then self:invalidate(); return self end
  local qmin, qmax = grid(n, self.is_unsigned)
  local function rz(z)
    return math.max(qmin, math.min(qmax, lib.qg_round_half_even(z * 2 ^ d)))
  end
  local function re(e) return math.max(-31, math.min(31, e + d)) end
  if self.per_channel then
    local ne, nz = {}, {}
    for c = 1, #es do ne[c], nz[c] = re(es[c]), rz(zs[c]) end
    self:set(ne, nz)
  else
    self:set(re(es), rz(zs))
  end
  return self
end

function Quantizer:__tostring()
  local kind = (self.is_unsigned and "u" or "i") .. self.bitwidth .. (self.is_symmetric and " sym" or " asym")
  local state = self.fixed and "fixed" or (self.pinned and "pinned" or (self.calibrated and (self.method or "set") or "uncalibrated"))
  if self.frozen then state = state .. ", frozen" end
  local ez = ""
  if self.calibrated then
    if self.per_channel then
      local es = self:get()
      local lo, hi = math.huge, -math.huge
      for _, e in ipairs(es) do lo, hi = math.min(lo, e), math.max(hi, e) end
      ez = string.format(" e=%d..%d", lo, hi)
    else
      ez = string.format(" e=%d z=%d", self.e, self.z)
    end
  end
  return string.format("%s: %s%s (%s)", self.name, kind, ez, state)
end

return Quantizer
