-- zoo.lua: the models and data the recipes share, so train_float, calibrate, qat, sweep and
-- export build exactly the same network.
local nn = require("qgru.nn")
local data = require("qgru.data")
local serialize = require("qgru.serialize")

local zoo = {}

-- Fashion-MNIST rows classifier: GRU(28 -> hidden) -> last step -> Linear(hidden -> 10).
function zoo.fmnistGRU(hidden, layers)
  return nn.Sequential()
    :add(nn.GRU(28, hidden, { layers = layers or 1 }))
    :add(nn.Last())
    :add(nn.Linear(hidden, 10))
end

-- The Fashion-MNIST training and test sets. opts: dir, train_limit, test_limit (0 or nil: all).
function zoo.fmnist(opts)
  opts = opts or {}
  local function lim(n) return (n and n > 0) and n or nil end
  local train = data.fashionMNIST("train", { dir = opts.dir, limit = lim(opts.train_limit) })
  local test = data.fashionMNIST("test", { dir = opts.dir, limit = lim(opts.test_limit) })
  return train, test
end

-- A run folder runs/<name>/ and a logger that writes to stdout and runs/<name>/log.txt (appended
-- to, never truncated). The name is taken literally (no shell sees it). Recipes use
-- qgru.rundir instead, which also guards finished runs and resumes unfinished ones.
function zoo.run(name)
  if type(name) ~= "string" or name == "" then error("qgru: zoo.run: the run name must be a non-empty string, got " .. tostring(name), 2) end
  local dir = "runs/" .. name
  serialize.mkdir(dir)
  local f, err = io.open(dir .. "/log.txt", "a")
  if not f then error("qgru: cannot write " .. dir .. "/log.txt: " .. tostring(err), 2) end
  local function log(line)
    require("qgru.progress").write(io.stdout, line)
    f:write(line, "\n"); f:flush()
  end
  return dir, log
end

-- The options of recipes/train_float.lua (a fresh table; recipes/qat.lua's float phase is a
-- train_float run with the same options and defaults).
function zoo.floatSpec()
  return require("qgru.rundir").options({
    epochs = { 12, "training epochs", { int = true, min = 1 } },
    batch_size = { 128, "batch size", { int = true, min = 1 } },
    hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
    layers = { 1, "GRU layers", { int = true, min = 1 } },
    lr = { 2e-3, "peak learning rate (cosine decay to lr/100)", { min = 0 } },
    clip = { 1.0, "global gradient-norm clip (0 = off)", { min = 0 } },
    seed = { 1, "seed for initialisation and data order", { int = true } },
    threads = { 0, "BLAS threads (0 = OpenBLAS default)", { int = true, min = 0 } },
    train_limit = { 0, "use only the first N training images (0 = all)", { int = true, min = 0 } },
    test_limit = { 0, "evaluate on the first N test images only (0 = all)", { int = true, min = 0 } },
    data_dir = { data.fashionMNISTDir(), "Fashion-MNIST folder (IDX .gz files)" },
  }, { resume = true, checkpoint = true })
end

local function is_file(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local _, _, code = f:read(0)
  f:close()
  return code ~= 21
end

-- A float training job in its run folder (recipes/train_float.lua; recipes/qat.lua's float
-- phase). zoo.floatJob(opt, spec[, extra]) checks everything without loading data: the run
-- folder (rundir.fromOptions("train_float", spec, opt, extra)) and the checkpoint it would
-- resume from (opt.resume: "true", a run folder, or a checkpoint file; or the folder's own
-- checkpoint when resuming). Then:
--   job.run.finished   nothing to do: job:loadInto(model) loads the trained weights
--   job:start()        creates the run folder and logs the header
--   job:train(trainset, testset) -> summary   trains (resuming), writes metrics.csv,
--                      metrics.json, model.safetensors, curves.svg (with qgru.plot), and
--                      finishes the run
function zoo.floatJob(opt, spec, extra)
  local rundir, optim, train, clib = require("qgru.rundir"), require("qgru.optim"), require("qgru.train"), require("qgru.clib")
  extra = extra or {}
  local resume_file
  if type(opt.resume) == "string" and opt.resume ~= "" and opt.resume ~= "true" and opt.resume ~= "false" and is_file(opt.resume) then
    resume_file = opt.resume
    extra.resume = true
  end
  local run = rundir.fromOptions("train_float", spec, opt, extra)
  opt = run.opt
  local job = { run = run, opt = opt, spec = spec }
  function job.loadInto(_, model) serialize.loadModel(model, run:path("model.safetensors")) end
  if run.finished then
    if not zoo.exists(run:path("model.safetensors")) then
      error("qgru: " .. run.dir .. " is marked finished but holds no model.safetensors; --force trains it again", 0)
    end
    return job
  end
  if opt.threads > 0 then clib.check(clib.context("cpu"), clib.lib.qg_set_num_threads(clib.context("cpu"), opt.threads)) end
  clib.seed(opt.seed)
  local model = zoo.fmnistGRU(opt.hidden, opt.layers)
  local optimizer = optim.Adam(model, { lr = opt.lr, clip = opt.clip > 0 and opt.clip or nil })
  local engine = train.Engine{ model = model, criterion = nn.CrossEntropy(), optimizer = optimizer,
                               log = function(line) run:log(line) end, logfile = function(line) run:logFile(line) end }
  job.model, job.engine = model, engine
  job.resume = resume_file or ((run.resumed and zoo.exists(run:path("checkpoint.safetensors"))) and run:path("checkpoint.safetensors") or nil)
  if job.resume then
    engine:checkResume{ resume = job.resume, batch_size = opt.batch_size, seed = opt.seed, options = opt }
  end

  function job.start()
    run:create()
    run:log("qgru " .. require("qgru").VERSION .. "  recipes/train_float.lua  ->  " .. run.dir ..
            (job.resume and ("  (resuming from " .. job.resume .. ")") or "") .. "\n" .. require("qgru.cli").describe(opt))
    run:log(require("qgru.rundir").deviceLine())
  end

  function job.train(_, trainset, testset)
    local json = require("qgru.json")
    run:log(string.format("data: %d training and %d test sequences of 28 x 28", trainset.n, testset.n))
    run:log(tostring(model))
    engine.hooks.onEndEpoch = function(state)
      local h = state.history[#state.history]
      run:metric(json.object("phase", "train", "epoch", h.epoch, "seconds", h.seconds, "train_loss", h.train_loss,
        "train_acc", h.train_acc, "test_loss", h.eval_loss, "test_acc", h.eval_acc, "samples_per_s", h.samples_per_s))
    end
    local t0 = clib.wall_time()
    local state = engine:train{
      data = trainset, batch_size = opt.batch_size, epochs = opt.epochs, seed = opt.seed, eval = testset,
      checkpoint = run:path("checkpoint.safetensors"), resume = job.resume,
      lr_schedule = function(step, total) return optim.cosine(opt.lr, step, total, 0.01) end,
      options = opt,
    }
    local wall = clib.wall_time() - t0
    -- metrics.csv, one row per epoch (the whole history, resumed epochs included)
    local csv = assert(io.open(run:path("metrics.csv"), "w"))
    csv:write("epoch,seconds,train_loss,train_acc,test_loss,test_acc,samples_per_s\n")
    local rows, train_s = {}, 0
    for _, h in ipairs(state.history) do
      csv:write(string.format("%d,%.2f,%.5f,%.5f,%.5f,%.5f,%.0f\n", h.epoch, h.seconds, h.train_loss or 0, h.train_acc or 0,
                              h.eval_loss, h.eval_acc, h.samples_per_s or 0))
      rows[#rows + 1] = json.object("epoch", h.epoch, "seconds", h.seconds, "train_loss", h.train_loss, "train_acc", h.train_acc,
                                    "test_loss", h.eval_loss, "test_acc", h.eval_acc, "samples_per_s", h.samples_per_s)
      train_s = train_s + h.seconds
    end
    csv:close()
    local last = state.history[#state.history]
    serialize.saveModel(model, run:path("model.safetensors"))
    local test_pts, train_pts, ticks = {}, {}, {}
    for _, h in ipairs(state.history) do
      test_pts[#test_pts + 1] = { h.epoch, 100 * h.eval_acc }
      if h.train_acc then train_pts[#train_pts + 1] = { h.epoch, 100 * h.train_acc } end
      ticks[#ticks + 1] = h.epoch
    end
    run:plot("curves.svg", { title = "float training: accuracy per epoch", xlabel = "epoch", ylabel = "accuracy (%)", xticks = ticks,
                              series = { { label = "test", points = test_pts }, { label = "train", points = train_pts, dashed = true } } })
    local summary = json.object("recipe", "train_float", "test_acc", last.eval_acc, "epochs", #state.history,
      "wall_seconds", wall, "train_seconds", train_s, "history", json.array(rows))
    run:log(string.format("done: test accuracy %.2f%% after %d epochs, %.1f s wall; weights in %s",
                          100 * last.eval_acc, #state.history, wall, run:path("model.safetensors")))
    run:finish(summary)
    return summary
  end
  return job
end

-- path itself when it exists, else the project's file of that relative path when that exists
-- (config/int8.json from any folder), else path.
function zoo.projectPath(path)
  if type(path) ~= "string" or path == "" or path:sub(1, 1) == "/" or zoo.exists(path) then return path end
  local root = require("qgru.clib").root
  if zoo.exists(root .. "/" .. path) then return root .. "/" .. path end
  return path
end

function zoo.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

return zoo
