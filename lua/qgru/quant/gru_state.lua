-- quant/gru_state.lua: the quantized GRU state attached to one nn.GRU (quant.prepare).
--
-- Per layer and direction a LayerQuant owns one C integer GRU layer (qg_int_gru of core/qgru.h),
-- which holds the resolved quantizers, activation and derivative tables, weight codes and masks
-- on the GRU's device. The 13 activation and 4 per-channel weight Quantizer objects are views:
-- each change (calibration, set, setBitwidth, load) is pushed to the C layer at once, and the C
-- layer validates it. Weight quantizers are derived from the weights by the C layer itself
-- (qg_int_gru_calibrate_weight: on a GPU, symmetric minmax runs on the device with no host
-- synchronisation, every forward when tracking); their host tensors are pulled from the layer
-- when read (Quantizer:markDerived, LayerQuant:pull). nn.GRU runs the layers and directions and calls GRUQuant:forwardLayer /
-- :backwardLayer (a bidirectional layer's two directions: :forwardBidir / :backwardBidir, one C
-- call, at the same time on a GPU) when the state is enabled.
--
-- Modes: "qat" (the integer forward; the default once calibrated), "calib_float" (the float
-- forward observing statistics: calibration pass 1), "calib_quant" (the integer forward
-- observing statistics: passes >= 2); quantization disabled runs the float GRU.
local class = require("qgru.class")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local config = require("qgru.quant.config")
local Quantizer = require("qgru.quant.quantizer")

local ffi, lib = clib.ffi, clib.lib

local LayerQuant = class("quant.LayerQuant")
local GRUQuant = class("quant.GRUQuant")

local DIR = { [0] = "fwd", [1] = "bwd" }
local WEIGHT_FIELD = { "W", "R", "bx", "br" }   -- QG_W_* order
local METHODS = { minmax = lib.QG_CALIB_MINMAX, histogram = lib.QG_CALIB_HISTOGRAM, mse = lib.QG_CALIB_MSE,
                  percentile = lib.QG_CALIB_PERCENTILE }
GRUQuant.METHODS = METHODS

-- A new C layer on the device's context, owned by Lua (ffi.gc); :free() on the LayerQuant.
local function new_handle(ctx, C, H)
  local out = ffi.new("qg_int_gru*[1]")
  clib.check(ctx, lib.qg_int_gru_create(ctx, out, C, H), 3)
  return ffi.gc(out[0], lib.qg_int_gru_free)
end

function LayerQuant:__init(gru, l, d, cfg, device)
  self.gru, self.l, self.d = gru, l, d
  self.key = l * gru.dirs + d
  self.name = string.format("l%d.%s", l, DIR[d])
  self.H = gru.hiddenSize
  self.C = l == 0 and gru.inputSize or gru.dirs * gru.hiddenSize
  self.device = device
  self.handle = new_handle(clib.context(device), self.C, self.H)
  self.act, self.w = {}, {}
  for i, op in ipairs(config.ACT_OPS) do
    self.act[i] = Quantizer.new({ name = self.name .. "." .. op, op = op, spec = cfg.ops[op], owner = self, slot = i - 1 })
  end
  for i, op in ipairs(config.WEIGHT_OPS) do
    self.w[i] = Quantizer.new({ name = self.name .. "." .. op, op = op, spec = cfg.ops[op], channels = 3 * self.H, owner = self,
                                slot = i - 1 })
  end
  self:_newStats()
end

-- Calibration statistics: one row per activation operator (QG_Q_* order), on the layer's device.
function LayerQuant:_newStats()
  self.range = Tensor.new({ lib.QG_Q_NUM_ACT, 4 }, "f64", self.device)
  self.counts = Tensor.new({ lib.QG_Q_NUM_ACT, lib.QG_STATS_BINS }, "i64", self.device)
  self.stats = ffi.new("qg_stats")
  self.stats.range, self.stats.counts = self.range.t, self.counts.t
end

-- Releases the C layer now (also done by the garbage collector); idempotent. Per-channel
-- parameters the layer derived are pulled first, so the quantizers keep them.
function LayerQuant:free()
  if self.handle then
    for _, q in ipairs(self.w) do q:sync() end
    lib.qg_int_gru_free(ffi.gc(self.handle, nil))
    self.handle = nil
  end
end

-- Pushes one quantizer's parameters to the C layer (called by Quantizer:set and friends).
function LayerQuant:push(q)
  if not q.calibrated or not self.handle then return end
  q:sync()
  local ctx = clib.context(self.device)
  if q.per_channel then
    self.gru:ccall(ctx, lib.qg_int_gru_set_weight_quant(ctx, self.handle, q.slot, q.bitwidth, q.is_unsigned and 1 or 0,
                                                        q.exps.t, q.zps.t))
  else
    local s = ffi.new("qg_qspec", q.bitwidth, q.is_unsigned and 1 or 0, q.e, q.z)
    self.gru:ccall(ctx, lib.qg_int_gru_set_act(ctx, self.handle, q.slot, s))
  end
end

-- Reads weight quantizer q's per-channel parameters from the C layer into its host tensors
-- (waits for the device when they were derived there).
function LayerQuant:pull(q)
  local ctx = clib.context(self.device)
  self.gru:ccall(ctx, lib.qg_int_gru_weight_quant(ctx, self.handle, q.slot, q.exps.t, q.zps.t))
  q._stale = false
end

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

-- Weight quantizers that track their weights are calibrated from the current values (per
-- channel, with the weight method) by the C layer, which quantizes the weights itself in every
-- forward. On a GPU the default (symmetric minmax) stays on the device: the host tensors are
-- pulled only when read.
function LayerQuant:calibrateWeights(method, percentile)
  local wts = self.gru.weights[self.l][self.d]
  local specs = self._wspecs or ffi.new("qg_wcalib[?]", lib.QG_W_NUM)
  self._wspecs = specs
  local any, used = false, {}
  for i, q in ipairs(self.w) do
    local s = specs[i - 1]
    s.calibrate = 0
    if q:calibratable() and (self.gru.qstate.track_weights or not q.calibrated) then
      -- a quantizer's recorded method says how its (e, z) were last derived: a calibration method,
      -- or "set", "pinned", whatever a checkpoint or qparams file wrote; only a calibration method
      -- can derive them again, the others take the minmax rule
      local m = method or (METHODS[q.method] and q.method) or "minmax"
      s.calibrate, s.bitwidth, s.is_symmetric, s.is_unsigned = 1, q.bitwidth, q.is_symmetric and 1 or 0, q.is_unsigned and 1 or 0
      s.method, s.percentile = METHODS[m], percentile or 99.99
      used[i] = m
      any = true
    end
  end
  if not any then return end
  local ctx = clib.context(self.device)
  self.gru:ccall(ctx, lib.qg_int_gru_calibrate_weights(ctx, self.handle, specs, wts.W.t, wts.R.t, wts.bx.t, wts.br.t))
  for i, q in ipairs(self.w) do
    if specs[i - 1].calibrate ~= 0 then
      q.method = used[i]
      q.calibrated = true
      q:markDerived()
      if self.device == "cpu" then q:sync() end   -- nothing to wait for: the host tensors stay current
    end
  end
end

-- Integer weight codes of weight i (QG_W_* order + 1) as of the last forward: a new cpu i32 tensor.
function LayerQuant:weightCodes(i)
  local w = self.gru.weights[self.l][self.d][WEIGHT_FIELD[i]]
  local ctx = clib.context(self.device)
  self.gru:ccall(ctx, lib.qg_int_gru_quantize_weights(ctx, self.handle, self:_weights()))
  local codes = Tensor.new(w:shape(), "i32", self.device)
  self.gru:ccall(ctx, lib.qg_int_gru_weights(ctx, self.handle, i - 1, codes.t, nil, nil))
  return codes:device() == "cpu" and codes or codes:to("cpu")
end

function LayerQuant:_weights()
  local w = self.gru.weights[self.l][self.d]
  return w.W.t, w.R.t, w.bx.t, w.br.t
end

-- Moves the C layer and the statistics to another device: a new layer there, every quantizer
-- pushed again (they are the source of truth), the old layer released.
function LayerQuant:to(device)
  if device == self.device then return self end
  for _, q in ipairs(self.w) do q:sync() end   -- from the old layer
  local handle = new_handle(clib.context(device), self.C, self.H)
  local old = self.handle
  self.handle, self.device = handle, device
  self:_newStats()
  for _, q in ipairs(self.act) do self:push(q) end
  for _, q in ipairs(self.w) do self:push(q) end
  if old then lib.qg_int_gru_free(ffi.gc(old, nil)) end
  return self
end

-- ---- GRUQuant: the state attached to an nn.GRU, which calls forwardLayer / backwardLayer ----
function GRUQuant:__init(gru, cfg)
  self.gru, self.cfg = gru, cfg
  self.enabled = not cfg.disable_quantization
  self.mode = "qat"
  self.track_weights = true
  self.weight_method = "minmax"
  self.device = gru.weights[0][0].W:device()
  self.layers = {}
  for l = 0, gru.layers - 1 do
    for d = 0, gru.dirs - 1 do
      local lq = LayerQuant.new(gru, l, d, cfg, self.device)
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

-- Module:to calls this: every layer's C state and statistics move with the module.
function GRUQuant:to(device)
  for lq in self:each() do lq:to(device) end
  self.device = device
  return self
end

function GRUQuant:free()
  for lq in self:each() do lq:free() end
end

-- Called by nn.GRU before a forward.
function GRUQuant:check(x)
  if x:device() ~= self.device then
    self.gru:fail("the quantizers live on %s but the input is on %s (call model:to('%s'))", self.device, x:device(), x:device())
  end
end

function GRUQuant:calibrating() return self.mode == "calib_float" or self.mode == "calib_quant" end

-- What one layer and direction needs before its integer forward: its quantizers ready, its weight
-- quantizers following the weights (when tracking), and, when training, the saved-state buffers
-- (kept in lq.last for the backward). Returns the qg_int_gru_saved (nil at inference).
function GRUQuant:_prepareLayer(lq, inp, h0v, lengths, training)
  local gru = self.gru
  local T, N, H = inp:size(1), inp:size(2), gru.hiddenSize
  local ok, which = lq:ready()
  if not ok then
    gru:fail("quantizer %s is not calibrated: run quant.calibrate(model, data) or quant.load(model, path) first", which)
  end
  if self.track_weights then lq:calibrateWeights() end
  local saved
  if training then
    local key, dev = lq.key, inp:device()
    saved = ffi.new("qg_int_gru_saved")
    local s = {
      hq = gru:buffer("_q_hq" .. key, { T + 1, N, H }, dev, "i32"),
      cell = gru:buffer("_q_cell" .. key, { T, N, H, lib.qg_int_gru_cell_bytes(lq.handle) }, dev, "u8"),
      xq = gru:buffer("_q_xq" .. key, { T, N, inp:size(3) }, dev, "i32"),
      xmask = gru:buffer("_q_xm" .. key, { T, N, inp:size(3) }, dev, "u8"),
    }
    saved.hq, saved.cell, saved.xq, saved.xmask = s.hq.t, s.cell.t, s.xq.t, s.xmask.t
    lq.last = { hq = s.hq, cell = s.cell, xq = s.xq, xmask = s.xmask, saved = saved, h0 = h0v, lengths = lengths }
  else
    lq.last = nil
  end
  return saved
end

-- One layer and direction of nn.GRU's forward, in the current mode: the integer step (saving
-- state for the backward when training), or, in calibration pass 1, the float step observing
-- statistics. y [T, N, D*H] gets columns [d*H, (d+1)*H); hn [N, H] the final state.
function GRUQuant:forwardLayer(ctx, l, d, y, inp, h0v, lengths, hn, training)
  local gru = self.gru
  local lq = self.layers[l * gru.dirs + d]
  local T, N, H = inp:size(1), inp:size(2), gru.hiddenSize
  local stats = self:calibrating() and lq.stats or nil
  local w = gru.weights[l][d]
  local lt = lengths and lengths.t or nil
  if self.mode == "calib_float" then
    local hs = gru:buffer("_hs" .. lq.key, { T + 1, N, H }, inp:device())
    gru:ccall(ctx, lib.qg_gru_forward(ctx, y.t, d * H, hs.t, nil, stats, inp.t, w.W.t, w.R.t, w.bx.t, w.br.t,
                                      h0v and h0v.t or nil, lt, d))
    hn:copy(hs:select(T + 1))
    return
  end
  local saved = self:_prepareLayer(lq, inp, h0v, lengths, training)
  gru:ccall(ctx, lib.qg_int_gru_forward(ctx, lq.handle, y.t, d * H, hn.t, saved, stats, inp.t, w.W.t, w.R.t, w.bx.t, w.br.t,
                                        h0v and h0v.t or nil, lt, d))
end

-- One layer and direction of nn.GRU's backward: the straight-through estimator.
function GRUQuant:backwardLayer(ctx, l, d, dx, dy, dh0v)
  local gru = self.gru
  local lq = self.layers[l * gru.dirs + d]
  local g, s = gru.grads[l][d], lq.last
  gru:ccall(ctx, lib.qg_int_gru_backward(ctx, lq.handle, dx.t, g.W.t, g.R.t, g.bx.t, g.br.t, dh0v and dh0v.t or nil, dy.t,
                                         d * gru.hiddenSize, nil, s.saved, s.h0 and s.h0.t or nil,
                                         s.lengths and s.lengths.t or nil, d))
end

-- A C array of the two directions' entries (ct: e.g. "qg_tensor*[2]").
local function arr(ct, a, b) return ffi.new(ct, a, b) end

-- Both directions of a bidirectional layer l in one C call (qg_int_gru_forward_bidir: at the same
-- time on a GPU); integer mode only (calibration runs the directions one by one). h0 [L*2, N, H]
-- or nil; hn [L*2, N, H] gets slices 2l+1, 2l+2.
function GRUQuant:forwardBidir(ctx, l, y, inp, h0, lengths, hn, training)
  local gru = self.gru
  local lq, hv, h0v, handles, saved, W, R, bx, br = {}, {}, {}, {}, {}, {}, {}, {}, {}
  for d = 0, 1 do
    lq[d] = self.layers[l * 2 + d]
    h0v[d] = h0 and h0:select(l * 2 + d + 1) or nil
    hv[d] = hn:select(l * 2 + d + 1)
    saved[d] = self:_prepareLayer(lq[d], inp, h0v[d], lengths, training)
    local w = gru.weights[l][d]
    handles[d], W[d], R[d], bx[d], br[d] = lq[d].handle, w.W.t, w.R.t, w.bx.t, w.br.t
  end
  -- hv, h0v and lq stay referenced (locals) until the call returns: their finalizers free the C structs
  gru:ccall(ctx, lib.qg_int_gru_forward_bidir(ctx, arr("qg_int_gru*[2]", handles[0], handles[1]), y.t,
                                              arr("qg_tensor*[2]", hv[0].t, hv[1].t),
                                              training and arr("const qg_int_gru_saved*[2]", saved[0], saved[1]) or nil,
                                              inp.t, arr("const qg_tensor*[2]", W[0], W[1]), arr("const qg_tensor*[2]", R[0], R[1]),
                                              arr("const qg_tensor*[2]", bx[0], bx[1]), arr("const qg_tensor*[2]", br[0], br[1]),
                                              h0 and arr("const qg_tensor*[2]", h0v[0].t, h0v[1].t) or nil,
                                              lengths and lengths.t or nil))
  return hv, h0v
end

-- The backward of forwardBidir (qg_int_gru_backward_bidir). dh0 [L*2, N, H] or nil.
function GRUQuant:backwardBidir(ctx, l, dx, dy, dh0)
  local gru = self.gru
  local handles, last, dv, g = {}, {}, {}, {}
  for d = 0, 1 do
    local lq = self.layers[l * 2 + d]
    handles[d], last[d], g[d] = lq.handle, lq.last, gru.grads[l][d]
    dv[d] = dh0 and dh0:select(l * 2 + d + 1) or nil
  end
  local s0, s1 = last[0], last[1]
  gru:ccall(ctx, lib.qg_int_gru_backward_bidir(ctx, arr("qg_int_gru*[2]", handles[0], handles[1]), dx.t,
                                               arr("qg_tensor*[2]", g[0].W.t, g[1].W.t), arr("qg_tensor*[2]", g[0].R.t, g[1].R.t),
                                               arr("qg_tensor*[2]", g[0].bx.t, g[1].bx.t), arr("qg_tensor*[2]", g[0].br.t, g[1].br.t),
                                               dh0 and arr("qg_tensor*[2]", dv[0].t, dv[1].t) or nil, dy.t, nil,
                                               arr("const qg_int_gru_saved*[2]", s0.saved, s1.saved),
                                               s0.h0 and arr("const qg_tensor*[2]", s0.h0.t, s1.h0.t) or nil,
                                               s0.lengths and s0.lengths.t or nil))
  return dv
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
