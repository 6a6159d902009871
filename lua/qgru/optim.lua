-- optim.lua: SGD and Adam / AdamW over a model's named parameters, with PyTorch's semantics
-- (so hyperparameters carry over) and optional global gradient-norm clipping.
--
--   local opt = optim.Adam(model, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--                                  weight_decay = 0, clip = nil})
--   opt:step()           -- one update from the accumulated gradients; returns the grad norm
--   opt.lr = 5e-4        -- learning rate schedules just set it
--   opt:state() / opt:loadState(s)   -- for checkpoints (tensors by parameter name + scalars)
--
-- Given a model, the optimizer works on the model's parameter arena (nn/module.lua): its state
-- (exp_avg, exp_avg_sq, momentum) is one arena per kind with per-parameter views named as
-- before ("exp_avg.<param name>"), and step() is ONE fused C call (qg_adam_arena_step,
-- qg_sgd_arena_step) that computes the global gradient norm, the clip factor and the update, with
-- no host round trip per tensor; it returns the norm. When the model moves (model:to), the state
-- follows on the next step() or state(). Given a list of {name=, param=, grad=} instead, it makes
-- one C call per tensor (qg_adam_step, qg_sgd_step): the reference the fused step is tested
-- against (bit-identical).
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

-- The parameters to update: a model (arena mode: its parameter arena, one fused C call per
-- step) or a list of {name=, param=, grad=} (per-tensor mode: one C call per tensor; the reference).
local function setup_params(self, name, model, slots)
  self.slots = slots
  if type(model) == "table" and model.namedParameters then
    if #model:namedParameters() == 0 then
      error("qgru: optim." .. name .. ": expected a model or a list of {name=, param=, grad=}, got no parameters", 4)
    end
    self.model = model
    local a = model:arena()
    self.arena, self.params = a, a.entries
    self.state_arenas = {}
    for _, slot in ipairs(slots) do self.state_arenas[slot] = Tensor.new({ a.numel }, "f32", a.params:device()) end
    self.grad_norm = Tensor.new({ 1 }, "f64", a.params:device())
    self:_views()
    return
  end
  if type(model) ~= "table" or #model == 0 then
    error("qgru: optim." .. name .. ": expected a model or a list of {name=, param=, grad=}, got no parameters", 4)
  end
  self.params = model
  for _, slot in ipairs(slots) do
    self[slot] = {}
    for i, p in ipairs(self.params) do self[slot][i] = Tensor.new(p.param:shape(), "f32", p.param:device()) end
  end
end

local Optimizer = class("optim.Optimizer")

-- Per-parameter views of the state arenas (self.m[i], self.v[i], self.buf[i]), named by parameter.
function Optimizer:_views()
  for _, slot in ipairs(self.slots) do
    self[slot] = {}
    for i, e in ipairs(self.arena.entries) do self[slot][i] = self.state_arenas[slot]:view(e.param:shape(), e.offset) end
  end
end

-- Arena mode: follows the model's arena. When it was rebuilt (model:to(device), a replaced
-- parameter) with the same layout, the state moves with it (same values, the arena's device).
function Optimizer:_bind()
  local a = self.model:arena()
  if a == self.arena then return a end
  if a.layout ~= self.arena.layout then
    error(string.format("qgru: optim.%s: the model's parameters changed (now %s, the optimizer was made for %s); create a new optimizer",
                        self.name, a.layout, self.arena.layout), 3)
  end
  local dev = a.params:device()
  for _, slot in ipairs(self.slots) do self.state_arenas[slot] = self.state_arenas[slot]:to(dev) end
  self.grad_norm = self.grad_norm:to(dev)
  self.arena, self.params = a, a.entries
  self:_views()
  return a
end

-- The device of the parameters the optimizer updates.
function Optimizer:device()
  if self.model then return self:_bind().params:device() end
  return self.params[1].param:device()
end

-- The norm the fused step wrote into its f64 [1] tensor (on the arena's device): one 8-byte copy.
local norm_buf = clib.ffi.new("double[1]")
local function read_norm(t)
  local ctx = t:ctx()
  check(ctx, lib.qg_copy_to_host(ctx, norm_buf, t.t, 8))
  return Tensor.double(norm_buf)
end

-- Global L2 norm of all gradients (in double), and the factor that clips it to max_norm
-- (per-tensor mode; the arena step computes both in C, in the same order).
local function grad_norm_and_scale(params, max_norm)
  local ss = 0
  for _, p in ipairs(params) do ss = ss + p.grad:sumsq() end
  local norm = math.sqrt(ss)
  local scale = 1
  if max_norm and norm > max_norm then scale = max_norm / (norm + 1e-6) end
  return norm, scale
end

-- ---- Adam / AdamW ----
local Adam = class("optim.Adam", Optimizer)

function Adam:__init(model, opts, decoupled)
  opts = opts or {}
  local name = decoupled and "AdamW" or "Adam"
  check_opts(name, opts, { lr = true, betas = true, eps = true, weight_decay = true, clip = true })
  self.name = name
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
  setup_params(self, name, model, { "m", "v" })
end

-- One update from the accumulated gradients; returns the global gradient norm (before clipping).
function Adam:step()
  local t = self.t + 1
  if self.model then
    local a = self:_bind()
    local ctx = a.params:ctx()
    check(ctx, lib.qg_adam_arena_step(ctx, self.grad_norm.t, a.params.t, self.state_arenas.m.t, self.state_arenas.v.t,
                                      a.grads.t, a.offsets.t, self.lr, self.beta1, self.beta2, self.eps,
                                      self.weight_decay, self.decoupled, t, self.clip or -1))
    self.t = t
    return read_norm(self.grad_norm)
  end
  local norm, scale = grad_norm_and_scale(self.params, self.clip)
  for i, p in ipairs(self.params) do
    local ctx = p.param:ctx()
    check(ctx, lib.qg_adam_step(ctx, p.param.t, self.m[i].t, self.v[i].t, p.grad.t, self.lr, self.beta1, self.beta2,
                                self.eps, self.weight_decay, self.decoupled, t, scale))
  end
  self.t = t
  return norm
end

function Adam:state()
  if self.model then self:_bind() end
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
local SGD = class("optim.SGD", Optimizer)

function SGD:__init(model, opts)
  opts = opts or {}
  check_opts("SGD", opts, { lr = true, momentum = true, dampening = true, weight_decay = true, nesterov = true, clip = true })
  self.name = "SGD"
  self.lr = number_opt("SGD", opts, "lr", 1e-2, 0)
  self.momentum = number_opt("SGD", opts, "momentum", 0, 0)
  self.dampening = number_opt("SGD", opts, "dampening", 0, 0)
  self.weight_decay = number_opt("SGD", opts, "weight_decay", 0, 0)
  self.nesterov = opts.nesterov and 1 or 0
  self.clip = opts.clip and number_opt("SGD", opts, "clip", nil, 0) or nil
  self.t = 0
  setup_params(self, "SGD", model, self.momentum ~= 0 and { "buf" } or {})
  self.buf = self.buf or {}
end

function SGD:step()
  local t = self.t + 1
  if self.model then
    local a = self:_bind()
    local ctx = a.params:ctx()
    local buf = self.state_arenas.buf
    check(ctx, lib.qg_sgd_arena_step(ctx, self.grad_norm.t, a.params.t, buf and buf.t or nil, a.grads.t, a.offsets.t,
                                     self.lr, self.momentum, self.dampening, self.weight_decay, self.nesterov,
                                     t == 1 and 1 or 0, self.clip or -1))
    self.t = t
    return read_norm(self.grad_norm)
  end
  local norm, scale = grad_norm_and_scale(self.params, self.clip)
  for i, p in ipairs(self.params) do
    local ctx = p.param:ctx()
    if scale ~= 1 then p.grad:mul(scale) end
    check(ctx, lib.qg_sgd_step(ctx, p.param.t, self.buf[i] and self.buf[i].t or nil, p.grad.t, self.lr, self.momentum,
                               self.dampening, self.weight_decay, self.nesterov, t == 1 and 1 or 0))
  end
  self.t = t
  return norm
end

function SGD:state()
  if self.model then self:_bind() end
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
