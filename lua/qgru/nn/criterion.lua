-- nn/criterion.lua: losses with the Criterion contract: forward(input, target) returns the loss
-- (a Lua number, the mean over the batch); backward(input, target) returns gradInput.
--   nn.CrossEntropy(): input logits [N, K] f32, target class indices i64 [N] (0-based);
--                      :countCorrect(logits, target) counts the rows classified right
--   nn.MSE():          input and target of the same shape, f32
local class = require("qgru.class")
local clib = require("qgru.clib")
local Module = require("qgru.nn.module")
local Tensor = require("qgru.tensor")

local ffi, lib = clib.ffi, clib.lib

local Criterion = class("nn.Criterion", Module)

function Criterion:forward(input, target) return self:updateOutput(input, target) end
function Criterion:backward(input, target) return self:updateGradInput(input, target) end

local loss_buf = ffi.new("double[1]")

local CrossEntropy = class("nn.CrossEntropy", Criterion)

function CrossEntropy:_check(input, target)
  local s = self:checkInput(input, { false, false }, { "N", "K" }, "logits")
  if type(target) ~= "table" or getmetatable(target) ~= Tensor then
    self:fail("target must be a qgru.Tensor of class indices, got %s", type(target))
  end
  if target:dtype() ~= "i64" then self:fail("target dtype: expected i64 class indices, got %s", target:dtype()) end
  if not target:sameShape({ s[1] }) then
    self:fail("target shape: expected [%d], got %s", s[1], Tensor.shape_str(target:shape()))
  end
  return s
end

function CrossEntropy:updateOutput(input, target)
  self:_check(input, target)
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_cross_entropy(ctx, loss_buf, nil, input.t, target.t, 1.0))
  self.output = Tensor.double(loss_buf)
  return self.output
end

function CrossEntropy:updateGradInput(input, target)
  local s = self:_check(input, target)
  self.gradInput = self:buffer("_gin", s, input:device())
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_cross_entropy(ctx, loss_buf, self.gradInput.t, input.t, target.t, 1.0))
  return self.gradInput
end

-- The number of rows of logits whose argmax (first on ties) is the target class, counted in C on
-- the tensors' device (qg_count_correct): accuracy without a per-row Lua loop.
local count_buf = ffi.new("int64_t[1]")
function CrossEntropy:countCorrect(input, target)
  self:_check(input, target)
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_count_correct(ctx, count_buf, input.t, target.t))
  return tonumber(count_buf[0])
end

function CrossEntropy:__tostring() return "nn.CrossEntropy()" end

local MSE = class("nn.MSE", Criterion)

function MSE:updateOutput(input, target)
  self:checkInput(input, input:shape(), nil, "input")
  self:checkInput(target, input:shape(), nil, "target")
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_mse(ctx, loss_buf, nil, input.t, target.t, 1.0))
  self.output = Tensor.double(loss_buf)
  return self.output
end

function MSE:updateGradInput(input, target)
  self:checkInput(target, input:shape(), nil, "target")
  self.gradInput = self:buffer("_gin", input:shape(), input:device())
  local ctx = clib.context(input:device())
  self:ccall(ctx, lib.qg_mse(ctx, loss_buf, self.gradInput.t, input.t, target.t, 1.0))
  return self.gradInput
end

function MSE:__tostring() return "nn.MSE()" end

return { Criterion = Criterion, CrossEntropy = CrossEntropy, MSE = MSE }
