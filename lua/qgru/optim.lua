-- optim.lua: SGD and Adam / AdamW over a model's named parameters, with PyTorch's semantics
-- (so hyperparameters carry over) and optional global gradient-norm clipping.
--
--   local opt = optim.Adam(model, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--                                  weight_decay = 0, clip = nil})
--   opt:step()           -- one update from the accumulated gradients; returns the grad norm
--   opt.lr = 5e-4        -- learning rate schedules just set it
--   opt:state() / opt:loadState(s)   -- for checkpoints (tensors by parameter name + scalars)
local class = require("qgru.class")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")

local lib, check = clib.lib, clib.check

local optim = {}

local function check_opts(name, opts, allowed)
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do names[#names + 1] = a end
      table.sort(names)
      error(string.format("qgru: optim.%s: unknown option '%s' (allowed: %s)", name, tostring(k), table.concat(names, ", ")), 3)
    end
  end
end

local function number_opt(name, opts, key, default, lo)
  local v = opts[key]
  if v == nil then return default end
  if type(v) ~= "number" or v ~= v or (lo and v < lo) then
    error(string.format("qgru: optim.%s: %s must be a number%s, got %s", name, key, lo and (" >= " .. lo) or "", tostring(v)), 4)
  end
  return v
end

local function param_list(name, model)
  local params = model.namedParameters and model:namedParameters() or model
  if type(params) ~= "table" or #params == 0 then
    error("qgru: optim." .. name .. ": expected a model or a list of {name=, param=, grad=}, got no parameters", 3)
  end
  return params
end

-- Global L2 norm of all gradients (in double), and the factor that clips it to max_norm.
local function grad_norm_and_scale(params, max_norm)
  local ss = 0
  for _, p in ipairs(params) do ss = ss + p.grad:sumsq() end
  local norm = math.sqrt(ss)
  local scale = 1
  if max_norm and norm > max_norm then scale = max_norm / (norm + 1e-6) end
  return norm, scale
end

-- ---- Adam / AdamW ----
local Adam = class("optim.Adam")

function Adam:__init(model, opts, decoupled)
  opts = opts or {}
  local name = decoupled and "AdamW" or "Adam"
  check_opts(name, opts, { lr = true, betas = true, eps = true, weight_decay = true, clip = true })
  self.name = name
  self.params = param_list(name, model)
  self.lr = number_opt(name, opts, "lr", 1e-3, 0)
  local betas = opts.betas or { 0.9, 0.999 }
  if type(betas) ~= "table" or type(betas[1]) ~= "number" or type(betas[2]) ~= "number"
      or betas[1] < 0 or betas[1] >= 1 or betas[2] < 0 or betas[2] >= 1 then
    error("qgru: optim." .. name .. ": betas must be {b1, b2} in [0, 1)", 2)
  end
  self.beta1, self.beta2 = betas[1], betas[2]
  self.eps = number_opt(name, opts, "eps", 1e-8, 0)
  self.weight_decay = number_opt(name, opts, "weight_decay", decoupled and 1e-2 or 0, 0)
  self.clip = opts.clip and number_opt(name, opts, "clip", nil, 0) or nil
  self.decoupled = decoupled and 1 or 0
  self.t = 0
  self.m, self.v = {}, {}
  for i, p in ipairs(self.params) do
    self.m[i] = Tensor.new(p.param:shape(), "f32", p.param:device())
    self.v[i] = Tensor.new(p.param:shape(), "f32", p.param:device())
  end
end

function Adam:step()
  local norm, scale = grad_norm_and_scale(self.params, self.clip)
  self.t = self.t + 1
  for i, p in ipairs(self.params) do
    local ctx = p.param:ctx()
    check(ctx, lib.qg_adam_step(ctx, p.param.t, self.m[i].t, self.v[i].t, p.grad.t, self.lr, self.beta1, self.beta2,
                                self.eps, self.weight_decay, self.decoupled, self.t, scale))
  end
  return norm
end

function Adam:state()
  local tensors = {}
  for i, p in ipairs(self.params) do
    tensors["exp_avg." .. p.name] = self.m[i]
    tensors["exp_avg_sq." .. p.name] = self.v[i]
  end
  return { kind = self.name, tensors = tensors,
           scalars = { t = self.t, lr = self.lr, beta1 = self.beta1, beta2 = self.beta2, eps = self.eps,
                       weight_decay = self.weight_decay, clip = self.clip } }
end

function optim.Adam(model, opts) return Adam.new(model, opts, false) end
function optim.AdamW(model, opts) return Adam.new(model, opts, true) end

-- ---- SGD ----
local SGD = class("optim.SGD")

function SGD:__init(model, opts)
  opts = opts or {}
  check_opts("SGD", opts, { lr = true, momentum = true, dampening = true, weight_decay = true, nesterov = true, clip = true })
  self.name = "SGD"
  self.params = param_list("SGD", model)
  self.lr = number_opt("SGD", opts, "lr", 1e-2, 0)
  self.momentum = number_opt("SGD", opts, "momentum", 0, 0)
  self.dampening = number_opt("SGD", opts, "dampening", 0, 0)
  self.weight_decay = number_opt("SGD", opts, "weight_decay", 0, 0)
  self.nesterov = opts.nesterov and 1 or 0
  self.clip = opts.clip and number_opt("SGD", opts, "clip", nil, 0) or nil
  self.t = 0
  self.buf = {}
  if self.momentum ~= 0 then
    for i, p in ipairs(self.params) do self.buf[i] = Tensor.new(p.param:shape(), "f32", p.param:device()) end
  end
end

function SGD:step()
  local norm, scale = grad_norm_and_scale(self.params, self.clip)
  self.t = self.t + 1
  for i, p in ipairs(self.params) do
    local ctx = p.param:ctx()
    if scale ~= 1 then p.grad:mul(scale) end
    check(ctx, lib.qg_sgd_step(ctx, p.param.t, self.buf[i] and self.buf[i].t or nil, p.grad.t, self.lr, self.momentum,
                               self.dampening, self.weight_decay, self.nesterov, self.t == 1 and 1 or 0))
  end
  return norm
end

function SGD:state()
  local tensors = {}
  for i, p in ipairs(self.params) do
    if self.buf[i] then tensors["momentum." .. p.name] = self.buf[i] end
  end
  return { kind = "SGD", tensors = tensors,
           scalars = { t = self.t, lr = self.lr, momentum = self.momentum, dampening = self.dampening,
                       weight_decay = self.weight_decay, nesterov = self.nesterov, clip = self.clip } }
end

function optim.SGD(model, opts) return SGD.new(model, opts) end

-- Restores a state() table: the moment tensors, the step count and the learning rate (the other
-- hyperparameters are recorded in checkpoints but stay as constructed). Everything is checked
-- before anything is copied.
local function load_state(self, st)
  if type(st) ~= "table" or st.kind ~= self.name then
    error(string.format("qgru: optim.%s: state is for %s", self.name, type(st) == "table" and tostring(st.kind) or type(st)), 2)
  end
  local mine = self:state().tensors
  for name, t in pairs(mine) do
    local src = st.tensors[name]
    if not src then error("qgru: optim." .. self.name .. ": state has no tensor " .. name, 2) end
    if not src:sameShape(t:shape()) then
      error(string.format("qgru: optim.%s: state tensor %s has shape %s, expected %s", self.name, name,
                          Tensor.shape_str(src:shape()), Tensor.shape_str(t:shape())), 2)
    end
  end
  for name, t in pairs(mine) do t:copy(st.tensors[name]) end
  self.t, self.lr = st.scalars.t, st.scalars.lr
end
Adam.loadState, SGD.loadState = load_state, load_state

-- Cosine learning-rate schedule from lr0 to lr0 * final_frac over total steps.
function optim.cosine(lr0, step, total, final_frac)
  final_frac = final_frac or 0
  local p = math.min(step / math.max(total, 1), 1)
  return lr0 * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * p)))
end

return optim
