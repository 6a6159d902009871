-- recipes/export.lua: exports a trained, quantized model for deployment tools. Loads float
-- weights and a qgru-qparams file (from recipes/qat.lua or recipes/calibrate.lua), checks the
-- integer model on the test set, and writes the parameters in every format:
-- runs/<name>/: qparams.json (qgru-qparams v1), qparams.aimet.json (AIMET encodings 1.0.0),
-- weight_codes.safetensors (integer weight codes + per-channel exponents and zero points).
--   ./qgru recipes/export.lua [--weights runs/qat/model.safetensors] [--qparams runs/qat/qparams.json]
local qgru = require("qgru")
local quant, cli, zoo, train = qgru.quant, qgru.cli, qgru.zoo, qgru.train

local opt = cli.main(arg, {
  name = { "export", "run name (folder under runs/)", { nonempty = true } },
  weights = { "runs/qat/model.safetensors", "model weights" },
  qparams = { "runs/qat/qparams.json", "quantization parameters (qgru-qparams v1)" },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  evaluate = { true, "check the integer model's test accuracy" },
  device = { qgru.device(), "cpu | cuda (default: cuda when a GPU is present; QGRU_DEVICE overrides)", { choices = { "cpu", "cuda" } } },
}, "recipes/export.lua: qgru-qparams, AIMET encodings and integer weight codes", function(o)
  for _, p in ipairs({ o.weights, o.qparams }) do
    if not zoo.exists(p) then error("qgru: " .. p .. " does not exist: run recipes/qat.lua first (or pass --weights / --qparams)", 0) end
  end
  qgru.setDevice(o.device)
end)

local dir, log = zoo.run(opt.name)
log("qgru " .. qgru.VERSION .. "  recipes/export.lua\n" .. cli.describe(opt))
log("device: " .. qgru.device() .. (qgru.device() == "cuda" and ("  (math " .. qgru.math() .. ")") or ""))
local model = zoo.fmnistGRU(opt.hidden)
qgru.load(model, opt.weights)
quant.prepare(model, quant.uniform(8))   -- bitwidths and parameters come from the file
quant.load(model, opt.qparams)
log(tostring(model))
if opt.evaluate then
  local _, testset = zoo.fmnist()
  local _, acc = train.Engine{ model = model, criterion = qgru.nn.CrossEntropy(), log = log }:evaluate(testset, 256)
  log(string.format("integer model test accuracy %.2f%%", 100 * acc))
end
quant.export(model, dir .. "/qparams.json")
quant.export(model, dir .. "/qparams.aimet.json", { format = "aimet" })
quant.exportWeights(model, dir .. "/weight_codes.safetensors")
log("wrote " .. dir .. "/qparams.json, qparams.aimet.json, weight_codes.safetensors")
