-- nn/linear.lua: y = x W^T + b with W [out, in] and b [out] (PyTorch's layout and init).
-- Input [N, in] or [T, N, in] (leading dims are flattened); output has the same leading dims.
--   nn.Linear(in, out, {bias = true, device = qgru.device()})
local class = require("qgru.class")
local clib = require("qgru.clib")
local Module = require("qgru.nn.module")
local Tensor = require("qgru.tensor")

local lib = clib.lib

local Linear = class("nn.Linear", Module)

function Linear:__init(inputSize, outputSize, opts)
  Module.__init(self)
  opts = opts or {}
  for _, v in ipairs({ inputSize, outputSize }) do
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
      error("qgru: nn.Linear: sizes must be positive integers, got " .. tostring(inputSize) .. ", " .. tostring(outputSize), 2)
    end
  end
  self.inputSize, self.outputSize = inputSize, outputSize
  -- built and initialised on the cpu, then moved (the same model on every device)
  self.weight = Tensor.new({ outputSize, inputSize }, "f32", "cpu")
  self.gradWeight = Tensor.new({ outputSize, inputSize }, "f32", "cpu")
  if opts.bias ~= false then
    self.bias = Tensor.new({ outputSize }, "f32", "cpu")
    self.gradBias = Tensor.new({ outputSize }, "f32", "cpu")
  end
  self:reset()
  local device = opts.device or Module.defaultDevice()
  if device ~= "cpu" then self:to(device) end
end

-- PyTorch's default: uniform in [-1/sqrt(in), 1/sqrt(in)) for weight and bias.
function Linear:reset()
  local k = 1 / math.sqrt(self.inputSize)
  self.weight:uniform(-k, k)
  if self.bias then self.bias:uniform(-k, k) end
  return self
end

function Linear:namedParameters()
  local out = { { name = "weight", param = self.weight, grad = self.gradWeight } }
  if self.bias then out[2] = { name = "bias", param = self.bias, grad = self.gradBias } end
  return out
end

function Linear:_replaceParameter(name, param, grad)
  if name == "weight" then self.weight, self.gradWeight = param, grad else self.bias, self.gradBias = param, grad end
end

-- The input as a 2-D [rows, in] view.
function Linear:_flat(x, what)
  if type(x) ~= "table" or getmetatable(x) ~= Tensor then self:fail("%s must be a qgru.Tensor, got %s", what, type(x)) end
  local s = x:shape()
  if x:dtype() ~= "f32" then self:fail("%s dtype: expected f32, got %s", what, x:dtype()) end
  if (#s ~= 2 and #s ~= 3) or s[#s] ~= self.inputSize then
    self:fail("%s shape: expected [N, %d] or [T, N, %d], got %s", what, self.inputSize, self.inputSize, Tensor.shape_str(s))
  end
  local rows = x:numel() / self.inputSize
  return #s == 2 and x or x:view({ rows, self.inputSize }), s, rows
end

function Linear:updateOutput(input)
  local x, s, rows = self:_flat(input, "input")
  local os = { unpack(s) }
  os[#os] = self.outputSize
  self.output = self:buffer("_out", os, input:device())
  local y = #os == 2 and self.output or self.output:view({ rows, self.outputSize })
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_linear_forward(ctx, y.t, x.t, self.weight.t, self.bias and self.bias.t or nil))
  return self.output
end

function Linear:_gradOutput2d(input, gradOutput, rows)
  local want = input:shape()
  want[#want] = self.outputSize
  self:checkInput(gradOutput, want, nil, "gradOutput")
  return #want == 2 and gradOutput or gradOutput:view({ rows, self.outputSize })
end

function Linear:updateGradInput(input, gradOutput)
  local x, s, rows = self:_flat(input, "input")
  local dy = self:_gradOutput2d(input, gradOutput, rows)
  self.gradInput = self:buffer("_gin", s, input:device())
  local dx = #s == 2 and self.gradInput or self.gradInput:view({ rows, self.inputSize })
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_linear_backward(ctx, dx.t, nil, nil, dy.t, x.t, self.weight.t))
  return self.gradInput
end

function Linear:accGradParameters(input, gradOutput, scale)
  local x, _, rows = self:_flat(input, "input")
  local dy = self:_gradOutput2d(input, gradOutput, rows)
  if scale and scale ~= 1 then
    dy = self:buffer("_dy_scaled", dy:shape(), dy:device()):copy(dy):mul(scale)
  end
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_linear_backward(ctx, nil, self.gradWeight.t, self.bias and self.gradBias.t or nil, dy.t, x.t, self.weight.t))
end

function Linear:clearState()
  self._out, self._gin, self._dy_scaled = nil, nil, nil
  return Module.clearState(self)
end

function Linear:__tostring()
  return string.format("nn.Linear(%d -> %d%s)  -- %d parameters", self.inputSize, self.outputSize,
                       self.bias and "" or ", no bias", self:numParameters())
end

return Linear
