-- deploy/onnx_data.lua: the data an ONNX model of the integer GRU is built from, checked for
-- exactness in ONNX and written as a folder: model.json (sizes, every quantizer, the operator
-- plan) and .npy arrays (weight codes, per-channel exponents and zero points, activation tables,
-- the float head). tools/onnx_export.py builds the graphs from it with the onnx library.
--
--   local od = require("qgru.deploy.onnx_data")
--   od.write(desc, dir)   -- desc from deploy/model.lua
--
-- Exactness in ONNX (checked here, refused with the operator's name otherwise): every
-- requantization is Cast(int32 -> float) then QuantizeLinear with a power-of-two scale, which is
-- the exact rounding shift of QUANT_SPEC.md only while the integer is exact in float32, so every
-- GEMM accumulator, aligned sum and product must stay within 2^24; QuantizeLinear's outputs are
-- 8-bit (opset 13) or 16-bit (opset 21) types, so requantized operators have at most 16 bits.
local D = require("qgru.deploy.model")
local data = require("qgru.data")
local json = require("qgru.json")
local Tensor = require("qgru.tensor")

local M = {}

local F32_EXACT = 2 ^ 24

local function fail(fmt, ...) error("qgru: export onnx: " .. string.format(fmt, ...), 0) end

-- Operators whose codes come out of a QuantizeLinear (the others come from tables).
M.REQUANTIZED = { "input.x", "matmul.Wx", "matmul.Rh", "gate.z_pre", "gate.r_pre", "gate.g_pre", "op.rRh", "op.old_contrib",
                  "op.new_contrib", "output.h" }

-- Checks every bound of desc for the integer ONNX graph; returns the opset it needs (13 when every
-- requantized operator has at most 8 bits, else 21 for 16-bit QuantizeLinear outputs).
function M.check(desc)
  local opset = 13
  for _, L in ipairs(desc.layer) do
    local A = L.act
    for _, op in ipairs(M.REQUANTIZED) do
      local q = A[op]
      if q.bits > 16 then
        fail("%s.%s has %d bits: QuantizeLinear gives 8- or 16-bit codes, so this requantization has no exact ONNX form (use --format c)",
             L.name, op, q.bits)
      end
      if q.bits > 8 then opset = 21 end
    end
    for _, g in ipairs({ { "W", "input.x", "matmul.Wx" }, { "R", "output.h", "matmul.Rh" } }) do
      local b = D.gemmBound(L.w[g[1]], A[g[2]])
      if b > F32_EXACT then
        fail("%s.%s: the accumulator of %s times %s reaches 2^%.1f > 2^24, beyond float32's exact integers (the Cast before QuantizeLinear would round it); lower the bitwidths of %s / %s, or use --format c (or --qdq_only for the float approximation)",
             L.name, g[3], D.WEIGHT_OP[g[1]], g[2], D.log2(b), D.WEIGHT_OP[g[1]], g[2])
      end
    end
    for i = 1, L.H do
      for _, s in ipairs(D.cellSums(L, i)) do
        if s.bound > F32_EXACT then
          local labels = {}
          for _, t in ipairs(s.terms) do labels[#labels + 1] = t.label end
          fail("%s.%s: the aligned sum of %s reaches 2^%.1f > 2^24 at the finest scale (unit %d), beyond float32's exact integers (use --format c)",
               L.name, s.name, table.concat(labels, ", "), D.log2(s.bound), i - 1)
        end
      end
    end
    for _, p in ipairs(D.cellProducts(L)) do
      if p.a * p.b > F32_EXACT then
        fail("%s.%s: the product %s reaches 2^%.1f > 2^24, beyond float32's exact integers (use --format c)", L.name, p.name, p.what,
             D.log2(p.a * p.b))
      end
    end
  end
  return opset
end

local function q_entry(q)
  return json.object("bits", q.bits, "unsigned", q.uns, "exp2_inv", q.e, "zero_point", q.z, "qmin", q.qmin, "qmax", q.qmax)
end

local function save(dir, file, vals, shape, dtype)
  local t = Tensor.from(vals, dtype)
  if shape then t = t:view(shape) end
  data.saveNpy(dir .. "/" .. file, t)
  return file
end

-- Writes dir/model.json and the arrays; returns the path of model.json and the opset.
-- opts.qdq_only: the data for the QDQ approximation only (the exactness checks are skipped).
function M.write(desc, dir, opts)
  opts = opts or {}
  local opset = opts.qdq_only and 13 or M.check(desc)   -- (the QDQ form sets its own opset)
  local layers = {}
  for _, L in ipairs(desc.layer) do
    local act = {}
    for op, q in pairs(L.act) do act[#act + 1] = op; act[#act + 1] = q_entry(q) end
    local ws = {}
    for _, key in ipairs({ "W", "R", "bx", "br" }) do
      local w = L.w[key]
      local base = L.name .. "." .. key
      ws[#ws + 1] = key
      ws[#ws + 1] = json.object("op", D.WEIGHT_OP[key], "bits", w.bits, "unsigned", w.uns, "qmin", w.qmin, "qmax", w.qmax,
        "codes", save(dir, base .. ".codes.npy", w.codes, w.cols > 1 and { w.rows, w.cols } or { w.rows }, "i32"),
        "exp2_inv", save(dir, base .. ".exp2_inv.npy", w.e, nil, "i32"),
        "zero_point", save(dir, base .. ".zero_point.npy", w.z, nil, "i32"))
    end
    local tabs = {}
    for _, g in ipairs({ "z", "r", "g" }) do
      tabs[#tabs + 1] = g
      tabs[#tabs + 1] = save(dir, L.name .. ".table_" .. g .. ".npy", L.lut[g], nil, "i32")
    end
    layers[#layers + 1] = json.object("layer", L.l, "direction", L.d == 0 and "fwd" or "bwd", "name", L.name, "input_size", L.C,
      "hidden_size", L.H, "act", json.object(unpack(act)), "weights", json.object(unpack(ws)), "tables", json.object(unpack(tabs)))
  end
  local head = json.null
  if desc.head then
    local hd = desc.head
    local bias = hd.bias
    if not bias then bias = {}; for i = 1, hd.outputs do bias[i] = 0 end end
    head = json.object("inputs", hd.inputs, "outputs", hd.outputs,
      "weight", save(dir, "head.weight.npy", hd.weight, { hd.outputs, hd.inputs }, "f32"),
      "bias", save(dir, "head.bias.npy", bias, nil, "f32"))
  end
  local doc = json.object("format", "qgru-onnx-data", "version", 1, "source", opts.source_info or "a quantized qgru model",
    "input_size", desc.input_size, "hidden_size", desc.hidden_size, "layers", desc.layers, "directions", desc.dirs,
    "output_size", desc.output_size, "gate_order", "z,r,g", "rounding", "half_to_even", "opset", opset,
    "layers_params", json.array(layers), "head", head)
  local path = dir .. "/model.json"
  json.write(path, doc)
  return path, opset
end

return M
