-- nn/sequential.lua: a container that feeds each module's output to the next. Child i is named
-- "<i>" in parameter names (as PyTorch's nn.Sequential names them "0", "1", ... but 1-based)
-- and "Sequential[i]" in error paths.
local class = require("qgru.class")
local Module = require("qgru.nn.module")

local Sequential = class("nn.Sequential", Module)

function Sequential:__init()
  Module.__init(self)
  self.modules = {}
end

function Sequential:add(m)
  if type(m) ~= "table" or not m.isInstanceOf or not m:isInstanceOf(Module) then
    error("qgru: Sequential:add expects an nn module, got " .. tostring(m), 2)
  end
  self.modules[#self.modules + 1] = m
  self:setPath(self._path)
  return self
end

function Sequential:setPath(p)
  self._path = p
  for i, m in ipairs(self.modules) do m:setPath((p or self.__name) .. "[" .. i .. "]:" .. m.__name:gsub("^nn%.", "")) end
end

function Sequential:updateOutput(input)
  local x = input
  for _, m in ipairs(self.modules) do x = m:updateOutput(x) end
  self.output = x
  return x
end

function Sequential:updateGradInput(input, gradOutput)
  local g = gradOutput
  for i = #self.modules, 1, -1 do
    local prev = i > 1 and self.modules[i - 1].output or input
    g = self.modules[i]:updateGradInput(prev, g)
  end
  self.gradInput = g
  return g
end

function Sequential:accGradParameters(input, gradOutput, scale)
  local g = gradOutput
  for i = #self.modules, 1, -1 do
    local prev = i > 1 and self.modules[i - 1].output or input
    self.modules[i]:accGradParameters(prev, g, scale)
    g = self.modules[i].gradInput
  end
end

function Sequential:backward(input, gradOutput, scale)
  local g = gradOutput
  for i = #self.modules, 1, -1 do
    local prev = i > 1 and self.modules[i - 1].output or input
    g = self.modules[i]:backward(prev, g, scale)
  end
  self.gradInput = g
  return g
end

function Sequential:namedParameters()
  local out = {}
  for i, m in ipairs(self.modules) do
    for _, e in ipairs(m:namedParameters()) do
      out[#out + 1] = { name = i .. "." .. e.name, param = e.param, grad = e.grad, module = e.module or m, local_name = e.local_name or e.name }
    end
  end
  return out
end

function Sequential:training() Module.training(self); for _, m in ipairs(self.modules) do m:training() end; return self end
function Sequential:evaluate() Module.evaluate(self); for _, m in ipairs(self.modules) do m:evaluate() end; return self end
function Sequential:clearState() Module.clearState(self); for _, m in ipairs(self.modules) do m:clearState() end; return self end

-- Finds the modules of a class (e.g. nn.GRU), depth first.
function Sequential:findModules(cls, acc)
  acc = acc or {}
  for _, m in ipairs(self.modules) do
    if m:isInstanceOf(cls) then acc[#acc + 1] = m end
    if m.findModules then m:findModules(cls, acc) end
  end
  return acc
end

function Sequential:__tostring()
  local lines = { string.format("nn.Sequential {  -- %d parameters", self:numParameters()) }
  for i, m in ipairs(self.modules) do
    local s = tostring(m):gsub("\n", "\n    ")
    lines[#lines + 1] = string.format("  (%d) %s", i, s)
  end
  lines[#lines + 1] = "}"
  return table.concat(lines, "\n")
end

return Sequential
