-- deploy/onnx_data.lua: the data an ONNX model of the integer GRU is built from, checked for
-- exactness in ONNX and written as a folder: model.json (sizes, every quantizer, the operator
-- plan) and .npy arrays (weight codes, per-channel exponents and zero points, activation tables,
-- the float head). tools/onnx_export.py builds the graphs from it with the onnx library.
--
--   local od = require("qgru.deploy.onnx_data")
--   od.write(desc, dir)   -- desc from deploy/model.lua
--
-- What is integer-deployable at all is checked by deploy/model.lua; what ONNX can hold exactly
-- (float32's exact integers before each QuantizeLinear, 8/16-bit QuantizeLinear outputs) is
-- checked by tools/onnx_export.py where it builds each operator, and refused there with the
-- operator's name.
local D = require("qgru.deploy.model")
local data = require("qgru.data")
local json = require("qgru.json")
local Tensor = require("qgru.tensor")

local M = {}

local function q_entry(q)
  return json.object("bits", q.bits, "unsigned", q.uns, "exp2_inv", q.e, "zero_point", q.z, "qmin", q.qmin, "qmax", q.qmax)
end

local function save(dir, file, vals, shape, dtype)
  local t = Tensor.from(vals, dtype)
  if shape then t = t:view(shape) end
  data.saveNpy(dir .. "/" .. file, t)
  return file
end

-- Writes dir/model.json and the arrays; returns the path of model.json.
function M.write(desc, dir, opts)
  opts = opts or {}
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
    "output_size", desc.output_size, "gate_order", "z,r,g", "rounding", "half_to_even",
    "layers_params", json.array(layers), "head", head)
  local path = dir .. "/model.json"
  json.write(path, doc)
  return path
end

return M
