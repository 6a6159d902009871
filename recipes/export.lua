-- recipes/export.lua: exports a trained, quantized model for deployment tools. Loads float
-- weights and a qgru-qparams file (from recipes/qat.lua or recipes/calibrate.lua), checks the
-- integer model on the test set, and writes the parameters in every format:
-- runs/<name>/: qparams.json (qgru-qparams v1), qparams.aimet.json (AIMET encodings 1.0.0),
-- weight_codes.safetensors (integer weight codes + per-channel exponents and zero points), and
-- run.json, options.json, log.txt, metrics.jsonl, metrics.json (qgru.rundir). The name is export
-- plus the options that differ from their defaults unless --name is given; a finished run is not
-- overwritten (--force moves it aside to runs/<name>.old-N).
--   ./qgru recipes/export.lua [--weights runs/qat/model.safetensors] [--qparams runs/qat/qparams.json]
local qgru = require("qgru")
local quant, cli, zoo, train, json, rundir = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.json, qgru.rundir

local spec = rundir.options({
  weights = { "runs/qat/model.safetensors", "model weights" },
  qparams = { "runs/qat/qparams.json", "quantization parameters (qgru-qparams v1)" },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  evaluate = { true, "check the integer model's test accuracy" },
})
local opt = cli.main(arg, spec, "recipes/export.lua: qgru-qparams, AIMET encodings and integer weight codes", function(o)
  for _, p in ipairs({ o.weights, o.qparams }) do
    if not zoo.exists(p) then error("qgru: " .. p .. " does not exist: run recipes/qat.lua first (or pass --weights / --qparams)", 0) end
  end
end)

local run = cli.guard(rundir.fromOptions, "export", spec, opt)
local model = zoo.fmnistGRU(opt.hidden)
cli.guard(qgru.load, model, opt.weights)   -- before anything is written or loaded
quant.prepare(model, quant.uniform(8))   -- bitwidths and parameters come from the file
cli.guard(quant.load, model, opt.qparams)
run:create()
local dir = run.dir
local function log(line) run:log(line) end
log("qgru " .. qgru.VERSION .. "  recipes/export.lua  ->  " .. dir .. "\n" .. cli.describe(opt))
log(tostring(model))
local acc
if opt.evaluate then
  local _, testset = zoo.fmnist()
  _, acc = train.Engine{ model = model, criterion = qgru.nn.CrossEntropy(), log = log }:evaluate(testset, 256)
  log(string.format("integer model test accuracy %.2f%%", 100 * acc))
end
quant.export(model, dir .. "/qparams.json")
quant.export(model, dir .. "/qparams.aimet.json", { format = "aimet" })
quant.exportWeights(model, dir .. "/weight_codes.safetensors")
log("wrote " .. dir .. "/qparams.json, qparams.aimet.json, weight_codes.safetensors")
run:finish(json.object("recipe", "export", "weights", opt.weights, "qparams", opt.qparams, "test_acc", acc))
