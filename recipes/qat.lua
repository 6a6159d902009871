-- recipes/qat.lua: the main job. Float model (a checkpoint, or trained here when there is none)
-- -> calibrate (PTQ) -> quantization-aware fine-tuning (the integer forward with the
-- straight-through backward) -> evaluate -> export.
-- Writes runs/<name>/: log.txt, config.txt, metrics.json, model.safetensors (QAT weights),
-- qparams.json (qgru-qparams v1), qparams.aimet.json (AIMET 1.0.0), weight_codes.safetensors,
-- checkpoint.safetensors.
--   ./qgru recipes/qat.lua [--config config/int8.json] [--epochs 2] [--lr 2e-4] ...
local qgru = require("qgru")
local quant, cli, zoo, train, optim, json = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.optim, qgru.json

local opt = cli.main(arg, {
  name = { "qat", "run name (folder under runs/)", { nonempty = true } },
  config = { "config/int8.json", "bitwidth config" },
  weights = { "runs/train_float/model.safetensors", "float weights; trained here first when the file is missing" },
  float_epochs = { 12, "epochs of float training when there are no float weights", { int = true, min = 1 } },
  epochs = { 2, "QAT epochs", { int = true, min = 1 } },
  lr = { 2e-4, "QAT peak learning rate (cosine decay to lr/100)", { min = 0 } },
  batch_size = { 128, "QAT batch size", { int = true, min = 1 } },
  method = { "histogram", "activation calibration method", { choices = { "minmax", "histogram", "mse", "percentile" } } },
  weight_method = { "minmax", "weight calibration method (per channel)", { choices = { "minmax", "histogram", "mse", "percentile" } } },
  passes = { 2, "calibration passes", { int = true, min = 1 } },
  calib_batches = { 8, "calibration batches of 256", { int = true, min = 1 } },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  seed = { 1, "seed" },
  train_limit = { 0, "use only the first N training images (0 = all)", { int = true, min = 0 } },
  device = { qgru.device(), "cpu | cuda (default: cuda when a GPU is present; QGRU_DEVICE overrides)", { choices = { "cpu", "cuda" } } },
}, "recipes/qat.lua: float -> calibrate -> QAT -> export", function(o)
  quant.config(o.config)   -- a bad config stops the run before anything is loaded
  qgru.setDevice(o.device)
end)

local dir, log = zoo.run(opt.name)
local cf = assert(io.open(dir .. "/config.txt", "w")); cf:write(cli.describe(opt), "\n"); cf:close()
log("qgru " .. qgru.VERSION .. "  recipes/qat.lua\n" .. cli.describe(opt))
log("device: " .. qgru.device() .. (qgru.device() == "cuda" and ("  (math " .. qgru.math() .. ")") or ""))
local cfg = quant.config(opt.config)
qgru.seed(opt.seed)
local model = zoo.fmnistGRU(opt.hidden)
if zoo.exists(opt.weights) then qgru.load(model, opt.weights) end   -- checked before the data is loaded
local trainset, testset = zoo.fmnist({ train_limit = opt.train_limit > 0 and opt.train_limit or nil })
local crit = qgru.nn.CrossEntropy()
local t_all = qgru.wallTime()

if zoo.exists(opt.weights) then
  log("float weights: " .. opt.weights)
else
  log("no float weights at " .. opt.weights .. ": training the float model first (" .. opt.float_epochs .. " epochs)")
  local fopt = optim.Adam(model, { lr = 2e-3, clip = 1.0 })
  local e = train.Engine{ model = model, criterion = crit, optimizer = fopt, log = log }
  e:train{ data = trainset, batch_size = 128, epochs = opt.float_epochs, seed = opt.seed, eval = testset,
           lr_schedule = function(s, n) return optim.cosine(2e-3, s, n, 0.01) end }
  qgru.save(model, dir .. "/float_model.safetensors")
end
local evaluator = train.Engine{ model = model, criterion = crit, log = log }
local _, float_acc = evaluator:evaluate(testset, 256)
log(string.format("float test accuracy %.2f%%", 100 * float_acc))

quant.prepare(model, cfg)
quant.calibrate(model, trainset, { method = opt.method, weight_method = opt.weight_method, passes = opt.passes,
                                   batches = opt.calib_batches, batch_size = 256 })
local _, ptq_acc = evaluator:evaluate(testset, 256)
log(string.format("PTQ %s (%s, %d passes) test accuracy %.2f%%", quant.describeConfig(cfg), opt.method, opt.passes, 100 * ptq_acc))
log(tostring(model))

local qopt = optim.Adam(model, { lr = opt.lr, clip = 1.0 })
local engine = train.Engine{ model = model, criterion = crit, optimizer = qopt, log = log }
local state = engine:train{
  data = trainset, batch_size = opt.batch_size, epochs = opt.epochs, seed = opt.seed + 100, eval = testset,
  checkpoint = dir .. "/checkpoint.safetensors", options = opt,
  lr_schedule = function(s, n) return optim.cosine(opt.lr, s, n, 0.01) end,
}
local qat_acc = state.history[#state.history].eval_acc
log(string.format("QAT %s test accuracy %.2f%% (float %.2f%%, PTQ %.2f%%)", quant.describeConfig(cfg), 100 * qat_acc,
                  100 * float_acc, 100 * ptq_acc))
quant.freeze(model)
qgru.save(model, dir .. "/model.safetensors")
quant.export(model, dir .. "/qparams.json")
quant.export(model, dir .. "/qparams.aimet.json", { format = "aimet" })
quant.exportWeights(model, dir .. "/weight_codes.safetensors")
json.write(dir .. "/metrics.json", json.object("recipe", "qat", "config", opt.config, "float_acc", float_acc, "ptq_acc", ptq_acc,
  "qat_acc", qat_acc, "qat_epochs", opt.epochs, "wall_seconds", qgru.wallTime() - t_all,
  "qat_samples_per_s", state.history[#state.history].samples_per_s))
log(string.format("done in %.0f s: %s/{model.safetensors, qparams.json, qparams.aimet.json, weight_codes.safetensors}",
                  qgru.wallTime() - t_all, dir))
