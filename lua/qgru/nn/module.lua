-- nn/module.lua: the Module contract (Torch7's nn): updateOutput, updateGradInput and
-- accGradParameters, wrapped by forward and backward. Gradients accumulate; zeroGrad clears them.
-- Parameters are listed by name (namedParameters), so optimizers, checkpoints and the quantizer
-- see the same names. Every module knows its path in the model tree for error messages.
--
-- Devices. New modules are built on Module.defaultDevice() (qgru.setDevice sets it) unless their
-- opts.device says otherwise; they are initialised on the CPU (the CPU context's RNG, the one
-- checkpoints save) and then moved, so a model is the same on every device. model:to(device)
-- moves every tensor the model holds: the parameter and gradient arenas (one copy each),
-- buffers and outputs (views stay views of the moved memory), and the quantization state of
-- modules that have one (self.qstate:to(device)). The optimizer follows on its next step.
--
-- The parameter arena. model:arena() puts all parameters of the model into ONE contiguous f32
-- tensor (arena.params [P]) and all gradients into another (arena.grads [P]); every parameter
-- (and gradient) becomes a view of its slice, in namedParameters order, names unchanged (the
-- modules' _replaceParameter installs the views). arena.offsets (i64 [K + 1], cpu) gives the
-- slices; arena.entries lists {name, param, grad, offset, numel}. The arena is built when an
-- optimizer is created for the model and when the model is moved with :to; it stays valid as long
-- as namedParameters returns exactly its views (model:arena() checks that and rebuilds, copying
-- the values, when a parameter was replaced or added). While it is valid, zeroGrad is one fill
-- of arena.grads, and the optimizers update the whole model with one fused C call
-- (qg_adam_arena_step / qg_sgd_arena_step) whose state tensors are arenas of the same layout.
-- Tensors taken from a module before its arena was built still point at the old memory: take
-- parameters from namedParameters (or the module's fields) after creating the optimizer.
local class = require("qgru.class")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")

local Module = class("nn.Module")

function Module:__init()
  self.output = nil
  self.gradInput = nil
  self.train = true
  self._path = nil
end

function Module:path() return self._path or self.__name end
function Module:setPath(p) self._path = p end

-- Raises an error that names the module path; level counts from the caller of fail.
function Module:fail(fmt, ...)
  error("qgru: " .. self:path() .. ": " .. string.format(fmt, ...), 0)
end

-- Turns a failing C status into an error naming this module and the C function's message.
function Module:ccall(ctx, status)
  if status ~= clib.lib.QG_OK then self:fail("%s", clib.ffi.string(clib.lib.qg_last_error(ctx))) end
end

-- Checks an input tensor's dtype and shape. shape may contain false for "any size"; names
-- label the dims in the message, e.g. {"T", "N", "C"}.
function Module:checkInput(x, shape, names, what)
  what = what or "input"
  if type(x) ~= "table" or getmetatable(x) ~= Tensor then
    self:fail("%s must be a qgru.Tensor, got %s", what, type(x))
  end
  if x:dtype() ~= "f32" then self:fail("%s dtype: expected f32, got %s", what, x:dtype()) end
  local got = x:shape()
  local ok = #got == #shape
  for i = 1, #shape do if ok and shape[i] and got[i] ~= shape[i] then ok = false end end
  if not ok then
    local want = {}
    for i = 1, #shape do want[i] = shape[i] and tostring(shape[i]) or (names and names[i] or "*") end
    self:fail("%s shape: expected [%s], got %s", what, table.concat(want, ", "), Tensor.shape_str(got))
  end
  return got
end

function Module:updateOutput(input) error("qgru: " .. self:path() .. " does not implement updateOutput", 2) end
function Module:updateGradInput(input, gradOutput) error("qgru: " .. self:path() .. " does not implement updateGradInput", 2) end
function Module:accGradParameters(input, gradOutput, scale) end

function Module:forward(input) return self:updateOutput(input) end

function Module:backward(input, gradOutput, scale)
  scale = scale or 1
  self:updateGradInput(input, gradOutput)
  self:accGradParameters(input, gradOutput, scale)
  return self.gradInput
end

-- {{name=, param=, grad=}, ...} in a fixed order; names are relative to this module.
function Module:namedParameters() return {} end

function Module:parameters()
  local ps, gs = {}, {}
  for _, e in ipairs(self:namedParameters()) do ps[#ps + 1] = e.param; gs[#gs + 1] = e.grad end
  return ps, gs
end

function Module:numParameters()
  local n = 0
  for _, e in ipairs(self:namedParameters()) do n = n + e.param:numel() end
  return n
end

-- Default device of new modules (qgru.setDevice sets it; "cpu" at start).
local default_device = "cpu"
function Module.defaultDevice() return default_device end
function Module.setDefaultDevice(d)
  if d ~= "cpu" and d ~= "cuda" then error("qgru: nn.Module.setDefaultDevice: expected 'cpu' or 'cuda', got " .. tostring(d), 2) end
  default_device = d
end

-- The arena is valid when namedParameters lists exactly its views, in order.
local function arena_valid(a, list)
  if not a or #list ~= #a.entries then return false end
  for i, e in ipairs(list) do
    local ae = a.entries[i]
    if not rawequal(e.param, ae.param) or not rawequal(e.grad, ae.grad) or e.name ~= ae.name then return false end
  end
  return true
end

-- Builds the arena of list on device. When old (a valid arena) is given, its memory is copied in
-- one piece; otherwise every parameter and gradient is copied into its slice.
local function build_arena(self, list, device, old)
  local P, offsets, key = 0, Tensor.new({ #list + 1 }, "i64", "cpu"), {}
  local op = offsets:ptr()
  for i, e in ipairs(list) do
    if e.param:dtype() ~= "f32" or e.grad:dtype() ~= "f32" then
      self:fail("parameter %s: the arena holds f32 parameters, got %s", e.name, e.param:dtype())
    end
    op[i - 1] = P
    P = P + e.param:numel()
    key[i] = e.name .. ":" .. Tensor.shape_str(e.param:shape())
  end
  op[#list] = P
  local a = { params = Tensor.new({ P }, "f32", device), grads = Tensor.new({ P }, "f32", device), offsets = offsets,
              entries = {}, layout = table.concat(key, " "), numel = P }
  if old then a.params:copy(old.params); a.grads:copy(old.grads) end
  for i, e in ipairs(list) do
    local shape, off = e.param:shape(), tonumber(op[i - 1])
    local pv, gv = a.params:view(shape, off), a.grads:view(shape, off)
    if not old then pv:copy(e.param); gv:copy(e.grad) end
    local owner = e.module or self
    owner:_replaceParameter(e.local_name or e.name, pv, gv)
    if owner ~= self then owner._arena = nil end        -- a sub-module's own arena is superseded
    a.entries[i] = { name = e.name, param = pv, grad = gv, offset = off, numel = e.param:numel() }
  end
  self._arena = a
  return a
end

-- The model's parameter arena (see the header), built or rebuilt when needed, on the device of
-- the parameters (they must agree).
function Module:arena()
  local list = self:namedParameters()
  if arena_valid(self._arena, list) then return self._arena end
  if #list == 0 then self:fail("has no parameters (nothing to put in an arena)") end
  local device = list[1].param:device()
  for _, e in ipairs(list) do
    if e.param:device() ~= device or e.grad:device() ~= device then
      self:fail("parameter %s is on %s but %s is on %s: move the model with :to(device)", e.name, e.param:device(),
                list[1].name, device)
    end
  end
  return build_arena(self, list, device, nil)
end

-- The device of the model's parameters (the default device for a module without parameters).
function Module:device()
  local list = self:namedParameters()
  return list[1] and list[1].param:device() or default_device
end

function Module:zeroGrad()
  local list = self:namedParameters()
  if arena_valid(self._arena, list) then
    self._arena.grads:zero()                -- one fill for the whole model
  else
    for _, e in ipairs(list) do e.grad:zero() end
  end
  return self
end
Module.zeroGradParameters = Module.zeroGrad

function Module:training() self.train = true; return self end
function Module:evaluate() self.train = false; return self end

-- Moves a tensor to device, keeping views as views: memo maps every moved tensor and every moved
-- base (the tensor owning the memory) to its copy.
local function move_tensor(t, device, memo)
  if t.t == nil or t:device() == device then return t end
  if memo[t] then return memo[t] end
  local base = t._base
  local moved
  if base == nil then
    moved = t:to(device)
  else
    local nb = memo[base]
    if not nb then nb = base:to(device); memo[base] = nb end
    local ffi = clib.ffi
    local off = (ffi.cast("char*", t.t.data) - ffi.cast("char*", base.t.data)) / ffi.sizeof(clib.ctypes[t:dtype()])
    moved = nb:view(t:shape(), tonumber(off))
  end
  memo[t] = moved
  return moved
end

-- Moves the tensors held in the fields of a module (and in plain tables under them) to device;
-- sub-modules are walked too, class instances with a :to method (the quantization state) are
-- asked to move themselves, other objects are left alone.
local function move_fields(root, obj, device, memo, seen)
  if seen[obj] then return end
  seen[obj] = true
  for k, v in pairs(obj) do
    if type(v) == "table" then
      local mt = getmetatable(v)
      if mt == Tensor then
        local moved = move_tensor(v, device, memo)
        if moved ~= v then obj[k] = moved end
      elseif k == "_arena" then
        if obj ~= root then obj[k] = nil end       -- the root's arena is moved already; others are stale
      elseif mt == nil or (v.isInstanceOf and v:isInstanceOf(Module)) then
        move_fields(root, v, device, memo, seen)
      elseif rawget(mt, "__index") == mt and type(v.to) == "function" and not seen[v] then
        seen[v] = true
        v:to(device)                               -- e.g. the quantization state (qstate)
      end
    end
  end
end

-- Moves every tensor the module holds to device ("cpu" or "cuda"): parameters and gradients into
-- one arena on the device (one copy each when the arena is valid), then buffers, outputs and
-- quantization state. Returns self.
function Module:to(device)
  if not clib.devices[device] then
    self:fail("to: expected a device ('cpu' or 'cuda'), got %s", tostring(device))
  end
  local list = self:namedParameters()
  if #list > 0 then
    local old = arena_valid(self._arena, list) and self._arena or nil
    if not old or old.params:device() ~= device then build_arena(self, list, device, old) end
  end
  move_fields(self, self, device, {}, {})
  return self
end

function Module:_replaceParameter(name, param, grad)
  error("qgru: " .. self:path() .. " cannot move parameter " .. name, 2)
end

-- Drops buffers (outputs, saved activations) so they can be freed; they come back on use.
function Module:clearState()
  self.output, self.gradInput = nil, nil
  return self
end

-- A tensor buffer field of self with the given shape, re-created only when the shape or device
-- changes, so steady-state training allocates nothing.
function Module:buffer(field, shape, device, dtype)
  local b = self[field]
  if b and b.t ~= nil and b:sameShape(shape) and b:device() == device and b:dtype() == (dtype or "f32") then return b end
  b = Tensor.new(shape, dtype or "f32", device)
  self[field] = b
  return b
end

function Module:__tostring() return self.__name end

return Module
