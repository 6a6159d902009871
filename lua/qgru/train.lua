-- train.lua: the training engine (torchnet style): a loop over epochs and batches with named
-- hooks, a progress line, evaluation, a NaN guard, checkpoints and resume.
--
--   local engine = train.Engine{model = m, criterion = c, optimizer = opt}
--   engine.hooks.onEndEpoch = function(state) ... end     -- unknown hook names are errors
--   local state = engine:train{data = ds, batch_size = 128, epochs = 10, seed = 1,
--                              eval = test_ds, checkpoint = "runs/x/ckpt.safetensors"}
--   local loss, acc = engine:evaluate(test_ds, 256)
--
-- Hooks receive the state table: epoch, step (global), batch (in epoch), x, y, output, loss,
-- history (one entry per epoch), losses (every step's loss), and the engine's objects.
-- Checkpoints hold the model, the optimizer state, the RNG, the position in the data and the
-- caller's `options` table (a recipe passes its command-line options), restored as state.options.
-- Each batch moves to the model's device once per step (staging tensors reused); accuracy is
-- counted in C (CrossEntropy:countCorrect). The loop itself is short: resuming, metrics,
-- progress lines, evaluation and checkpoints (with the quantizer state) are the named built-in
-- hooks of train.builtin, run at fixed points around the user's hooks.
--
-- Progress: on a terminal each epoch is one rewritten line with a bar, the running loss and
-- accuracy and an ETA (qgru.progress), and the periodic lines go only to opts.logfile (a
-- function, e.g. a run directory's log file); elsewhere the periodic lines are printed through
-- opts.log as plain lines. Engine{progress = false} always prints plain lines; a table is passed
-- to progress.new (tty, out, clock: tests inject them).
local class = require("qgru.class")
local clib = require("qgru.clib")
local nn = require("qgru.nn")
local serialize = require("qgru.serialize")
local progress = require("qgru.progress")

local train = {}

train.HOOKS = { "onStart", "onStartEpoch", "onSample", "onForward", "onForwardCriterion", "onBackward", "onUpdate",
                "onLog", "onEndEpoch", "onEvaluate", "onCheckpoint", "onEnd" }

local function strict_hooks()
  local allowed = {}
  for _, h in ipairs(train.HOOKS) do allowed[h] = true end
  return setmetatable({}, {
    __newindex = function(t, k, v)
      if not allowed[k] then
        error("qgru: unknown hook '" .. tostring(k) .. "' (hooks: " .. table.concat(train.HOOKS, ", ") .. ")", 2)
      end
      if v ~= nil and type(v) ~= "function" then error("qgru: hook '" .. k .. "' must be a function", 2) end
      rawset(t, k, v)
    end,
  })
end

-- The quantizer state of a model with quantizers (saved in checkpoints), else nil.
local function quant_state(model)
  local q = require("qgru.quant")
  return #q.quantizers(model) > 0 and q.state(model) or nil
end

-- t on device: itself when it is there, else a copy into a staging tensor kept in bufs[key]
-- (re-created only when the shape or dtype changes), so a step moves its batch with one copy
-- per tensor and allocates nothing in steady state. Exported as train.toDevice for loops that
-- do not use the engine (recipes/sweep.lua's timing).
local function to_device(bufs, key, t, device)
  if t:device() == device then return t end
  local b = bufs[key]
  if not (b and b:device() == device and b:dtype() == t:dtype() and b:sameShape(t:shape())) then
    b = t:to(device)
    bufs[key] = b
    return b
  end
  return b:copy(t)
end

train.toDevice = to_device

local Engine = class("train.Engine")
train.Engine = Engine

function Engine:__init(opts)
  opts = opts or {}
  for _, k in ipairs({ "model", "criterion" }) do
    if not opts[k] then error("qgru: train.Engine: missing '" .. k .. "'", 3) end
  end
  self.model, self.criterion, self.optimizer = opts.model, opts.criterion, opts.optimizer
  self.log = opts.log or function(line) progress.write(io.stdout, line) end
  self.logfile = opts.logfile
  if opts.progress ~= nil and opts.progress ~= false and opts.progress ~= true and type(opts.progress) ~= "table" then
    error("qgru: train.Engine: progress must be true, false or a table of progress.new options, got " .. tostring(opts.progress), 3)
  end
  self.progress = opts.progress
  self.hooks = strict_hooks()
  self.classify = self.criterion:isInstanceOf(nn.CrossEntropy)
  self._staging = {}
end

function Engine:_hook(name, state)
  local h = self.hooks[name]
  if h then h(state) end
end

-- One batch on the model's device (x, y), and the number of correct predictions (counted in C).
function Engine:_toModel(x, y)
  local dev = self.model:device()
  return to_device(self._staging, "x", x, dev), to_device(self._staging, "y", y, dev)
end

function Engine:_correct(out, y)
  return self.classify and self.criterion:countCorrect(out, y) or 0
end

-- A progress bar of total steps when the engine draws bars and the output is a terminal, else nil.
function Engine:_bar(total, label, start)
  if self.progress == false or total < 1 then return nil end
  local po = { total = total, label = label, start = start }
  if type(self.progress) == "table" then for k, v in pairs(self.progress) do po[k] = v end end
  local bar = progress.new(po)
  return bar.tty and bar or nil
end

function Engine:evaluate(ds, batch_size)
  local was_training = self.model.train
  self.model:evaluate()
  local total_loss, total_correct, n = 0, 0, 0
  local bar = self:_bar(ds:numBatches(batch_size or 256), "evaluate")
  local k = 0
  for x, y in ds:batches(batch_size or 256) do
    x, y = self:_toModel(x, y)
    local out = self.model:forward(x)
    local bs = x:size(2)
    total_loss = total_loss + self.criterion:forward(out, y) * bs
    total_correct = total_correct + self:_correct(out, y)
    n = n + bs
    k = k + 1
    if bar then bar:update(k) end
  end
  if bar then bar:done() end
  if was_training then self.model:training() end
  return total_loss / n, self.classify and total_correct / n or nil
end

local OPTS = { data = true, batch_size = true, epochs = true, seed = true, shuffle = true, eval = true,
               eval_batch_size = true, log_every = true, checkpoint = true, checkpoint_every = true, resume = true,
               lr_schedule = true, nan = true, max_steps = true, options = true }

-- ---- the engine's own behaviours, as named hooks of (engine, run, state) ----------------------
-- run: the options of this train() call (o), batch_size, epochs, batches per epoch (nb), and the
-- metric windows. They run at fixed points of the loop, before or after the user's hooks of the
-- same moment, in the order the loop names them.
local builtin = {}

-- Options that may change between a run and its resume (the rest must be equal).
train.RESUME_MAY_DIFFER = { resume = true, threads = true, epochs = true, name = true, data_dir = true, device = true, force = true }

-- Resumes from checkpoint o.resume: everything (tensors, metadata, quantizers, the options of
-- the run) is checked before anything is loaded; on any mismatch nothing changes.
local function check_resume(self, o, bs, seed)
  if type(o.resume) ~= "string" then error("qgru: Engine:train: resume must be a checkpoint path, got " .. type(o.resume), 0) end
  if not self.optimizer then error("qgru: Engine:train: the engine has no optimizer", 0) end
  local plan = serialize.readCheckpoint(o.resume, self.model, self.optimizer)
  local saved = plan.state
  local diffs = {}
  if saved.batch_size and saved.batch_size ~= bs then
    diffs[#diffs + 1] = string.format("batch_size: checkpoint %s, now %s (its position in the epoch would be wrong)", tostring(saved.batch_size), tostring(bs))
  end
  if saved.seed ~= nil and saved.seed ~= seed then
    diffs[#diffs + 1] = string.format("seed: checkpoint %s, now %s", tostring(saved.seed), tostring(seed))
  end
  if type(saved.options) == "table" and type(o.options) == "table" then
    local keys = {}
    for k in pairs(saved.options) do keys[#keys + 1] = tostring(k) end
    for k in pairs(o.options) do if saved.options[k] == nil then keys[#keys + 1] = tostring(k) end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local a, b = saved.options[k], o.options[k]
      local reported = (k == "batch_size" and saved.batch_size ~= bs) or (k == "seed" and saved.seed ~= seed)
      if not train.RESUME_MAY_DIFFER[k] and a ~= b and not reported then
        diffs[#diffs + 1] = string.format("option %s: checkpoint %s, now %s", k, tostring(a), tostring(b))
      end
    end
  end
  if #diffs > 0 then
    error(string.format("qgru: Engine:train: cannot resume from %s, the run differs from the checkpoint's (nothing was loaded):\n  %s",
                        o.resume, table.concat(diffs, "\n  ")), 0)
  end
  return plan
end

-- Checks that o (the options of a later train{...}: resume, batch_size, seed, options) can
-- resume from o.resume, changing nothing; raises the problems. Recipes call it before loading data.
function Engine:checkResume(o)
  check_resume(self, o, o.batch_size or 128, o.seed or 0)
  return true
end

-- Names of the parameters holding NaN or Inf (for the NaN guard's message).
local function nonfinite_params(model)
  local bad = {}
  for _, p in ipairs(model:namedParameters()) do
    local n = p.param:countNonFinite()
    if n > 0 then bad[#bad + 1] = string.format("%s (%d)", p.name, n) end
  end
  return bad
end

-- Restores model, optimizer, quantizer state and position from o.resume: everything is checked
-- first (check_resume); on any mismatch nothing changes.
function builtin.resume(self, run, state)
  local o = run.o
  local plan = check_resume(self, o, run.bs, state.seed)
  local saved = plan.state
  plan.apply()
  for _, k in ipairs({ "epoch", "batch", "step", "history", "losses", "seed", "options" }) do
    if saved[k] ~= nil then state[k] = saved[k] end
  end
  self.log(string.format("resumed from %s at epoch %d, batch %d (step %d)", o.resume, state.epoch, state.batch, state.step))
end

-- Saves o.checkpoint: model, optimizer, RNG, position, history and the quantizer state.
function builtin.checkpoint(self, run, state)
  local o = run.o
  if not o.checkpoint then return end
  serialize.saveCheckpoint(o.checkpoint, self.model, self.optimizer, {
    epoch = state.epoch, batch = state.batch, step = state.step, history = state.history, losses = state.losses,
    seed = state.seed, options = o.options, batch_size = run.bs, epochs = run.epochs, quant = quant_state(self.model) })
  self:_hook("onCheckpoint", state)
end

-- Starts the metric windows of an epoch, and its progress bar on a terminal.
function builtin.startMetrics(self, run, state)
  run.t_epoch, run.t_win = clib.wall_time(), clib.wall_time()
  run.win = { loss = 0, correct = 0, n = 0, steps = 0 }
  run.ep = { loss = 0, correct = 0, n = 0 }
  run.bar = self:_bar(run.nb, string.format("epoch %d/%d", state.epoch, run.epochs), state.batch)
end

-- Adds an update's loss and correct count to the log window and the epoch.
function builtin.recordMetrics(self, run, state, loss, n, c)
  local w, e = run.win, run.ep
  w.loss, w.correct, w.n, w.steps = w.loss + loss * n, w.correct + c, w.n + n, w.steps + 1
  e.loss, e.correct, e.n = e.loss + loss * n, e.correct + c, e.n + n
  state.losses[#state.losses + 1] = loss
end

-- The progress line, every log_every batches and at the end of the epoch (on a terminal: the
-- bar after every batch, and the line only in the log file).
function builtin.logProgress(self, run, state, b)
  local w = run.win
  if run.bar and run.ep.n > 0 then
    local e = run.ep
    run.bar:update(b, string.format("loss %.4f%s", e.loss / e.n, self.classify and string.format("  acc %.1f%%", 100 * e.correct / e.n) or ""))
  end
  if w.steps == 0 or not (b % run.log_every == 0 or b == run.nb) then return end
  local dt = clib.wall_time() - run.t_win
  local line = string.format("epoch %d/%d  batch %d/%d  loss %.4f%s  lr %.2e  %.1f ms/step  %.0f samples/s",
    state.epoch, run.epochs, b, run.nb, w.loss / w.n,
    self.classify and string.format("  acc %.1f%%", 100 * w.correct / w.n) or "",
    self.optimizer.lr, 1000 * dt / w.steps, w.n / dt)
  state.line = line
  if run.bar then
    if self.logfile then self.logfile(line) end
  else
    self.log(line)
  end
  self:_hook("onLog", state)
  run.t_win, run.win = clib.wall_time(), { loss = 0, correct = 0, n = 0, steps = 0 }
end

-- The epoch's record: train metrics, evaluation, history, the epoch line, onEndEpoch.
function builtin.endEpoch(self, run, state)
  local o, e = run.o, run.ep
  if run.bar then run.bar:done(); run.bar = nil end
  local rec = { epoch = state.epoch, seconds = clib.wall_time() - run.t_epoch }
  if e.n > 0 then
    rec.train_loss = e.loss / e.n
    if self.classify then rec.train_acc = e.correct / e.n end
    rec.samples_per_s = e.n / rec.seconds
  end
  if o.eval then
    rec.eval_loss, rec.eval_acc = self:evaluate(o.eval, o.eval_batch_size or 256)
    self:_hook("onEvaluate", state)
  end
  state.history[#state.history + 1] = rec
  self.log(string.format("epoch %d done in %.1f s%s%s", state.epoch, rec.seconds,
    rec.eval_loss and string.format("  eval loss %.4f", rec.eval_loss) or "",
    rec.eval_acc and string.format("  eval acc %.2f%%", 100 * rec.eval_acc) or ""))
  self:_hook("onEndEpoch", state)
end

-- One training step on batch b: the batch moves to the model's device (one copy per tensor),
-- forward, loss, NaN guard, backward, update, metrics; with the user's hooks in between.
function Engine:_step(run, state, x, y, b)
  x, y = self:_toModel(x, y)
  state.x, state.y = x, y
  self:_hook("onSample", state)
  if run.o.lr_schedule then self.optimizer.lr = run.o.lr_schedule(state.step, run.total_steps) end
  local out = self.model:forward(x)
  state.output = out
  self:_hook("onForward", state)
  local loss = self.criterion:forward(out, y)
  state.loss = loss
  self:_hook("onForwardCriterion", state)
  if loss ~= loss or loss == math.huge or loss == -math.huge then
    local msg = string.format("non-finite loss (%s) at epoch %d, batch %d, step %d", tostring(loss), state.epoch, b, state.step + 1)
    local badp = nonfinite_params(self.model)
    if #badp > 0 then msg = msg .. "; parameters with non-finite values: " .. table.concat(badp, ", ") end
    if run.nan_policy ~= "skip" then
      error("qgru: " .. msg .. (run.o.checkpoint and ("; the last checkpoint is " .. run.o.checkpoint) or ""), 0)
    end
    self.log("skipping the update: " .. msg)
  else
    self.model:zeroGrad()
    self.model:backward(x, self.criterion:backward(out, y))
    self:_hook("onBackward", state)
    state.grad_norm = self.optimizer:step()
    self:_hook("onUpdate", state)
    builtin.recordMetrics(self, run, state, loss, x:size(2), self:_correct(out, y))
  end
  state.step, state.batch = state.step + 1, b
end

function Engine:train(o)
  for k in pairs(o) do
    if not OPTS[k] then error("qgru: Engine:train: unknown option '" .. tostring(k) .. "'", 2) end
  end
  if not o.data then error("qgru: Engine:train: missing 'data'", 2) end
  if not self.optimizer then error("qgru: Engine:train: the engine has no optimizer", 2) end
  local bs, epochs = o.batch_size or 128, o.epochs or 1
  if type(epochs) ~= "number" or epochs < 1 or epochs % 1 ~= 0 then
    error("qgru: Engine:train: epochs must be a positive integer, got " .. tostring(epochs), 2)
  end
  if type(bs) ~= "number" or bs < 1 or bs % 1 ~= 0 then
    error("qgru: Engine:train: batch_size must be a positive integer, got " .. tostring(bs), 2)
  end
  local nb = o.data:numBatches(bs)
  local run = { o = o, bs = bs, epochs = epochs, nb = nb, total_steps = epochs * nb, nan_policy = o.nan or "error",
                log_every = o.log_every or math.max(1, math.floor(nb / 10)) }
  local state = { epoch = 1, batch = 0, step = 0, history = {}, losses = {}, seed = o.seed or 0,
                  model = self.model, criterion = self.criterion, optimizer = self.optimizer, engine = self }
  if o.resume then builtin.resume(self, run, state) end
  local function stop() return o.max_steps and state.step >= o.max_steps end
  self.model:training()
  self:_hook("onStart", state)
  while state.epoch <= epochs do
    self:_hook("onStartEpoch", state)
    builtin.startMetrics(self, run, state)
    for x, y, b in o.data:batches(bs, { shuffle = o.shuffle ~= false, seed = state.seed, epoch = state.epoch, start = state.batch }) do
      self:_step(run, state, x, y, b)
      builtin.logProgress(self, run, state, b)
      if o.checkpoint_every and state.step % o.checkpoint_every == 0 and b < nb then builtin.checkpoint(self, run, state) end
      if stop() then break end
    end
    if stop() and state.batch < nb then
      if run.bar then run.bar:done(); run.bar = nil end
      builtin.checkpoint(self, run, state)
      break
    end
    builtin.endEpoch(self, run, state)
    state.epoch, state.batch = state.epoch + 1, 0
    builtin.checkpoint(self, run, state)
    if stop() then break end
  end
  self:_hook("onEnd", state)
  return state
end

train.builtin = builtin

return train
