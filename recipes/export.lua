-- recipes/export.lua: exports a trained, quantized model for deployment tools. Loads float
-- weights and a qgru-qparams file (from recipes/qat.lua or recipes/calibrate.lua), checks the
-- integer model on the test set, and writes the parameters in every format:
-- runs/<name>/: qparams.json (qgru-qparams v1), qparams.aimet.json (AIMET encodings 1.0.0),
-- weight_codes.safetensors (integer weight codes + per-channel exponents and zero points), and
-- run.json, options.json, log.txt, metrics.jsonl, metrics.json (qgru.rundir). The name is export
-- plus the options that differ from their defaults unless --name is given; a finished run is not
-- overwritten (--force moves it aside to runs/<name>.old-N).
-- Deployment exports (issue 10; lua/qgru/deploy), bit-exact with qgru's integer forward:
--   --format c      runs/<name>/c/<c_name>.h, .c (C99 module) and <c_name>_main.c (.npy driver);
--                   with arm-none-eabi-gcc on PATH also the Cortex-M4 object and its size
--   --format onnx   runs/<name>/onnx/model.onnx (integer graph), model_qdq.onnx (QDQ approximation),
--                   model.json + .npy (the data tools/onnx_export.py builds them from); needs a
--                   python3 with onnx and numpy (--python, or $QGRU_PYTHON)
--   --format all    both
--   ./qgru recipes/export.lua [--weights runs/qat/model.safetensors] [--qparams runs/qat/qparams.json]
local qgru = require("qgru")
local quant, cli, zoo, train, json, rundir = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.json, qgru.rundir

local spec = rundir.options({
  weights = { "runs/qat/model.safetensors", "model weights" },
  qparams = { "runs/qat/qparams.json", "quantization parameters (qgru-qparams v1)" },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  evaluate = { true, "check the integer model's test accuracy" },
  format = { "params", "also a deployment export: c, onnx or all", { choices = { "params", "c", "onnx", "all" } } },
  c_name = { "qgru_gru", "C prefix of the C99 module (--format c)", { nonempty = true } },
  unroll = { 0, "ONNX: unroll the recurrence for this fixed T (0: Scan)", { int = true, min = 0 } },
  qdq_only = { false, "ONNX: only the QDQ approximation (for models beyond float32's exact integers)" },
  python = { "", "ONNX: the python3 with onnx and numpy (default $QGRU_PYTHON or python3)" },
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
log(rundir.deviceLine())
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
if opt.format ~= "params" then require("qgru.deploy").recipe(model, dir, opt, log) end
run:finish(json.object("recipe", "export", "weights", opt.weights, "qparams", opt.qparams, "test_acc", acc))
