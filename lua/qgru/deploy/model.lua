-- deploy/model.lua: the integer model a deployment export writes, read from a quantized qgru
-- model as plain Lua values, and the checks every deployment export shares.
--
--   local desc = require("qgru.deploy.model").describe(model, {what = "export c"})
--
-- desc = {input_size, hidden_size, layers, dirs, output_size (= dirs * H), batch_first,
--   layer = {[k] = {l, d, name = "l0.fwd", C, H,             -- k = l * dirs + d + 1
--     act = {["input.x"] = {bits, uns, e, z, qmin, qmax, name}, ...}   13 activation quantizers
--     w = {W = {bits, uns, e = {..}, z = {..}, codes = {..}, qmin, qmax, rows, cols, name}, R, bx, br}
--                                                              per-channel, rows in gate order z, r, g
--     lut = {z = {..}, r = {..}, g = {..}}                    activation tables: lut.z[q - qmin + 1]
--   }},                                                        = the gate.z_out code of z_pre code q
--   head = nil | {inputs, outputs, weight = {..} (row-major [outputs][inputs]), bias = {..}}}
--
-- What is integer-deployable (QUANT_SPEC.md section 3): GEMM operands (input.x, output.h,
-- weight.W, weight.R) and pre-activations (gate.*_pre) of at most 16 bits. Anything wider is
-- simulated in float by qgru itself, so no integer export can reproduce it: describe() refuses
-- it and names the operator. Format-specific limits (64-bit sums for C, float32's exact
-- integers for ONNX) are checked by the exporters with the bounds computed here.
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local config = require("qgru.quant.config")

local ffi, lib = clib.ffi, clib.lib

local M = {}

local WEIGHT_KEY = { ["weight.W"] = "W", ["weight.R"] = "R", ["weight.bw"] = "bx", ["weight.br"] = "br" }
M.WEIGHT_KEY = WEIGHT_KEY
M.WEIGHT_OP = { W = "weight.W", R = "weight.R", bx = "weight.bw", br = "weight.br" }

-- qmin, qmax of a grid (as qgru's C library defines them).
local function grid(bits, uns)
  if uns then return 0, 2 ^ bits - 1 end
  return -2 ^ (bits - 1), 2 ^ (bits - 1) - 1
end
M.grid = grid

local function fail(what, fmt, ...)
  error("qgru: " .. what .. ": " .. string.format(fmt, ...), 0)
end

-- The model's parts: the GRU and an optional head (nn.Last then nn.Linear).
local function parts(model, what)
  local nn = require("qgru.nn")
  if model:isInstanceOf(nn.GRU) then return model, nil end
  if not model:isInstanceOf(nn.Sequential) then
    fail(what, "expected an nn.GRU or an nn.Sequential (GRU [, Last [, Linear]]), got %s", tostring(model.__name or "a module"))
  end
  local mods = model.modules
  local names = {}
  for i, m in ipairs(mods) do names[i] = m.__name or "?" end
  local ok = #mods >= 1 and mods[1]:isInstanceOf(nn.GRU)
      and (#mods < 2 or mods[2]:isInstanceOf(nn.Last))
      and (#mods < 3 or mods[3]:isInstanceOf(nn.Linear)) and #mods <= 3
  if not ok then
    fail(what, "the deployment exports take nn.GRU, optionally followed by nn.Last and nn.Linear; this model is Sequential(%s)",
         table.concat(names, ", "))
  end
  return mods[1], mods[3], mods[2]
end

-- Largest |q - z| over a grid for one zero point.
function M.maxCentered(q, z)
  z = z or q.z
  return math.max(q.qmax - z, z - q.qmin)
end

local function plain(q, name)
  local e, z = q:get()
  local qmin, qmax = grid(q.bitwidth, q.is_unsigned)
  return { bits = q.bitwidth, uns = q.is_unsigned, e = e, z = z, qmin = qmin, qmax = qmax, name = name, op = q.op }
end

local function tolist(t)
  local p, n, out = t:ptr(), t:numel(), {}
  for i = 1, n do out[i] = tonumber(p[i - 1]) end
  Tensor.keepAlive(t)   -- t (often a temporary host copy) stays alive while read through p
  return out
end

-- The activation table of pre-activation P to output O (fn 0 sigmoid, 1 tanh), built by qgru's C
-- library exactly as the layer builds its own (QUANT_SPEC.md section 3).
local function table_of(P, O, fn)
  local ctx = clib.context("cpu")
  local n = 2 ^ P.bits
  local lut = Tensor.new({ 2 * n }, "i32", "cpu")
  local pre = ffi.new("qg_qspec", P.bits, P.uns and 1 or 0, P.e, P.z)
  local out = ffi.new("qg_qspec", O.bits, O.uns and 1 or 0, O.e, O.z)
  clib.check(ctx, lib.qg_build_act_table(ctx, lut.t, pre, out, fn), 3)
  local p, codes = lut:ptr(), {}
  for i = 1, n do codes[i] = tonumber(p[i - 1]) end
  lut:free()
  return codes
end

-- The deploy description of a quantized model (see the top of this file). opts.what names the
-- export in error messages ("export c", "export onnx").
function M.describe(model, opts)
  opts = opts or {}
  local what = opts.what or "deploy"
  local gru, linear, last = parts(model, what)
  local st = gru.qstate
  if not st then fail(what, "the GRU has no quantizers: call quant.prepare and quant.calibrate (or quant.load) first") end
  if not st.enabled then
    fail(what, "quantization is disabled on the GRU (disable_quantization or quant.enable(model, false)): there is no integer model to export")
  end
  if linear and not last then fail(what, "nn.Linear must follow nn.Last") end
  local desc = {
    input_size = gru.inputSize, hidden_size = gru.hiddenSize, layers = gru.layers, dirs = gru.dirs,
    output_size = gru.dirs * gru.hiddenSize, batch_first = gru.batch_first, layer = {},
  }
  for lq in st:each() do
    local ok, missing = lq:ready()
    if not ok then fail(what, "%s is not calibrated: run quant.calibrate or quant.load first", missing) end
    local L = { l = lq.l, d = lq.d, name = lq.name, C = lq.C, H = lq.H, act = {}, w = {} }
    local qs = lq:quantizers()
    for _, op in ipairs(config.ACT_OPS) do L.act[op] = plain(qs[op], lq.name .. "." .. op) end
    -- integer-deployable: GEMM operands and pre-activations of at most 16 bits
    for _, op in ipairs({ "input.x", "output.h", "weight.W", "weight.R" }) do
      local q = qs[op]
      if q.bitwidth > 16 then
        fail(what, "%s.%s has %d bits: GEMM operands above 16 bits are simulated in float by qgru (QUANT_SPEC.md section 3), so the model is not integer-deployable",
             lq.name, op, q.bitwidth)
      end
    end
    for _, op in ipairs({ "gate.z_pre", "gate.r_pre", "gate.g_pre" }) do
      local q = qs[op]
      if q.bitwidth > config.LUT_MAX_BITS then
        fail(what, "%s.%s has %d bits: activations of pre-activations above %d bits are evaluated in float (no table), so the model is not integer-deployable",
             lq.name, op, q.bitwidth, config.LUT_MAX_BITS)
      end
    end
    for i, op in ipairs(config.WEIGHT_OPS) do
      local key = WEIGHT_KEY[op]
      local q = qs[op]
      local w = plain(q, lq.name .. "." .. op)
      local codes = lq:weightCodes(i)
      w.codes = tolist(codes)
      w.rows = 3 * lq.H
      w.cols = key == "W" and lq.C or (key == "R" and lq.H or 1)
      L.w[key] = w
    end
    local A = L.act
    L.lut = {
      z = table_of(A["gate.z_pre"], A["gate.z_out"], 0),
      r = table_of(A["gate.r_pre"], A["gate.r_out"], 0),
      g = table_of(A["gate.g_pre"], A["gate.g_out"], 1),
    }
    desc.layer[lq.key + 1] = L
  end
  if linear then
    local W = linear.weight:device() == "cpu" and linear.weight or linear.weight:to("cpu")
    desc.head = { inputs = linear.inputSize, outputs = linear.outputSize, weight = tolist(W) }
    if linear.bias then
      local b = linear.bias:device() == "cpu" and linear.bias or linear.bias:to("cpu")
      desc.head.bias = tolist(b)
    end
    if linear.inputSize ~= desc.output_size then
      fail(what, "nn.Linear takes %d inputs but the GRU gives %d", linear.inputSize, desc.output_size)
    end
  end
  desc.last = last ~= nil
  return desc
end

-- ---- bounds shared by the exporters ----------------------------------------------------------
-- Every integer of the step is bounded from the grids (and, for constants, the actual codes).
-- A sum is described by its terms {m = max |term|, e = exponent} aligned to the finest scale.

-- Largest |centered code| of an activation quantizer.
function M.actMax(q) return M.maxCentered(q) end

-- Largest |code - z| of channel j of a per-channel weight (actual codes).
function M.weightRowMax(w, j)
  local m = 0
  for c = 1, w.cols do
    local v = math.abs(w.codes[(j - 1) * w.cols + c] - w.z[j])
    if v > m then m = v end
  end
  return m
end

-- Largest |accumulator| of the GEMM of weight w (W or R) with an input quantizer q:
-- max over rows of sum_k |W[j][k] - z_j| * max|x - z_x|.
function M.gemmBound(w, q)
  local xm, best = M.maxCentered(q), 0
  for j = 1, w.rows do
    local s = 0
    for c = 1, w.cols do s = s + math.abs(w.codes[(j - 1) * w.cols + c] - w.z[j]) end
    if s * xm > best then best = s * xm end
  end
  return best
end

-- The five aligned sums and three products of the cell for channel i (1..H) of layer L, as
-- {name = operator, what = description, terms = {{m, e, label}}, out = quantizer} and
-- {name, a = max|a|, b = max|b|, out}. Used for the bounds of every exporter.
function M.cellSums(L, i)
  local A, H = L.act, L.H
  local WX, RH = A["matmul.Wx"], A["matmul.Rh"]
  local bx, br = L.w.bx, L.w.br
  -- a bias term's bound is its code (a constant), but at least 1: the shift to the finest scale
  -- is applied whatever the value, so it must stay within the integer type too
  local function bterm(w, j, label) return { m = math.max(1, math.abs(w.codes[j] - w.z[j])), e = w.e[j], label = label } end
  local out = {}
  for k, g in ipairs({ "z", "r" }) do
    local j = (k - 1) * H + i
    out[#out + 1] = { name = "gate." .. g .. "_pre", out = A["gate." .. g .. "_pre"],
      terms = { { m = M.maxCentered(WX), e = WX.e, label = "matmul.Wx" }, { m = M.maxCentered(RH), e = RH.e, label = "matmul.Rh" },
                bterm(bx, j, "weight.bw"), bterm(br, j, "weight.br") } }
  end
  local jg = 2 * H + i
  out[#out + 1] = { name = "matmul.Rh (Rh_g + br_g)", out = RH,
    terms = { { m = M.maxCentered(RH), e = RH.e, label = "matmul.Rh" }, bterm(br, jg, "weight.br") } }
  local RRH = A["op.rRh"]
  out[#out + 1] = { name = "gate.g_pre", out = A["gate.g_pre"],
    terms = { { m = M.maxCentered(WX), e = WX.e, label = "matmul.Wx" }, bterm(bx, jg, "weight.bw"),
              { m = M.maxCentered(RRH), e = RRH.e, label = "op.rRh" } } }
  local OLD, NEW = A["op.old_contrib"], A["op.new_contrib"]
  out[#out + 1] = { name = "output.h", out = A["output.h"],
    terms = { { m = M.maxCentered(OLD), e = OLD.e, label = "op.old_contrib" }, { m = M.maxCentered(NEW), e = NEW.e, label = "op.new_contrib" } } }
  for _, s in ipairs(out) do
    local emax = -math.huge
    for _, t in ipairs(s.terms) do emax = math.max(emax, t.e) end
    local b = 0
    for _, t in ipairs(s.terms) do b = b + t.m * 2 ^ (emax - t.e) end
    s.emax, s.bound, s.kind = emax, b, "sum"
  end
  return out
end

-- The products of the cell (the same for every channel).
function M.cellProducts(L)
  local A = L.act
  local Z, R, G, H = A["gate.z_out"], A["gate.r_out"], A["gate.g_out"], A["output.h"]
  local one = 2 ^ Z.e
  local onez = math.max(math.abs(one - (Z.qmin - Z.z)), math.abs(one - (Z.qmax - Z.z)))
  return {
    { name = "op.rRh", a = M.maxCentered(R), b = M.maxCentered(A["matmul.Rh"]), out = A["op.rRh"], s = R.e + A["matmul.Rh"].e, kind = "product",
      what = "(gate.r_out - z) * (Rh_g + br_g - z)" },
    { name = "op.old_contrib", a = M.maxCentered(Z), b = M.maxCentered(H), out = A["op.old_contrib"], s = Z.e + H.e, kind = "product",
      what = "(gate.z_out - z) * (h_{t-1} - z)" },
    { name = "op.new_contrib", a = onez, b = M.maxCentered(G), out = A["op.new_contrib"], s = Z.e + G.e, kind = "product",
      what = "(1 - z) * (gate.g_out - z)" },
  }
end

-- log2 for messages
function M.log2(v) return v > 0 and math.log(v) / math.log(2) or -math.huge end

return M
