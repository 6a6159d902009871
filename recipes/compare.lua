-- recipes/compare.lua: the README's PTQ/QAT comparison table. For each bitwidth config: PTQ with
-- minmax and histogram calibration, 1 and 2 passes, and QAT from the histogram/2-pass start; plus
-- the CPU QAT step time as a ratio to the float step time, measured in the same run.
-- (recipes/sweep.lua does the bitwidth grid, sensitivity and mixed-precision sweeps.)
-- Writes runs/<name>/results.md and results.json.
--   ./qgru recipes/compare.lua [--configs int8,int6,w4a8] [--qat_epochs 2]
local qgru = require("qgru")
local quant, cli, zoo, train, optim, json = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.optim, qgru.json

local opt = cli.main(arg, {
  name = { "compare", "run name", { nonempty = true } },
  weights = { "runs/train_float/model.safetensors", "float weights (recipes/train_float.lua)" },
  configs = { "int8,int6,w4a8", "configs under config/, comma separated" },
  qat_epochs = { 2, "QAT epochs per config", { int = true, min = 1 } },
  lr = { 2e-4, "QAT peak learning rate", { min = 0 } },
  calib_batches = { 8, "calibration batches of 256", { int = true, min = 1 } },
  timing_steps = { 30, "training steps timed for the step-time ratio", { int = true, min = 1 } },
  seed = { 1, "seed" },
  device = { qgru.device(), "cpu | cuda (default: cuda when a GPU is present; QGRU_DEVICE overrides)", { choices = { "cpu", "cuda" } } },
}, "recipes/compare.lua: PTQ and QAT across bitwidth configs", function(o)
  if not zoo.exists(o.weights) then error("qgru: no float weights at " .. o.weights .. ": run recipes/train_float.lua first", 0) end
  local n = 0
  for name in o.configs:gmatch("[^,]+") do quant.config("config/" .. name .. ".json"); n = n + 1 end
  if n == 0 then error("qgru: option --configs names no config", 0) end
  qgru.setDevice(o.device)
end)

local dir, log = zoo.run(opt.name)
log("qgru " .. qgru.VERSION .. "  recipes/compare.lua\n" .. cli.describe(opt))
log("device: " .. qgru.device() .. (qgru.device() == "cuda" and ("  (math " .. qgru.math() .. ")") or ""))
local trainset, testset = zoo.fmnist()
local crit = qgru.nn.CrossEntropy()

local function fresh()
  local m = zoo.fmnistGRU(128)
  qgru.load(m, opt.weights)
  return m
end
local function accuracy(m)
  local _, acc = train.Engine{ model = m, criterion = crit, log = function() end }:evaluate(testset, 256)
  return acc
end
-- median ms per training step over timing_steps steps (after 3 warm-up steps)
local function step_ms(m)
  local o = optim.Adam(m, { lr = 0 })
  m:training()
  local times, k, staging = {}, 0, {}
  for xb, yb in trainset:batches(128) do
    local t0 = qgru.wallTime()
    local x, y = train.toDevice(staging, "x", xb, m:device()), train.toDevice(staging, "y", yb, m:device())
    local out = m:forward(x)
    crit:forward(out, y)
    m:zeroGrad()
    m:backward(x, crit:backward(out, y))
    o:step()                                 -- returns the norm: the step has finished on the device
    k = k + 1
    if k > 3 then times[#times + 1] = 1000 * (qgru.wallTime() - t0) end
    if #times >= opt.timing_steps then break end
  end
  table.sort(times)
  return times[math.floor(#times / 2) + 1]
end

local float_model = fresh()
local float_acc = accuracy(float_model)
local float_ms = step_ms(float_model)
log(string.format("float: test accuracy %.2f%%, %.1f ms/step (batch 128, median of %d)", 100 * float_acc, float_ms, opt.timing_steps))

local rows = {}
for name in opt.configs:gmatch("[^,]+") do
  local path = "config/" .. name .. ".json"
  local cfg = quant.config(path)
  local row = { config = name, desc = quant.describeConfig(cfg) }
  for _, m in ipairs({ "minmax", "histogram" }) do
    for passes = 1, 2 do
      local model = fresh()
      quant.prepare(model, cfg)
      quant.calibrate(model, trainset, { method = m, passes = passes, batches = opt.calib_batches, batch_size = 256 })
      row[m .. passes] = accuracy(model)
      log(string.format("%s PTQ %s, %d pass%s: %.2f%%", name, m, passes, passes > 1 and "es" or "", 100 * row[m .. passes]))
    end
  end
  local model = fresh()
  quant.prepare(model, cfg)
  quant.calibrate(model, trainset, { method = "histogram", passes = 2, batches = opt.calib_batches, batch_size = 256 })
  row.qat_ms = step_ms(model)
  model = fresh()
  quant.prepare(model, cfg)
  quant.calibrate(model, trainset, { method = "histogram", passes = 2, batches = opt.calib_batches, batch_size = 256 })
  local o = optim.Adam(model, { lr = opt.lr, clip = 1.0 })
  local st = train.Engine{ model = model, criterion = crit, optimizer = o, log = log }:train{
    data = trainset, batch_size = 128, epochs = opt.qat_epochs, seed = opt.seed + 100, eval = testset,
    lr_schedule = function(s, n) return optim.cosine(opt.lr, s, n, 0.01) end }
  row.qat = st.history[#st.history].eval_acc
  log(string.format("%s QAT (%d epochs): %.2f%%; QAT step %.1f ms = %.2fx float", name, opt.qat_epochs, 100 * row.qat, row.qat_ms, row.qat_ms / float_ms))
  rows[#rows + 1] = row
end

local md = { "| config | float | PTQ minmax 1 pass | PTQ minmax 2 passes | PTQ histogram 1 pass | PTQ histogram 2 passes | QAT (" .. opt.qat_epochs .. " epochs) | QAT step / float step |",
             "|---|---|---|---|---|---|---|---|" }
for _, r in ipairs(rows) do
  md[#md + 1] = string.format("| %s (%s) | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2fx (%.0f / %.0f ms) |", r.config, r.desc, 100 * float_acc,
    100 * r.minmax1, 100 * r.minmax2, 100 * r.histogram1, 100 * r.histogram2, 100 * r.qat, r.qat_ms / float_ms, r.qat_ms, float_ms)
end
local f = assert(io.open(dir .. "/results.md", "w"))
f:write(table.concat(md, "\n"), "\n")
f:close()
json.write(dir .. "/results.json", json.object("float_acc", float_acc, "float_ms", float_ms, "rows", json.array(rows)))
log(table.concat(md, "\n"))
