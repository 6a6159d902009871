-- tests/export/make_cases.lua: writes the ONNX export test cases into DIR (./qgru tests/export/make_cases.lua DIR):
-- for each random quantized model (tests/lua/export_util.lua) a folder DIR/<case>/ with the model
-- data and ONNX files of recipes/export.lua --format onnx (lua/qgru/deploy), the inputs (x.npy,
-- h0.npy, lengths.npy) and qgru's integer forward outputs (y_ref.npy, hn_ref.npy, logits_ref.npy),
-- plus DIR/cases.json listing them. tests/export/check_onnx.py then runs them with onnxruntime.
-- Also checks here that the ONNX export refuses, naming the operator, what it cannot hold exactly.
local root = os.getenv("QGRU_ROOT") or "."
package.path = root .. "/tests/lua/?.lua;" .. package.path
local qgru = require("qgru")
local E = require("export_util")
local deploy = require("qgru.deploy")
local json, data = qgru.json, qgru.data

local dir = assert(arg[1], "usage: make_cases.lua DIR")
qgru.serialize.mkdir(dir)

local int8 = function() return qgru.quant.uniform(8) end
local function cfgt(over) return qgru.quant.fromTable(json.decode(json.encode({ GRU_config = { operator_config = over } })), "test") end
local cases = {
  -- bit-exact integer graph (Scan), 1-3 layers, bidirectional, h0, lengths, mixed 2..8 bits
  { name = "mixed_l1", seed = 301, T = 7, N = 4, C = 3, H = 5, L = 1, bidir = false, h0 = false, lengths = true, lo = 2, hi = 8 },
  { name = "mixed_l1_bidir_head", seed = 302, T = 8, N = 5, C = 4, H = 4, L = 1, bidir = true, h0 = true, lengths = true, lo = 2, hi = 8, head = 3 },
  { name = "mixed_l2_bidir", seed = 303, T = 6, N = 4, C = 3, H = 4, L = 2, bidir = true, h0 = true, lengths = true, lo = 2, hi = 8 },
  { name = "mixed_l3", seed = 304, T = 5, N = 3, C = 2, H = 3, L = 3, bidir = false, h0 = true, lengths = true, lo = 2, hi = 8, method = "histogram" },
  -- 9..12-bit operators: 16-bit QuantizeLinear (opset 21) and int32 MatMul
  { name = "wide_l2_bidir", seed = 305, T = 6, N = 3, C = 3, H = 3, L = 2, bidir = true, h0 = true, lengths = true, lo = 6, hi = 11 },
  -- 16-bit biases (fine per-channel exponents) with 8-bit matmuls and 12-bit pre-activations:
  -- the aligned sums need the guard / sticky reduction of tools/onnx_export.py (all its branches)
  { name = "fine_bias_l1_bidir", seed = 313, T = 7, N = 4, C = 3, H = 6, L = 1, bidir = true, h0 = true, lengths = true,
    cfg = cfgt({ ["weight.bw"] = { bitwidth = 16 }, ["weight.br"] = { bitwidth = 16 }, ["gate.z_pre"] = { bitwidth = 12 },
                 ["gate.r_pre"] = { bitwidth = 12 }, ["gate.g_pre"] = { bitwidth = 10 }, ["matmul.Rh"] = { bitwidth = 6 } }) },
  -- unrolled for a fixed T
  { name = "mixed_l2_unrolled", seed = 306, T = 5, N = 3, C = 3, H = 4, L = 2, bidir = true, h0 = true, lengths = true, lo = 2, hi = 8, unroll = 5 },
  -- int8 models: the QDQ approximation is compared with a tolerance
  { name = "int8_l1_head", seed = 307, T = 12, N = 16, C = 6, H = 16, L = 1, bidir = false, h0 = false, lengths = true, cfg = int8(), head = 4,
    method = "histogram", qdq = "8" },
  { name = "int8_l2_bidir", seed = 308, T = 10, N = 16, C = 5, H = 12, L = 2, bidir = true, h0 = true, lengths = true, cfg = int8(),
    method = "histogram", qdq = "8" },
  -- 16 bits everywhere, wide ranges: only the QDQ form (the integers exceed float32's), which must
  -- then be close to qgru: this checks the QDQ graph's wiring (gate order, biases, directions)
  { name = "int16_l2_bidir_qdq", seed = 309, T = 8, N = 6, C = 3, H = 5, L = 2, bidir = true, h0 = true, lengths = true,
    cfg = qgru.quant.uniform(16), widen = true, qdq = "16", qdq_only = true },
}

local list = {}
for _, c in ipairs(cases) do
  local r = E.build(c)
  local cdir = dir .. "/" .. c.name
  local res = deploy.exportONNX(r.model, cdir, { unroll = c.unroll, qdq_only = c.qdq_only, source_info = "test case " .. c.name })
  E.saveInputs(r, cdir)
  data.saveNpy(cdir .. "/y_ref.npy", r.y)
  data.saveNpy(cdir .. "/hn_ref.npy", r.hn)
  if r.logits then data.saveNpy(cdir .. "/logits_ref.npy", r.logits) end
  list[#list + 1] = json.object("name", c.name, "dir", c.name, "opset", res.opset, "qdq", c.qdq or false,
                                "unroll", c.unroll or 0, "qdq_only", c.qdq_only == true)
  print(string.format("case %s: opset %d%s", c.name, res.opset, c.unroll and (", unrolled T=" .. c.unroll) or ""))
end
json.write(dir .. "/cases.json", json.array(list))

-- refusals: they must name the operator
local function refused(c, pattern)
  local r = E.build(c)
  local ok, err = pcall(deploy.exportONNX, r.model, dir .. "/refused", {})
  assert(not ok, "expected a refusal for " .. c.name)
  assert(tostring(err):match(pattern), "refusal of " .. c.name .. " does not match '" .. pattern .. "': " .. tostring(err))
  print("refused as expected: " .. tostring(err))
end
local function cfg(over) return qgru.quant.fromTable(json.decode(json.encode({ GRU_config = { operator_config = over } })), "test") end
refused({ name = "float32 range", seed = 310, T = 3, N = 2, C = 3, H = 4, L = 1,
          cfg = cfg({ ["input.x"] = { bitwidth = 16 }, ["weight.W"] = { bitwidth = 16 } }) },
        "export onnx: l0%.fwd%.matmul%.Wx: the accumulator of weight%.W times input%.x reaches 2%^[%d.]+")
refused({ name = "20-bit rRh", seed = 311, T = 3, N = 2, C = 3, H = 4, L = 1, cfg = cfg({ ["op.rRh"] = { bitwidth = 20 } }) },
        "export onnx: l0%.fwd%.op%.rRh has 20 bits")
refused({ name = "20-bit GEMM operand", seed = 312, T = 3, N = 2, C = 3, H = 4, L = 1, cfg = cfg({ ["input.x"] = { bitwidth = 20 } }) },
        "export onnx: l0%.fwd%.input%.x has 20 bits: GEMM operands above 16 bits")
print(#list .. " cases written to " .. dir)
