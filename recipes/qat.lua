-- recipes/qat.lua: the main job, in four phases, each recorded in the run folder so that an
-- interrupted run continues where it stopped (./qgru recipes/qat.lua --resume):
--   float      the float weights: --weights FILE, or else the train_float run with the same float
--              options (runs/train_float for the defaults; trained there first when missing or
--              unfinished, resuming its checkpoint), copied to float_model.safetensors
--   calibrate  PTQ: quantizers of the bitwidth config, calibration, test accuracy;
--              calibrated.safetensors keeps the calibrated model and quantizers
--   qat        quantization-aware fine-tuning (the integer forward with the straight-through
--              backward), checkpoint.safetensors after every epoch
--   export     model.safetensors (QAT weights), qparams.json (qgru-qparams v1), qparams.aimet.json
--              (AIMET 1.0.0), weight_codes.safetensors
-- Writes runs/<name>/ (qgru.rundir: run.json, options.json, log.txt, metrics.jsonl, metrics.json,
-- curves.svg when the qgru.plot module is there, and the files above); the name is qat plus the
-- options that differ from their defaults (runs/qat-config=w4a8-epochs=3) unless --name is given. A finished run is not overwritten:
-- --force moves it aside (runs/<name>.old-N) and starts again (the float run is kept and reused).
--   ./qgru recipes/qat.lua [--config config/int8.json] [--epochs 2] [--lr 2e-4] [--resume] ...
local qgru = require("qgru")
local quant, cli, zoo, train, optim, json, rundir, progress =
  qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.optim, qgru.json, qgru.rundir, qgru.progress

local METHODS = { "minmax", "histogram", "mse", "percentile" }
local spec = rundir.options({
  config = { "config/int8.json", "bitwidth config" },
  weights = { "", "float weights (.safetensors); empty: the train_float run with the same --hidden, --float_epochs, " ..
                  "--seed, --train_limit and --test_limit (runs/train_float for the defaults), trained first when missing" },
  float_epochs = { 12, "epochs of float training when the float run is missing", { int = true, min = 1 } },
  epochs = { 2, "QAT epochs", { int = true, min = 1 } },
  lr = { 2e-4, "QAT peak learning rate (cosine decay to lr/100)", { min = 0 } },
  batch_size = { 128, "QAT batch size", { int = true, min = 1 } },
  method = { "histogram", "activation calibration method", { choices = METHODS } },
  weight_method = { "minmax", "weight calibration method (per channel)", { choices = METHODS } },
  passes = { 2, "calibration passes", { int = true, min = 1 } },
  calib_batches = { 8, "calibration batches of 256", { int = true, min = 1 } },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  seed = { 1, "seed", { int = true } },
  train_limit = { 0, "use only the first N training images (0 = all)", { int = true, min = 0 } },
  test_limit = { 0, "evaluate on the first N test images only (0 = all)", { int = true, min = 0 } },
  data_dir = { qgru.data.fashionMNISTDir(), "Fashion-MNIST folder (IDX .gz files)" },
}, { resume = true })

local opt = cli.main(arg, spec, "recipes/qat.lua: float -> calibrate -> QAT -> export", function(o)
  quant.config(zoo.projectPath(o.config))   -- a bad config stops the run before anything is written or loaded
  if o.weights ~= "" and not zoo.exists(o.weights) then
    error("qgru: --weights " .. o.weights .. ": no such file (leave --weights empty to train the float model)", 0)
  end
  if o.resume ~= "" and o.resume ~= "true" and zoo.exists(o.resume) and not zoo.exists(o.resume .. "/options.json") then
    error("qgru: --resume " .. o.resume .. ": not a run folder (qat.lua resumes a run folder, or runs/<name> with --resume alone)", 0)
  end
end)

-- Everything below up to the data is a check: the run folder, the float run, the checkpoints.
local run = cli.guard(rundir.fromOptions, "qat", spec, opt,
                      { checkpoints = { "checkpoint.safetensors", "calibrated.safetensors", "float_model.safetensors" } })
opt = run.opt
if run.finished then
  local m = zoo.exists(run:path("metrics.json")) and json.read(run:path("metrics.json")) or {}
  print(string.format("%s is finished already (float %.2f%%, PTQ %.2f%%, QAT %.2f%%); nothing to do. --force runs it again.",
                      run.dir, 100 * (m.float_acc or 0), 100 * (m.ptq_acc or 0), 100 * (m.qat_acc or 0)))
  os.exit(0)
end
local cfg = quant.config(zoo.projectPath(opt.config))
local float_done, calib_done = run:phase("float"), run:phase("calibrate")
local ckpt = run:path("checkpoint.safetensors")
local qat_resume = run.resumed and zoo.exists(ckpt) and ckpt or nil

-- the float phase's source
local float_job
if not float_done and opt.weights == "" then
  local fspec = zoo.floatSpec()
  local fopt = {}
  for k, v in pairs(fspec) do fopt[k] = v[1] end
  fopt.epochs, fopt.hidden, fopt.seed, fopt.train_limit, fopt.test_limit, fopt.data_dir =
    opt.float_epochs, opt.hidden, opt.seed, opt.train_limit, opt.test_limit, opt.data_dir
  fopt.device = opt.device
  float_job = cli.guard(zoo.floatJob, fopt, fspec, { resume = true, legacy = "use" })
end

qgru.seed(opt.seed)
local model = zoo.fmnistGRU(opt.hidden)
local crit = qgru.nn.CrossEntropy()
local float_weights = float_done and run:path("float_model.safetensors") or (opt.weights ~= "" and opt.weights) or nil
if float_weights then cli.guard(qgru.load, model, float_weights) end
-- a QAT checkpoint to continue from must fit the quantized model and its optimizer
if qat_resume then
  local probe = zoo.fmnistGRU(opt.hidden)
  quant.prepare(probe, cfg)
  cli.guard(train.Engine.checkResume, train.Engine{ model = probe, criterion = crit, optimizer = optim.Adam(probe, { lr = opt.lr, clip = 1.0 }) },
            { resume = qat_resume, batch_size = opt.batch_size, seed = opt.seed + 100, options = opt })
end

run:create()
local function log(line) run:log(line) end
log("qgru " .. qgru.VERSION .. "  recipes/qat.lua  ->  " .. run.dir ..
    (run.resumed and ("  (resuming; done: " .. (#rundir.phaseNames(run.state) > 0 and table.concat(rundir.phaseNames(run.state), ", ") or "nothing") .. ")") or "") ..
    "\n" .. cli.describe(opt))
log(rundir.deviceLine())
local trainset, testset = zoo.fmnist({ dir = opt.data_dir, train_limit = opt.train_limit, test_limit = opt.test_limit })
local evaluator = train.Engine{ model = model, criterion = crit, log = log }
local t_run = qgru.wallTime()

-- phase 1: float weights
local float_acc
if float_done then
  float_acc = float_done.test_acc
  log(string.format("float phase done before: %s (test accuracy %.2f%%)", run:path("float_model.safetensors"), 100 * float_acc))
else
  local t0 = qgru.wallTime()
  local source = opt.weights
  if float_job then
    source = float_job.run:path("model.safetensors")
    if float_job.run.finished then
      log("float weights: " .. source .. (float_job.run.legacy and " (written by an earlier qgru)" or ""))
    else
      log("float weights: training them in " .. float_job.run.dir .. " (" .. float_job.opt.epochs .. " epochs)")
      float_job:start()
      float_job:train(trainset, testset)
    end
    float_job:loadInto(model)
  else
    log("float weights: " .. source)
  end
  local _, acc = evaluator:evaluate(testset, 256)
  float_acc = acc
  qgru.save(model, run:path("float_model.safetensors"))
  run:completePhase("float", { source = source, test_acc = float_acc, seconds = qgru.wallTime() - t0 })
  run:metric(json.object("phase", "float", "test_acc", float_acc))
  log(string.format("float test accuracy %.2f%%", 100 * float_acc))
end

-- phase 2: calibration (PTQ)
quant.prepare(model, cfg)
local ptq_acc
if calib_done then
  ptq_acc = calib_done.test_acc
  if not qat_resume then qgru.serialize.loadCheckpoint(run:path("calibrated.safetensors"), model, nil) end
  log(string.format("calibration done before: PTQ %s test accuracy %.2f%%", quant.describeConfig(cfg), 100 * ptq_acc))
else
  local t0 = qgru.wallTime()
  local bar
  quant.calibrate(model, trainset, { method = opt.method, weight_method = opt.weight_method, passes = opt.passes,
    batches = opt.calib_batches, batch_size = 256, progress = function(done, total)
      bar = bar or progress.new{ total = total, label = "calibrate" }
      bar:update(done)
    end })
  if bar then bar:done() end
  local _, acc = evaluator:evaluate(testset, 256)
  ptq_acc = acc
  qgru.serialize.saveCheckpoint(run:path("calibrated.safetensors"), model, nil, { quant = quant.state(model) })
  run:completePhase("calibrate", { method = opt.method, passes = opt.passes, test_acc = ptq_acc, seconds = qgru.wallTime() - t0 })
  run:metric(json.object("phase", "ptq", "test_acc", ptq_acc, "method", opt.method, "passes", opt.passes))
  log(string.format("PTQ %s (%s, %d passes) test accuracy %.2f%% (calibrated in %.1f s)", quant.describeConfig(cfg), opt.method,
                    opt.passes, 100 * ptq_acc, qgru.wallTime() - t0))
  log(tostring(model))
end

-- phase 3: QAT (resumes its checkpoint)
local t_qat = qgru.wallTime()
local qopt = optim.Adam(model, { lr = opt.lr, clip = 1.0 })
local engine = train.Engine{ model = model, criterion = crit, optimizer = qopt, log = log, logfile = function(l) run:logFile(l) end }
engine.hooks.onEndEpoch = function(state)
  local h = state.history[#state.history]
  run:metric(json.object("phase", "qat", "epoch", h.epoch, "seconds", h.seconds, "train_loss", h.train_loss, "train_acc", h.train_acc,
                         "test_loss", h.eval_loss, "test_acc", h.eval_acc, "samples_per_s", h.samples_per_s))
end
local state = engine:train{
  data = trainset, batch_size = opt.batch_size, epochs = opt.epochs, seed = opt.seed + 100, eval = testset,
  checkpoint = ckpt, resume = qat_resume, options = opt,
  lr_schedule = function(s, n) return optim.cosine(opt.lr, s, n, 0.01) end,
}
local last = state.history[#state.history]
local qat_acc = last.eval_acc
local pts, ticks = {}, {}
for _, h in ipairs(state.history) do pts[#pts + 1] = { h.epoch, 100 * h.eval_acc }; ticks[#ticks + 1] = h.epoch end
run:plot("curves.svg", { title = "QAT " .. quant.describeConfig(cfg) .. ": test accuracy", xlabel = "QAT epoch", ylabel = "test accuracy (%)",
                         series = { { label = "QAT", points = pts } }, xticks = ticks,
                         hlines = { { y = 100 * float_acc, label = "float", color = "#2ca02c" }, { y = 100 * ptq_acc, label = "PTQ", color = "#d62728" } } })
run:completePhase("qat", { epochs = #state.history, test_acc = qat_acc, seconds = qgru.wallTime() - t_qat })
log(string.format("QAT %s test accuracy %.2f%% (float %.2f%%, PTQ %.2f%%)", quant.describeConfig(cfg), 100 * qat_acc,
                  100 * float_acc, 100 * ptq_acc))

-- phase 4: export
quant.freeze(model)
qgru.save(model, run:path("model.safetensors"))
quant.export(model, run:path("qparams.json"))
quant.export(model, run:path("qparams.aimet.json"), { format = "aimet" })
quant.exportWeights(model, run:path("weight_codes.safetensors"))
run:completePhase("export", { files = json.array({ "model.safetensors", "qparams.json", "qparams.aimet.json", "weight_codes.safetensors" }) })
local phases_s = 0
for _, p in pairs(run.state.phases) do phases_s = phases_s + (tonumber(p.seconds) or 0) end
run:finish(json.object("recipe", "qat", "config", opt.config, "float_acc", float_acc, "ptq_acc", ptq_acc, "qat_acc", qat_acc,
  "qat_epochs", opt.epochs, "wall_seconds", qgru.wallTime() - t_run, "phase_seconds", phases_s, "attempts", run.state.attempts,
  "qat_samples_per_s", last.samples_per_s))
log(string.format("done in %.0f s: %s/{model.safetensors, qparams.json, qparams.aimet.json, weight_codes.safetensors}",
                  qgru.wallTime() - t_run, run.dir))
