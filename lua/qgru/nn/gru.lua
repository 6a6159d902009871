-- nn/gru.lua: the GRU module: multi-layer, optionally bidirectional, optional initial state.
--
--   nn.GRU(inputSize, hiddenSize, {layers = 1, bidirectional = false, batch_first = false})
--   forward(x), forward({x, h0}), forward({x, lengths = L}) or forward({x, h0, lengths = L}):
--     x [T, N, C] (or [N, T, C] with batch_first), h0 [layers * dirs, N, H],
--     L: per-row lengths, an i64 [N] tensor or a Lua array, each in 1..T (as PyTorch's
--     pack_padded_sequence): steps at or beyond a row's length keep its state and give zero output
--     and zero gradient; the reverse direction starts at each row's last valid step.
--   output [T, N, dirs * H] (fwd then bwd halves); self.h_n [layers * dirs, N, H]
--   gradInput: dx, or {dx, dh0} when h0 was given.
--
-- Each layer and direction has its own W [3H, in], R [3H, H], bx [3H], br [3H] in gate order
-- z, r, g (see core/qgru.h for the formulation), named "l<k>.<fwd|bwd>.<W|R|bx|br>".
-- A bidirectional layer runs both directions in one call (qg_gru_forward_bidir /
-- qg_gru_backward_bidir, and quantized qg_int_gru_forward_bidir / qg_int_gru_backward_bidir: at the
-- same time on the GPU); calibration's forwards run them one by one (each observes statistics).
-- The C backward produces gradInput and the parameter gradients in one pass, so (as torch/rnn's
-- SeqGRU does) updateGradInput runs it and accGradParameters only runs it when it was not run.
-- With a quantization state attached (qgru.quant.prepare) and enabled, every layer and direction
-- runs the integer step and its straight-through backward instead (quant/gru_state.lua).
local class = require("qgru.class")
local clib = require("qgru.clib")
local Module = require("qgru.nn.module")
local Tensor = require("qgru.tensor")

local lib, ffi = clib.lib, clib.ffi

local GRU = class("nn.GRU", Module)

local DIR_NAMES = { [0] = "fwd", [1] = "bwd" }

function GRU:__init(inputSize, hiddenSize, opts)
  Module.__init(self)
  opts = opts or {}
  local function posint(v, what)
    if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
      error(string.format("qgru: nn.GRU: %s must be a positive integer, got %s", what, tostring(v)), 3)
    end
  end
  posint(inputSize, "inputSize"); posint(hiddenSize, "hiddenSize")
  for k in pairs(opts) do
    if k ~= "layers" and k ~= "bidirectional" and k ~= "batch_first" and k ~= "device" then
      error("qgru: nn.GRU: unknown option '" .. tostring(k) .. "' (layers, bidirectional, batch_first, device)", 2)
    end
  end
  self.inputSize, self.hiddenSize = inputSize, hiddenSize
  self.layers = opts.layers or 1
  posint(self.layers, "layers")
  self.bidirectional = opts.bidirectional and true or false
  self.dirs = self.bidirectional and 2 or 1
  self.batch_first = opts.batch_first and true or false
  self.weights, self.grads = {}, {}
  local H, device = hiddenSize, "cpu"   -- built and initialised on the cpu, then moved (opts.device)
  for l = 0, self.layers - 1 do
    local C = l == 0 and inputSize or self.dirs * H
    self.weights[l], self.grads[l] = {}, {}
    for d = 0, self.dirs - 1 do
      local w, g = {}, {}
      for _, spec in ipairs({ { "W", { 3 * H, C } }, { "R", { 3 * H, H } }, { "bx", { 3 * H } }, { "br", { 3 * H } } }) do
        w[spec[1]] = Tensor.new(spec[2], "f32", device)
        g[spec[1]] = Tensor.new(spec[2], "f32", device)
      end
      self.weights[l][d], self.grads[l][d] = w, g
    end
  end
  self:reset()
  device = opts.device or Module.defaultDevice()
  if device ~= "cpu" then self:to(device) end
end

-- PyTorch's initialisation: every weight and bias uniform in [-1/sqrt(H), 1/sqrt(H)), drawn
-- from the context RNG in parameter order (seed with qgru.seed for reproducible models).
function GRU:reset()
  local k = 1 / math.sqrt(self.hiddenSize)
  for _, e in ipairs(self:namedParameters()) do e.param:uniform(-k, k) end
  return self
end

function GRU:namedParameters()
  local out = {}
  for l = 0, self.layers - 1 do
    for d = 0, self.dirs - 1 do
      for _, n in ipairs({ "W", "R", "bx", "br" }) do
        local name = string.format("l%d.%s.%s", l, DIR_NAMES[d], n)
        out[#out + 1] = { name = name, param = self.weights[l][d][n], grad = self.grads[l][d][n] }
      end
    end
  end
  return out
end

function GRU:_replaceParameter(name, param, grad)
  local l, d, n = name:match("^l(%d+)%.(%a+)%.(%a+)$")
  d = d == "fwd" and 0 or 1
  self.weights[tonumber(l)][d][n], self.grads[tonumber(l)][d][n] = param, grad
end

local function split_input(self, input)
  if type(input) == "table" and getmetatable(input) ~= Tensor then
    for k in pairs(input) do
      if k ~= 1 and k ~= 2 and k ~= "lengths" then
        self:fail("input: unexpected key '%s' (expected {x}, {x, h0}, with an optional lengths = L)", tostring(k))
      end
    end
    if input[1] == nil then self:fail("input: the table has no x (expected {x, h0} or {x, lengths = L})") end
    return input[1], input[2], input.lengths
  end
  return input, nil, nil
end

-- Per-row lengths as an i64 [N] tensor on the device, each checked to be in 1..T.
function GRU:_lengthsTensor(L, T, N, dev)
  if L == nil then return nil end
  local vals = {}
  if getmetatable(L) == Tensor then
    if L:dim() ~= 1 or L:size(1) ~= N then
      self:fail("lengths: expected %d entries (one per batch row), got shape [%s]", N, table.concat(L:shape(), ", "))
    end
    vals = L:to("cpu"):to("i64"):totable()   -- (not a raw pointer into the temporary copy: it may be collected)
  elseif type(L) == "table" then
    if #L ~= N then self:fail("lengths: expected %d entries (one per batch row), got %d", N, #L) end
    vals = L
  else
    self:fail("lengths: expected an i64 tensor or a Lua array, got %s", type(L))
  end
  for n = 1, N do
    local v = vals[n]
    if type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v > T then
      self:fail("lengths[%d] = %s: every length must be an integer in 1..T = %d", n, tostring(v), T)
    end
  end
  local t = self:buffer("_len_cpu", { N }, "cpu", "i64")
  local p = t:ptr()
  for n = 1, N do p[n - 1] = vals[n] end
  if dev ~= "cpu" then t = self:buffer("_len_dev", { N }, dev, "i64"):copy(t) end
  return t
end

-- x in time-major layout (a transposed copy when batch_first), after checking its shape.
function GRU:_timeMajor(x)
  local names = self.batch_first and { "N", "T", "C" } or { "T", "N", "C" }
  local shape = self.batch_first and { false, false, self.inputSize } or { false, false, self.inputSize }
  self:checkInput(x, shape, names)
  if x:device() ~= self.weights[0][0].W:device() then
    self:fail("input is on %s but the parameters are on %s (call model:to('%s'))", x:device(), self.weights[0][0].W:device(), x:device())
  end
  if not self.batch_first then return x end
  local s = x:shape()
  return x:transpose01(self:buffer("_x_tm", { s[2], s[1], s[3] }, x:device()))
end

-- The float step of one layer and direction (the quantized one is GRUQuant:forwardLayer).
-- hn [N, H] gets the final state (hs[T]: after lengths[n] steps).
function GRU:_forwardLayer(ctx, l, d, y, inp, h0v, lengths, hn, training)
  local key = l * self.dirs + d
  local T, N, H = inp:size(1), inp:size(2), self.hiddenSize
  local hs = self:buffer("_hs" .. key, { T + 1, N, H }, inp:device())
  local gates = training and self:buffer("_gates" .. key, { T, N, 4 * H }, inp:device()) or nil
  self._hs[key], self._gates[key] = hs, gates
  local w = self.weights[l][d]
  self:ccall(ctx, lib.qg_gru_forward(ctx, y.t, d * H, hs.t, gates and gates.t or nil, nil, inp.t, w.W.t, w.R.t,
                                     w.bx.t, w.br.t, h0v and h0v.t or nil, lengths and lengths.t or nil, d))
  hn:copy(hs:select(T + 1))
end

-- Both directions of a float bidirectional layer in one call (the GPU runs them at the same time).
local out_pair, in_pair = ffi.typeof("qg_tensor*[2]"), ffi.typeof("const qg_tensor*[2]")
local function pair(a, b) return out_pair(a, b) end     -- outputs (qg_tensor *const *)
local function cpair(a, b) return in_pair(a, b) end     -- inputs (const qg_tensor *const *)

function GRU:_forwardBidir(ctx, l, y, inp, h0, lengths, hn, training)
  local T, N, H = inp:size(1), inp:size(2), self.hiddenSize
  local hs, gates, w = {}, {}, {}
  for d = 0, 1 do
    local key = l * 2 + d
    hs[d] = self:buffer("_hs" .. key, { T + 1, N, H }, inp:device())
    gates[d] = training and self:buffer("_gates" .. key, { T, N, 4 * H }, inp:device()) or nil
    self._hs[key], self._gates[key] = hs[d], gates[d]
    w[d] = self.weights[l][d]
  end
  -- the views stay referenced (locals) until the call returns: their finalizers free the C structs
  local h0a, h0b = h0 and h0:select(l * 2 + 1), h0 and h0:select(l * 2 + 2)
  local h0p = h0 and cpair(h0a.t, h0b.t) or nil
  self:ccall(ctx, lib.qg_gru_forward_bidir(ctx, y.t, pair(hs[0].t, hs[1].t), training and pair(gates[0].t, gates[1].t) or nil,
                                           inp.t, cpair(w[0].W.t, w[1].W.t), cpair(w[0].R.t, w[1].R.t),
                                           cpair(w[0].bx.t, w[1].bx.t), cpair(w[0].br.t, w[1].br.t), h0p,
                                           lengths and lengths.t or nil))
  for d = 0, 1 do hn:select(l * 2 + d + 1):copy(hs[d]:select(T + 1)) end
  return h0a, h0b   -- (keeps the views alive through the call)
end

function GRU:_backwardBidir(ctx, l, dx, dy, dh0, inp, lengths)
  local w, g = self.weights[l], self.grads[l]
  local dh0a, dh0b = dh0 and dh0:select(l * 2 + 1), dh0 and dh0:select(l * 2 + 2)
  local dh0p = dh0 and pair(dh0a.t, dh0b.t) or nil
  self:ccall(ctx, lib.qg_gru_backward_bidir(ctx, dx.t, pair(g[0].W.t, g[1].W.t), pair(g[0].R.t, g[1].R.t),
                                            pair(g[0].bx.t, g[1].bx.t), pair(g[0].br.t, g[1].br.t), dh0p, dy.t, nil, inp.t,
                                            cpair(w[0].W.t, w[1].W.t), cpair(w[0].R.t, w[1].R.t),
                                            cpair(self._hs[l * 2].t, self._hs[l * 2 + 1].t),
                                            cpair(self._gates[l * 2].t, self._gates[l * 2 + 1].t),
                                            lengths and lengths.t or nil))
  return dh0a, dh0b   -- (keeps the views alive through the call)
end

function GRU:_backwardLayer(ctx, l, d, dx, dy, dh0v, inp, lengths)
  local key = l * self.dirs + d
  local w, g = self.weights[l][d], self.grads[l][d]
  self:ccall(ctx, lib.qg_gru_backward(ctx, dx.t, g.W.t, g.R.t, g.bx.t, g.br.t, dh0v and dh0v.t or nil, dy.t, d * self.hiddenSize,
                                      nil, inp.t, w.W.t, w.R.t, self._hs[key].t, self._gates[key].t,
                                      lengths and lengths.t or nil, d))
end

-- The quantization state when it is attached and enabled (then it runs each layer's step).
function GRU:_quant()
  local q = self.qstate
  return q and q.enabled and q or nil
end

function GRU:updateOutput(input)
  local x, h0, lens = split_input(self, input)
  local xt = self:_timeMajor(x)
  local T, N = xt:size(1), xt:size(2)
  local H, D, L = self.hiddenSize, self.dirs, self.layers
  local dev = xt:device()
  if h0 then self:checkInput(h0, { L * D, N, H }, nil, "h0") end
  local lengths = self:_lengthsTensor(lens, T, N, dev)
  self._lengths_used = lengths
  local q = self:_quant()
  if q then q:check(xt) end
  local training = self.train and not (q and q:calibrating())
  local ctx = clib.context(dev)
  self._hs, self._gates, self._ys = self._hs or {}, self._gates or {}, self._ys or {}
  -- h_n [L*D, N, H]: each layer and direction writes its final state into its slice
  local hn = self:buffer("h_n", { L * D, N, H }, dev)
  local inp = xt
  for l = 0, L - 1 do
    local y = self:buffer("_y" .. l, { T, N, D * H }, dev)
    self._ys[l] = y
    if D == 2 and not q then
      self:_forwardBidir(ctx, l, y, inp, h0, lengths, hn, training)
    elseif D == 2 and not q:calibrating() then
      q:forwardBidir(ctx, l, y, inp, h0, lengths, hn, training)
    else
      for d = 0, D - 1 do
        local h0v = h0 and h0:select(l * D + d + 1) or nil
        local hnv = hn:select(l * D + d + 1)
        if q then q:forwardLayer(ctx, l, d, y, inp, h0v, lengths, hnv, training)
        else self:_forwardLayer(ctx, l, d, y, inp, h0v, lengths, hnv, training) end
      end
    end
    inp = y
  end
  self._trained_forward = training
  self._forward_kind = q and "quant" or "float"
  if self.batch_first then
    self.output = inp:transpose01(self:buffer("_out_bf", { N, T, D * H }, dev))
  else
    self.output = inp
  end
  return self.output
end

function GRU:_backward(input, gradOutput, scale)
  if not self._trained_forward then
    self:fail("backward needs the forward to run in training mode (call model:training() before forward)")
  end
  local q = self:_quant()
  if (q and "quant" or "float") ~= self._forward_kind then
    self:fail("the forward ran %s but quantization is now %s: run the forward again", self._forward_kind, q and "on" or "off")
  end
  local x, h0 = split_input(self, input)
  local lengths = self._lengths_used
  local xt = self.batch_first and self._x_tm or x
  local T, N = xt:size(1), xt:size(2)
  local H, D, L = self.hiddenSize, self.dirs, self.layers
  local dev = xt:device()
  self:checkInput(gradOutput, self.batch_first and { N, T, D * H } or { T, N, D * H }, nil, "gradOutput")
  local dy = gradOutput
  if self.batch_first then dy = gradOutput:transpose01(self:buffer("_dy_tm", { T, N, D * H }, dev)) end
  if scale ~= 1 then
    dy = self:buffer("_dy_scaled", { T, N, D * H }, dev):copy(dy):mul(scale)
  end
  local ctx = clib.context(dev)
  local dh0 = h0 and self:buffer("_dh0", { L * D, N, H }, dev) or nil
  local dx
  for l = L - 1, 0, -1 do
    local inp = l == 0 and xt or self._ys[l - 1]
    dx = l == 0 and self:buffer("_dx_tm", { T, N, self.inputSize }, dev) or self:buffer("_dy" .. (l - 1), { T, N, D * H }, dev)
    dx:zero()
    local dyl = l == L - 1 and dy or self["_dy" .. l]
    if D == 2 and not q then
      self:_backwardBidir(ctx, l, dx, dyl, dh0, inp, lengths)
    elseif D == 2 then
      q:backwardBidir(ctx, l, dx, dyl, dh0)
    else
      for d = 0, D - 1 do
        local dh0v = dh0 and dh0:select(l * D + d + 1) or nil
        if q then q:backwardLayer(ctx, l, d, dx, dyl, dh0v) else self:_backwardLayer(ctx, l, d, dx, dyl, dh0v, inp, lengths) end
      end
    end
  end
  if self.batch_first then dx = dx:transpose01(self:buffer("_dx_bf", { N, T, self.inputSize }, dev)) end
  self.gradInput = h0 and { dx, dh0 } or dx
  return self.gradInput
end

function GRU:updateGradInput(input, gradOutput)
  self:_backward(input, gradOutput, 1)
  self._grads_done = true
  return self.gradInput
end

function GRU:accGradParameters(input, gradOutput, scale)
  if self._grads_done then self._grads_done = false; return end
  -- Parameter gradients were not produced by updateGradInput: run the fused backward now
  -- (its gradInput is discarded; nn semantics keep the last one).
  local keep = self.gradInput
  self:_backward(input, gradOutput, scale or 1)
  self.gradInput = keep or self.gradInput
end

function GRU:backward(input, gradOutput, scale)
  self._grads_done = false
  return self:_backward(input, gradOutput, scale or 1)
end

function GRU:clearState()
  for k in pairs(self) do
    if type(k) == "string" and (k:match("^_y%d") or k:match("^_hs%d") or k:match("^_gates%d") or k:match("^_dy")
        or k:match("^_dx") or k:match("^_q_") or k:match("^_len_") or k == "_x_tm" or k == "_out_bf" or k == "_dh0" or k == "h_n") then
      self[k] = nil
    end
  end
  self._hs, self._gates, self._ys = nil, nil, nil
  return Module.clearState(self)
end

function GRU:__tostring()
  local q = self.qstate and ("\n  " .. self.qstate:describe():gsub("\n", "\n  ")) or ""
  return string.format("nn.GRU(%d -> %d, layers=%d%s%s)  -- %d parameters", self.inputSize, self.hiddenSize, self.layers,
                       self.bidirectional and ", bidirectional" or "", self.batch_first and ", batch_first" or "",
                       self:numParameters()) .. q
end

return GRU
