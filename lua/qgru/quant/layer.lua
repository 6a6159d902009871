-- quant/layer.lua: the quantization state of one nn.GRU: per layer and direction, 13 activation
-- quantizers and 4 per-channel weight quantizers, the activation tables, and the quantized
-- step of one layer and direction (integer step, QUANT_SPEC.md section 3) and its
-- straight-through backward (section 4). nn.GRU runs the layers and directions and calls
-- GRUQuant:forwardLayer / :backwardLayer when a state is attached and enabled.
--
-- Modes: "qat" (quantized forward; the default once calibrated), "calib_float" (float forward
-- recording statistics: calibration pass 1), "calib_quant" (quantized forward recording
-- statistics: passes >= 2), and disabled (the float GRU).
local class = require("qgru.class")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local config = require("qgru.quant.config")
local Quantizer = require("qgru.quant.quantizer")

local ffi, lib = clib.ffi, clib.lib

local LayerQuant = class("quant.LayerQuant")
local GRUQuant = class("quant.GRUQuant")

local DIR = { [0] = "fwd", [1] = "bwd" }
local WEIGHT_FIELD = { ["weight.W"] = "W", ["weight.R"] = "R", ["weight.bw"] = "bx", ["weight.br"] = "br" }
local METHODS = { minmax = lib.QG_CALIB_MINMAX, histogram = lib.QG_CALIB_HISTOGRAM, mse = lib.QG_CALIB_MSE,
                  percentile = lib.QG_CALIB_PERCENTILE }
GRUQuant.METHODS = METHODS

-- (pre-activation, output) quantizer indices of the z, r and g activations (tables 1, 2, 3).
local ACTIVATIONS = { { lib.QG_Q_Z_PRE, lib.QG_Q_Z_OUT }, { lib.QG_Q_R_PRE, lib.QG_Q_R_OUT }, { lib.QG_Q_G_PRE, lib.QG_Q_G_OUT } }

function LayerQuant:__init(gru, l, d, cfg)
  self.gru, self.l, self.d = gru, l, d
  self.key = l * gru.dirs + d
  self.name = string.format("l%d.%s", l, DIR[d])
  self.H = gru.hiddenSize
  self.act, self.w = {}, {}
  for i, op in ipairs(config.ACT_OPS) do
    self.act[i] = Quantizer.new({ name = self.name .. "." .. op, op = op, spec = cfg.ops[op], owner = self })
  end
  for i, op in ipairs(config.WEIGHT_OPS) do
    self.w[i] = Quantizer.new({ name = self.name .. "." .. op, op = op, spec = cfg.ops[op], channels = 3 * self.H, owner = self })
  end
  self.stats = Tensor.new({ lib.QG_Q_NUM_ACT, lib.QG_STATS_WIDTH }, "f64")
  self.params = ffi.new("qg_qgru_params")
  self.dirty = true
end

function LayerQuant:invalidate() self.dirty = true end

-- Every quantizer of this layer and direction: {op = Quantizer}.
function LayerQuant:quantizers()
  local out = {}
  for i, op in ipairs(config.ACT_OPS) do out[op] = self.act[i] end
  for i, op in ipairs(config.WEIGHT_OPS) do out[op] = self.w[i] end
  return out
end

function LayerQuant:ready()
  for _, q in ipairs(self.act) do if not q.calibrated then return false, q.name end end
  for _, q in ipairs(self.w) do if not q.calibrated then return false, q.name end end
  return true
end

-- Fills the C parameter struct and rebuilds the activation tables when something changed.
function LayerQuant:refresh()
  if not self.dirty then return end
  local p = self.params
  for i, q in ipairs(self.act) do
    local a = p.act[i - 1]
    a.bitwidth, a.is_unsigned, a.exp2_inv, a.zero_point = q.bitwidth, q.is_unsigned and 1 or 0, q.e, q.z
  end
  for i, q in ipairs(self.w) do
    p.w_bits[i - 1], p.w_unsigned[i - 1] = q.bitwidth, q.is_unsigned and 1 or 0
    p.w_exp[i - 1], p.w_zp[i - 1] = q.exps.t, q.zps.t
  end
  self.luts = self.luts or {}
  local ctx = clib.context("cpu")
  for k, po in ipairs(ACTIVATIONS) do
    local pre_i, out_i = po[1], po[2]
    local pre = p.act[pre_i]
    if pre.bitwidth <= 16 then
      local n = 2 * 2 ^ pre.bitwidth
      local lut = self.luts[k]
      if not lut or lut:numel() ~= n then lut = Tensor.new({ n }, "i32"); self.luts[k] = lut end
      self.gru:ccall(ctx, lib.qg_qgru_build_lut(ctx, lut.t, p.act + pre_i, p.act + out_i, k == 3 and 1 or 0))
      p.lut[k - 1] = lut.t
    else
      self.luts[k] = nil
      p.lut[k - 1] = nil
    end
  end
  self.dirty = false
end

-- Weight quantizers that track their weights are calibrated from the current values (per
-- channel, with the weight method); then codes, fake-quantized values and masks are computed.
function LayerQuant:quantizeWeights(method, percentile)
  local ctx = clib.context("cpu")
  local wts = self.gru.weights[self.l][self.d]
  self.wq = self.wq or {}
  for i, op in ipairs(config.WEIGHT_OPS) do
    local q, w = self.w[i], wts[WEIGHT_FIELD[op]]
    if q:calibratable() and (self.gru.qstate.track_weights or not q.calibrated) then
      self.gru:ccall(ctx, lib.qg_calibrate_channels(ctx, q.exps.t, q.zps.t, w.t, q.bitwidth, q.is_symmetric and 1 or 0,
                                                   q.is_unsigned and 1 or 0, METHODS[method or q.method or "minmax"],
                                                   percentile or 99.99))
      q.method = method or q.method or "minmax"
      -- the C parameters point at these exponent tensors, so the tables need no rebuild
      if not q.calibrated then q.calibrated = true; self.dirty = true end
    end
    local e = self.wq[i]
    if not e or not e.codes:sameShape(w:shape()) then
      e = { codes = Tensor.new(w:shape(), "i32"), fq = Tensor.new(w:shape(), "f32"), mask = Tensor.new(w:shape(), "u8") }
      self.wq[i] = e
    end
    self.gru:ccall(ctx, lib.qg_fake_quant(ctx, e.fq.t, e.codes.t, e.mask.t, w.t, q.exps.t, q.zps.t, q.bitwidth, q.is_unsigned and 1 or 0))
  end
end

-- ---- GRUQuant: the state attached to an nn.GRU, which calls forwardLayer / backwardLayer ----
function GRUQuant:__init(gru, cfg)
  self.gru, self.cfg = gru, cfg
  self.enabled = not cfg.disable_quantization
  self.mode = "qat"
  self.track_weights = true
  self.weight_method = "minmax"
  self.layers = {}
  for l = 0, gru.layers - 1 do
    for d = 0, gru.dirs - 1 do
      local lq = LayerQuant.new(gru, l, d, cfg)
      self.layers[lq.key] = lq
    end
  end
end

function GRUQuant:each()
  local k = -1
  return function()
    k = k + 1
    return self.layers[k]
  end
end

-- Called by nn.GRU before a forward.
function GRUQuant:check(x)
  if x:device() ~= "cpu" then self.gru:fail("the quantized GRU runs on the cpu in this build") end
end

function GRUQuant:calibrating() return self.mode == "calib_float" or self.mode == "calib_quant" end

-- One layer and direction of nn.GRU's forward, in the current mode: the integer step (saving
-- state for the backward when training), or, in calibration pass 1, the float step recording
-- statistics. y [T, N, D*H] gets columns [d*H, (d+1)*H).
function GRUQuant:forwardLayer(ctx, l, d, y, inp, h0v, training)
  local gru = self.gru
  local lq = self.layers[l * gru.dirs + d]
  local T, N, H = inp:size(1), inp:size(2), gru.hiddenSize
  local stats = self:calibrating() and lq.stats.t or nil
  if self.mode == "calib_float" then
    local w = gru.weights[l][d]
    gru:ccall(ctx, lib.qg_gru_forward_stats(ctx, y.t, d * H, stats, inp.t, w.W.t, w.R.t, w.bx.t, w.br.t, h0v and h0v.t or nil, d))
    return
  end
  local ok, which = lq:ready()
  if not ok then
    gru:fail("quantizer %s is not calibrated: run quant.calibrate(model, data) or quant.load(model, path) first", which)
  end
  lq:quantizeWeights()
  lq:refresh()
  local key = lq.key
  local hq = gru:buffer("_q_hq" .. key, { T + 1, N, H }, "cpu", "i32")
  local saved, xq, xm
  if training then
    saved = gru:buffer("_q_saved" .. key, { T, N, H, lib.qg_qgru_saved_bytes(lq.params) }, "cpu", "u8")
    xq = gru:buffer("_q_xq" .. key, { T, N, inp:size(3) }, "cpu", "i32")
    xm = gru:buffer("_q_xm" .. key, { T, N, inp:size(3) }, "cpu", "u8")
  end
  gru:ccall(ctx, lib.qg_qgru_forward(ctx, y.t, d * H, hq.t, saved and saved.t or nil, xq and xq.t or nil, xm and xm.t or nil,
                                     stats, inp.t, lq.wq[1].codes.t, lq.wq[2].codes.t, lq.wq[3].codes.t, lq.wq[4].codes.t,
                                     h0v and h0v.t or nil, lq.params, d))
  lq.last = { hq = hq, saved = saved, xq = xq, xm = xm, h0 = h0v }
end

-- One layer and direction of nn.GRU's backward: the straight-through estimator.
function GRUQuant:backwardLayer(ctx, l, d, dx, dy, dh0v)
  local gru = self.gru
  local lq = self.layers[l * gru.dirs + d]
  local g, s = gru.grads[l][d], lq.last
  gru:ccall(ctx, lib.qg_qgru_backward(ctx, dx.t, g.W.t, g.R.t, g.bx.t, g.br.t, dh0v and dh0v.t or nil, dy.t, d * gru.hiddenSize, nil,
                                      s.xq.t, s.xm.t, lq.wq[1].fq.t, lq.wq[2].fq.t, lq.wq[1].mask.t, lq.wq[2].mask.t,
                                      lq.wq[3].mask.t, lq.wq[4].mask.t, s.hq.t, s.saved.t, s.h0 and s.h0.t or nil,
                                      lq.params, d))
end

-- Text for print(model): one line per layer and direction.
function GRUQuant:describe()
  if not self.enabled then return "quantization disabled (float)" end
  local lines = {}
  for lq in self:each() do
    local ok = lq:ready()
    local n_cal, n_fixed = 0, 0
    for _, q in ipairs(lq.act) do
      if q.fixed then n_fixed = n_fixed + 1 elseif q.calibrated then n_cal = n_cal + 1 end
    end
    lines[#lines + 1] = string.format("%s: %s, %s (%d calibrated, %d fixed of 13 activation quantizers)%s", lq.name,
      config.describe(self.cfg), ok and "ready" or "needs calibration", n_cal, n_fixed,
      self.mode ~= "qat" and (", mode " .. self.mode) or "")
  end
  return table.concat(lines, "\n")
end

GRUQuant.LayerQuant = LayerQuant
return GRUQuant
