-- recipes/train_float.lua: float GRU on Fashion-MNIST rows (T = 28 rows of C = 28 pixels):
-- GRU(28 -> 128), last step, Linear(128 -> 10), Adam with a cosine learning-rate decay.
-- Writes runs/<name>/: config.txt, log.txt, metrics.csv, metrics.json, model.safetensors,
-- checkpoint.safetensors (resume with --resume runs/<name>/checkpoint.safetensors).
--   ./qgru recipes/train_float.lua [--epochs 12] [--hidden 128] [--lr 2e-3] ...
local qgru = require("qgru")
local nn, optim, data, train, cli, zoo = qgru.nn, qgru.optim, qgru.data, qgru.train, qgru.cli, qgru.zoo

local opt = cli.main(arg, {
  name = { "train_float", "run name (folder under runs/)", { nonempty = true } },
  epochs = { 12, "training epochs", { int = true, min = 1 } },
  batch_size = { 128, "batch size", { int = true, min = 1 } },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  layers = { 1, "GRU layers", { int = true, min = 1 } },
  lr = { 2e-3, "peak learning rate (cosine decay to lr/100)", { min = 0 } },
  clip = { 1.0, "global gradient-norm clip (0 = off)", { min = 0 } },
  seed = { 1, "seed for initialisation and data order" },
  threads = { 0, "BLAS threads (0 = OpenBLAS default)", { int = true, min = 0 } },
  train_limit = { 0, "use only the first N training images (0 = all)", { int = true, min = 0 } },
  resume = { "", "checkpoint to resume from" },
  data_dir = { data.fashionMNISTDir(), "Fashion-MNIST folder (IDX .gz files)" },
  device = { qgru.device(), "cpu | cuda (default: cuda when a GPU is present; QGRU_DEVICE overrides)", { choices = { "cpu", "cuda" } } },
}, "recipes/train_float.lua: float GRU on Fashion-MNIST rows", function(o)
  if o.resume ~= "" and not zoo.exists(o.resume) then error("qgru: --resume " .. o.resume .. ": no such file", 0) end
  qgru.setDevice(o.device)
end)

local run_dir, log = zoo.run(opt.name, opt.resume ~= "")
local cfg = assert(io.open(run_dir .. "/config.txt", "w"))
cfg:write(cli.describe(opt), "\n")
cfg:close()
log("qgru " .. qgru.VERSION .. "  recipes/train_float.lua\n" .. cli.describe(opt))
log("device: " .. qgru.device() .. (qgru.device() == "cuda" and ("  (math " .. qgru.math() .. ")") or ""))

if opt.threads > 0 then qgru.setNumThreads(opt.threads) end
qgru.seed(opt.seed)
local model = nn.Sequential()
  :add(nn.GRU(28, opt.hidden, { layers = opt.layers }))
  :add(nn.Last())
  :add(nn.Linear(opt.hidden, 10))
local criterion = nn.CrossEntropy()
local optimizer = optim.Adam(model, { lr = opt.lr, clip = opt.clip > 0 and opt.clip or nil })
local engine = train.Engine{ model = model, criterion = criterion, optimizer = optimizer, log = log }
-- a checkpoint that cannot be resumed (another model, other options, corrupt) stops the run
-- here, before the data is loaded
if opt.resume ~= "" then
  cli.guard(engine.checkResume, engine, { resume = opt.resume, batch_size = opt.batch_size, seed = opt.seed, options = opt })
end

local trainset = data.fashionMNIST("train", { dir = opt.data_dir, limit = opt.train_limit > 0 and opt.train_limit or nil })
local testset = data.fashionMNIST("test", { dir = opt.data_dir })
log(string.format("data: %d training and %d test sequences of 28 x 28", trainset.n, testset.n))
log(tostring(model))

local t0 = qgru.wallTime()
local state = engine:train{
  data = trainset, batch_size = opt.batch_size, epochs = opt.epochs, seed = opt.seed, eval = testset,
  checkpoint = run_dir .. "/checkpoint.safetensors", resume = opt.resume ~= "" and opt.resume or nil,
  lr_schedule = function(step, total) return optim.cosine(opt.lr, step, total, 0.01) end,
  options = opt,
}
local wall = qgru.wallTime() - t0

-- metrics.csv and metrics.json, one row per epoch
local csv = assert(io.open(run_dir .. "/metrics.csv", "w"))
csv:write("epoch,seconds,train_loss,train_acc,test_loss,test_acc,samples_per_s\n")
local rows = {}
for _, h in ipairs(state.history) do
  csv:write(string.format("%d,%.2f,%.5f,%.5f,%.5f,%.5f,%.0f\n", h.epoch, h.seconds, h.train_loss or 0, h.train_acc or 0,
                          h.eval_loss, h.eval_acc, h.samples_per_s or 0))
  rows[#rows + 1] = string.format('{"epoch": %d, "seconds": %.2f, "train_loss": %.5f, "train_acc": %.5f, "test_loss": %.5f, "test_acc": %.5f, "samples_per_s": %.0f}',
                                  h.epoch, h.seconds, h.train_loss or 0, h.train_acc or 0, h.eval_loss, h.eval_acc, h.samples_per_s or 0)
end
csv:close()
local last = state.history[#state.history]
local js = assert(io.open(run_dir .. "/metrics.json", "w"))
js:write(string.format('{"recipe": "train_float", "test_acc": %.5f, "epochs": %d, "wall_seconds": %.1f, "history": [\n  %s\n]}\n',
                       last.eval_acc, #state.history, wall, table.concat(rows, ",\n  ")))
js:close()
qgru.save(model, run_dir .. "/model.safetensors")
log(string.format("done: test accuracy %.2f%% after %d epochs, %.1f s wall; weights in %s/model.safetensors",
                  100 * last.eval_acc, #state.history, wall, run_dir))
