-- recipes/train_float.lua: float GRU on Fashion-MNIST rows (T = 28 rows of C = 28 pixels):
-- GRU(28 -> 128), last step, Linear(128 -> 10), Adam with a cosine learning-rate decay.
-- Writes runs/<name>/ (qgru.rundir; the name is train_float plus the options that differ from
-- their defaults, e.g. runs/train_float-epochs=3, unless --name is given): run.json,
-- options.json, log.txt, metrics.jsonl (one line per epoch), metrics.csv, metrics.json,
-- checkpoint.safetensors (every epoch), model.safetensors, curves.svg (accuracy per epoch, when
-- the qgru.plot module is there).
--   ./qgru recipes/train_float.lua [--epochs 12] [--hidden 128] [--lr 2e-3] ...
--   ./qgru recipes/train_float.lua --resume          # continues an interrupted run
-- A finished run is not overwritten: --force moves it aside (runs/<name>.old-N) and starts again.
local qgru = require("qgru")
local cli, zoo = qgru.cli, qgru.zoo

local spec = zoo.floatSpec()
local opt = cli.main(arg, spec, "recipes/train_float.lua: float GRU on Fashion-MNIST rows", function(o)
  if o.resume ~= "" and o.resume ~= "true" and not zoo.exists(o.resume) then
    error("qgru: --resume " .. o.resume .. ": no such run folder or checkpoint", 0)
  end
end)

-- the run folder and a checkpoint to resume from are checked before any data is loaded
local job = cli.guard(zoo.floatJob, opt, spec)
if job.run.finished then
  print(job.run.dir .. " is finished already (see its metrics.json); nothing to do. --force trains it again.")
  os.exit(0)
end
job:start()
local trainset, testset = zoo.fmnist({ dir = job.opt.data_dir, train_limit = job.opt.train_limit, test_limit = job.opt.test_limit })
job:train(trainset, testset)
