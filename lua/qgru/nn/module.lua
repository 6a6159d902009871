-- nn/module.lua: the Module contract (Torch7's nn): updateOutput, updateGradInput and
-- accGradParameters, wrapped by forward and backward. Gradients accumulate; zeroGrad clears them.
-- Parameters are listed by name (namedParameters), so optimizers, checkpoints and the quantizer
-- see the same names. Every module knows its path in the model tree for error messages.
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

function Module:zeroGrad()
  for _, e in ipairs(self:namedParameters()) do e.grad:zero() end
  return self
end
Module.zeroGradParameters = Module.zeroGrad

function Module:training() self.train = true; return self end
function Module:evaluate() self.train = false; return self end

-- Moves parameters and gradients to a device (buffers are re-created on the next forward).
function Module:to(device)
  for _, e in ipairs(self:namedParameters()) do
    if e.param:device() ~= device then
      self:_replaceParameter(e.name, e.param:to(device), e.grad:to(device))
    end
  end
  self:clearState()
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
