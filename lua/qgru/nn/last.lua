-- nn/last.lua: selects the last time step of a time-major sequence: [T, N, H] -> [N, H]
-- (with batch_first = true: [N, T, H] -> [N, H]). The gradient flows only into that step.
local class = require("qgru.class")
local Module = require("qgru.nn.module")

local Last = class("nn.Last", Module)

function Last:__init(opts)
  Module.__init(self)
  self.batch_first = opts and opts.batch_first or false
end

function Last:updateOutput(input)
  local s = self:checkInput(input, { false, false, false }, self.batch_first and { "N", "T", "H" } or { "T", "N", "H" })
  if self.batch_first then
    self.output = self:buffer("_out", { s[1], s[3] }, input:device())
    local bt = self:buffer("_tm", { s[2], s[1], s[3] }, input:device())
    input:transpose01(bt)
    self.output:copy(bt:select(s[2]))
  else
    self.output = self:buffer("_out", { s[2], s[3] }, input:device())
    self.output:copy(input:select(s[1]))
  end
  return self.output
end

function Last:updateGradInput(input, gradOutput)
  local s = input:shape()
  local N, H = self.batch_first and s[1] or s[2], s[3]
  self:checkInput(gradOutput, { N, H }, nil, "gradOutput")
  self.gradInput = self:buffer("_gin", s, input:device())
  self.gradInput:zero()
  if self.batch_first then
    local bt = self:buffer("_gtm", { s[2], s[1], s[3] }, input:device()):zero()
    bt:select(s[2]):copy(gradOutput)
    bt:transpose01(self.gradInput)
  else
    self.gradInput:select(s[1]):copy(gradOutput)
  end
  return self.gradInput
end

function Last:clearState()
  self._out, self._gin, self._tm, self._gtm = nil, nil, nil, nil
  return Module.clearState(self)
end

function Last:__tostring() return "nn.Last()" end

return Last
