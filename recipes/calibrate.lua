-- recipes/calibrate.lua: post-training quantization of a float model. Loads float weights,
-- attaches the quantizers of a bitwidth config, calibrates on training batches, evaluates the
-- integer model on the test set next to the float one, and exports the parameters.
-- Writes runs/<name>/: log.txt, qparams.json, qparams.aimet.json, weight_codes.safetensors, metrics.json
--   ./qgru recipes/calibrate.lua [--weights runs/train_float/model.safetensors] [--config config/int8.json]
local qgru = require("qgru")
local quant, cli, zoo, train, json = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.json

local opt = cli.main(arg, {
  name = { "calibrate", "run name (folder under runs/)", { nonempty = true } },
  weights = { "runs/train_float/model.safetensors", "float weights (from recipes/train_float.lua)" },
  config = { "config/int8.json", "bitwidth config" },
  method = { "histogram", "activation calibration: minmax | histogram | mse | percentile", { choices = { "minmax", "histogram", "mse", "percentile" } } },
  weight_method = { "minmax", "weight calibration (per channel)", { choices = { "minmax", "histogram", "mse", "percentile" } } },
  passes = { 2, "calibration passes (1 = float recurrence, 2+ = quantized recurrence)", { int = true, min = 1 } },
  calib_batches = { 8, "calibration batches", { int = true, min = 1 } },
  batch_size = { 256, "calibration and evaluation batch size", { int = true, min = 1 } },
  hidden = { 128, "GRU hidden size of the float model", { int = true, min = 1 } },
  device = { qgru.device(), "cpu | cuda (default: cuda when a GPU is present; QGRU_DEVICE overrides)", { choices = { "cpu", "cuda" } } },
}, "recipes/calibrate.lua: post-training quantization of a float GRU", function(o)
  if not zoo.exists(o.weights) then
    error("qgru: no float weights at " .. o.weights .. ": run ./qgru recipes/train_float.lua first (or pass --weights)", 0)
  end
  quant.config(o.config)
  qgru.setDevice(o.device)
end)

local dir, log = zoo.run(opt.name)
log("qgru " .. qgru.VERSION .. "  recipes/calibrate.lua\n" .. cli.describe(opt))
log("device: " .. qgru.device() .. (qgru.device() == "cuda" and ("  (math " .. qgru.math() .. ")") or ""))
local cfg = quant.config(opt.config)
local model = zoo.fmnistGRU(opt.hidden)
qgru.load(model, opt.weights)
local trainset, testset = zoo.fmnist()
local engine = train.Engine{ model = model, criterion = qgru.nn.CrossEntropy(), log = log }
local _, float_acc = engine:evaluate(testset, opt.batch_size)
log(string.format("float test accuracy %.2f%%", 100 * float_acc))
quant.prepare(model, cfg)
local t0 = qgru.wallTime()
quant.calibrate(model, trainset, { method = opt.method, weight_method = opt.weight_method, passes = opt.passes,
                                   batches = opt.calib_batches, batch_size = opt.batch_size })
log(string.format("calibrated (%s, %d pass%s, %d batches of %d) in %.1f s", opt.method, opt.passes, opt.passes > 1 and "es" or "",
                  opt.calib_batches, opt.batch_size, qgru.wallTime() - t0))
log(tostring(model))
local _, q_acc = engine:evaluate(testset, opt.batch_size)
log(string.format("PTQ %s test accuracy %.2f%% (float %.2f%%, delta %+.2f points)", quant.describeConfig(cfg), 100 * q_acc,
                  100 * float_acc, 100 * (q_acc - float_acc)))
quant.export(model, dir .. "/qparams.json")
quant.export(model, dir .. "/qparams.aimet.json", { format = "aimet" })
quant.exportWeights(model, dir .. "/weight_codes.safetensors")
json.write(dir .. "/metrics.json", json.object("recipe", "calibrate", "config", opt.config, "method", opt.method,
  "passes", opt.passes, "float_acc", float_acc, "ptq_acc", q_acc))
log("exported " .. dir .. "/qparams.json, qparams.aimet.json, weight_codes.safetensors")
