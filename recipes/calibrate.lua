-- recipes/calibrate.lua: post-training quantization of a float model. Loads float weights,
-- attaches the quantizers of a bitwidth config, calibrates on training batches, evaluates the
-- integer model on the test set next to the float one, and exports the parameters.
-- Writes runs/<name>/ (qgru.rundir: run.json, options.json, log.txt, metrics.jsonl): qparams.json,
-- qparams.aimet.json, weight_codes.safetensors, metrics.json. The name is calibrate plus the
-- options that differ from their defaults (runs/calibrate-config=w4a8) unless --name is given; a
-- finished run is not overwritten (--force moves it aside to runs/<name>.old-N).
--   ./qgru recipes/calibrate.lua [--weights runs/train_float/model.safetensors] [--config config/int8.json]
local qgru = require("qgru")
local quant, cli, zoo, train, json, rundir, progress = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.json, qgru.rundir, qgru.progress

local spec = rundir.options({
  weights = { "runs/train_float/model.safetensors", "float weights (from recipes/train_float.lua)" },
  config = { "config/int8.json", "bitwidth config" },
  method = { "histogram", "activation calibration: minmax | histogram | mse | percentile", { choices = { "minmax", "histogram", "mse", "percentile" } } },
  weight_method = { "minmax", "weight calibration (per channel)", { choices = { "minmax", "histogram", "mse", "percentile" } } },
  passes = { 2, "calibration passes (1 = float recurrence, 2+ = quantized recurrence)", { int = true, min = 1 } },
  calib_batches = { 8, "calibration batches", { int = true, min = 1 } },
  batch_size = { 256, "calibration and evaluation batch size", { int = true, min = 1 } },
  hidden = { 128, "GRU hidden size of the float model", { int = true, min = 1 } },
  test_limit = { 0, "evaluate on the first N test images only (0 = all)", { int = true, min = 0 } },
})
local opt = cli.main(arg, spec, "recipes/calibrate.lua: post-training quantization of a float GRU", function(o)
  if not zoo.exists(o.weights) then
    error("qgru: no float weights at " .. o.weights .. ": run ./qgru recipes/train_float.lua first (or pass --weights)", 0)
  end
  quant.config(zoo.projectPath(o.config))
end)

local run = cli.guard(rundir.fromOptions, "calibrate", spec, opt)
local cfg = quant.config(zoo.projectPath(opt.config))
local model = zoo.fmnistGRU(opt.hidden)
cli.guard(qgru.load, model, opt.weights)   -- before anything is written or loaded
run:create()
local dir = run.dir
local function log(line) run:log(line) end
log("qgru " .. qgru.VERSION .. "  recipes/calibrate.lua  ->  " .. dir .. "\n" .. cli.describe(opt))
log(rundir.deviceLine())
local trainset, testset = zoo.fmnist({ test_limit = opt.test_limit })
local engine = train.Engine{ model = model, criterion = qgru.nn.CrossEntropy(), log = log }
local _, float_acc = engine:evaluate(testset, opt.batch_size)
log(string.format("float test accuracy %.2f%%", 100 * float_acc))
quant.prepare(model, cfg)
local t0 = qgru.wallTime()
local bar
quant.calibrate(model, trainset, { method = opt.method, weight_method = opt.weight_method, passes = opt.passes,
  batches = opt.calib_batches, batch_size = opt.batch_size, progress = function(done, total)
    bar = bar or progress.new{ total = total, label = "calibrate" }
    bar:update(done)
  end })
if bar then bar:done() end
log(string.format("calibrated (%s, %d pass%s, %d batches of %d) in %.1f s", opt.method, opt.passes, opt.passes > 1 and "es" or "",
                  opt.calib_batches, opt.batch_size, qgru.wallTime() - t0))
log(tostring(model))
local _, q_acc = engine:evaluate(testset, opt.batch_size)
log(string.format("PTQ %s test accuracy %.2f%% (float %.2f%%, delta %+.2f points)", quant.describeConfig(cfg), 100 * q_acc,
                  100 * float_acc, 100 * (q_acc - float_acc)))
quant.export(model, dir .. "/qparams.json")
quant.export(model, dir .. "/qparams.aimet.json", { format = "aimet" })
quant.exportWeights(model, dir .. "/weight_codes.safetensors")
run:metric(json.object("phase", "ptq", "float_acc", float_acc, "test_acc", q_acc, "method", opt.method, "passes", opt.passes))
log("exported " .. dir .. "/qparams.json, qparams.aimet.json, weight_codes.safetensors")
run:finish(json.object("recipe", "calibrate", "config", opt.config, "method", opt.method,
  "passes", opt.passes, "float_acc", float_acc, "ptq_acc", q_acc))
