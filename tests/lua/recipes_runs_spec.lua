-- recipes_runs_spec.lua: the recipes in their run folders, run as a user runs them (luajit on
-- the recipe file, in a scratch folder, on tiny data): the main job interrupted in each phase
-- (a process that exits right after a float checkpoint, after calibrating, after a QAT
-- checkpoint, while exporting) and resumed ends with the same results and files as an
-- uninterrupted run, recomputing nothing that was finished; finished and unfinished runs are not
-- overwritten; another config reuses the float run; epochs outside 1.. and other bad options stop
-- before anything is written or loaded.
local qgru = require("qgru")
local clib = require("qgru.clib")
local U = require("testutil")
local json = qgru.json

local ROOT = clib.root
if ROOT:sub(1, 1) ~= "/" then ROOT = os.getenv("PWD") .. "/" .. ROOT end

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- Stops the recipe (exit status 3, as a killed job) at a chosen point: QGRU_TEST_STOP =
-- float:N (after the N-th checkpoint of the float run), qat:N (of the QAT phase), any:N (of
-- any training), calibrate
-- (right after the calibration, before it is recorded), export (at the first export).
local PREAMBLE = [[
local stop = os.getenv("QGRU_TEST_STOP")
if stop and stop ~= "" then
  local train, quant = require("qgru.train"), require("qgru.quant")
  local what, n = stop:match("^(%a+):?(%d*)$")
  n = tonumber(n) or 1
  if what == "float" or what == "qat" or what == "any" then
    local orig, k = train.builtin.checkpoint, 0
    train.builtin.checkpoint = function(self, run, state)
      orig(self, run, state)
      if run.o.checkpoint and (what == "any" or run.o.checkpoint:find(what == "float" and "/train_float" or "/qat", 1, true)) then
        k = k + 1
        if k == n then io.stdout:flush(); os.exit(3) end
      end
    end
  elseif what == "calibrate" then
    local orig = quant.calibrate
    quant.calibrate = function(...) orig(...); io.stdout:flush(); os.exit(3) end
  elseif what == "export" then
    quant.export = function() io.stdout:flush(); os.exit(3) end
  end
end
]]

local preamble_path
local function run_recipe(dir, recipe, args, stop)
  if not preamble_path then
    preamble_path = U.tmpname("_stop.lua")
    U.write_bytes(preamble_path, PREAMBLE)
  end
  local cmd = string.format("cd '%s' && QGRU_TEST_STOP='%s' QGRU_PROGRESS=plain QGRU_ROOT='%s' QGRU_LIB='%s' LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' " ..
                            "luajit -e \"dofile('%s')\" '%s/recipes/%s' %s 2>&1; echo \"rc=$?\"",
                            dir, stop or "", ROOT, os.getenv("QGRU_LIB") or (ROOT .. "/build/libqgru.so"), ROOT, ROOT, preamble_path,
                            ROOT, recipe, args)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- The records of a metrics.jsonl file.
local function jsonl(path)
  local t = {}
  for line in (read(path) or ""):gmatch("[^\n]+") do t[#t + 1] = json.decode(line) end
  return t
end

local function count(s, pat)
  local n = 0
  for _ in (s or ""):gmatch(pat) do n = n + 1 end
  return n
end

local TINY = "--hidden 8 --train_limit 256 --test_limit 256 --float_epochs 2 --epochs 2 --calib_batches 1 --lr 0.01 --config '" ..
             ROOT .. "/config/int8.json'"
local FLOAT_NAME = "train_float-epochs=2-hidden=8-test_limit=256-train_limit=256"

describe("recipes/qat.lua in its run folder", function()
  local ref, ref_dir
  setup(function()
    ref_dir = U.tmpname("_qat_ref")
    qgru.mkdir(ref_dir)
    local out, rc = run_recipe(ref_dir, "qat.lua", TINY)
    assert.are.equal(0, rc, out)
    ref = { out = out, dir = ref_dir .. "/" .. assert(out:match("recipes/qat%.lua  %->  (runs/[^\n ]+)"), out) }
  end)

  it("the name comes from the options that differ from the defaults; the float phase is a train_float run", function()
    assert.is_truthy(ref.out:find("recipes/qat.lua  ->  runs/qat-calib_batches=1-config=", 1, true), ref.out)
    local st = json.read(ref.dir .. "/run.json")
    assert.are.equal("finished", st.status)
    for _, p in ipairs({ "float", "calibrate", "qat", "export" }) do assert.is_truthy(st.phases[p], p) end
    for _, f in ipairs({ "options.json", "log.txt", "metrics.jsonl", "metrics.json", "float_model.safetensors", "calibrated.safetensors",
                         "checkpoint.safetensors", "model.safetensors", "qparams.json", "qparams.aimet.json", "weight_codes.safetensors" }) do
      assert.is_truthy(read(ref.dir .. "/" .. f), f)
    end
    assert.are.equal("finished", json.read(ref_dir .. "/runs/" .. FLOAT_NAME .. "/run.json").status)
    assert.is_truthy(read(ref_dir .. "/runs/" .. FLOAT_NAME .. "/model.safetensors"))
    -- metrics.jsonl: float, ptq, two QAT epochs
    local phases = {}
    for _, r in ipairs(jsonl(ref.dir .. "/metrics.jsonl")) do
      phases[#phases + 1] = r.phase .. (r.epoch and tostring(r.epoch) or "")
    end
    assert.are.same({ "float", "ptq", "qat1", "qat2" }, phases)
  end)

  it("interrupted in every phase and resumed, it ends as the uninterrupted run, recomputing nothing finished", function()
    local dir = U.tmpname("_qat_int")
    qgru.mkdir(dir)
    local d = ref.dir:match("(runs/[^/]+)$")
    local qdir, fdir = dir .. "/" .. d, dir .. "/runs/" .. FLOAT_NAME
    -- 1. killed after the float run's first epoch
    local out, rc = run_recipe(dir, "qat.lua", TINY, "float:1")
    assert.are.equal(3, rc, out)
    assert.are.equal("running", json.read(fdir .. "/run.json").status)
    assert.is_truthy(read(fdir .. "/checkpoint.safetensors"))
    -- 2. resumed: the float run continues at epoch 2; killed right after calibrating
    out, rc = run_recipe(dir, "qat.lua", TINY .. " --resume", "calibrate")
    assert.are.equal(3, rc, out)
    assert.is_truthy(out:find("resumed from runs/" .. FLOAT_NAME .. "/checkpoint.safetensors at epoch 2, batch 0", 1, true), out)
    assert.are.equal(1, count(read(fdir .. "/log.txt"), "epoch 1 done"))
    assert.are.equal(1, count(read(fdir .. "/log.txt"), "epoch 2 done"))
    assert.are.equal(2, count(read(fdir .. "/metrics.jsonl"), "\n"))
    assert.are.equal("finished", json.read(fdir .. "/run.json").status)
    local st = json.read(qdir .. "/run.json")
    assert.is_truthy(st.phases.float)
    assert.is_nil(st.phases.calibrate)
    -- without --resume an unfinished run is refused, and nothing changes
    local before = read(qdir .. "/run.json")
    out, rc = run_recipe(dir, "qat.lua", TINY)
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("holds an unfinished run", 1, true), out)
    assert.is_truthy(out:find("--resume continues it", 1, true), out)
    assert.is_nil(out:find("data:", 1, true), out)
    assert.are.equal(before, read(qdir .. "/run.json"))
    -- 3. resumed: calibration again (it was not recorded), killed after the first QAT epoch
    out, rc = run_recipe(dir, "qat.lua", TINY .. " --resume", "qat:1")
    assert.are.equal(3, rc, out)
    assert.is_truthy(out:find("float phase done before", 1, true), out)
    assert.is_nil(out:find("train_float.lua", 1, true), out)   -- the float run is not touched again
    assert.is_truthy(json.read(qdir .. "/run.json").phases.calibrate)
    -- 4. resumed: QAT continues at epoch 2; killed while exporting
    out, rc = run_recipe(dir, "qat.lua", TINY .. " --resume", "export")
    assert.are.equal(3, rc, out)
    assert.is_truthy(out:find("calibration done before", 1, true), out)
    assert.is_truthy(out:find("resumed from " .. d .. "/checkpoint.safetensors at epoch 2, batch 0", 1, true), out)
    assert.is_nil(out:find("epoch 1 done", 1, true), out)
    -- 5. resumed: export, finished
    out, rc = run_recipe(dir, "qat.lua", TINY .. " --resume")
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("epoch %d done"), out)   -- no training epoch was redone
    st = json.read(qdir .. "/run.json")
    assert.are.equal("finished", st.status)
    assert.are.equal(5, st.attempts)
    local log = read(qdir .. "/log.txt")
    assert.are.equal(1, count(log, "\nPTQ "))
    assert.are.equal(1, count(log, "epoch 1 done"))
    assert.are.equal(1, count(log, "epoch 2 done"))
    -- the same results and files as the uninterrupted run
    local a, b = json.read(ref.dir .. "/metrics.json"), json.read(qdir .. "/metrics.json")
    for _, k in ipairs({ "float_acc", "ptq_acc", "qat_acc" }) do assert.are.equal(a[k], b[k], k) end
    for _, f in ipairs({ "float_model.safetensors", "model.safetensors", "qparams.json", "qparams.aimet.json", "weight_codes.safetensors" }) do
      assert.is_true(read(ref.dir .. "/" .. f) == read(qdir .. "/" .. f), f)
    end
    local function lines(p)
      local t = {}
      for _, r in ipairs(jsonl(p .. "/metrics.jsonl")) do
        t[#t + 1] = string.format("%s %s %.17g", r.phase, tostring(r.epoch), r.test_acc)
      end
      return t
    end
    assert.are.same(lines(ref.dir), lines(qdir))
    -- 6. finished: not overwritten; --resume has nothing to do
    out, rc = run_recipe(dir, "qat.lua", TINY)
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("holds a finished run", 1, true), out)
    out, rc = run_recipe(dir, "qat.lua", TINY .. " --resume")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("is finished already", 1, true), out)
  end)

  it("another config reuses the float run instead of training it again", function()
    local out, rc = run_recipe(ref_dir, "qat.lua", TINY:gsub("int8%.json", "w4a8.json"))
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("float weights: runs/" .. FLOAT_NAME .. "/model.safetensors\n", 1, true), out)
    assert.is_nil(out:find("training them", 1, true), out)
    assert.are.equal(1, count(read(ref_dir .. "/runs/" .. FLOAT_NAME .. "/log.txt"), "epoch 1 done"))
  end)

  it("--force moves the finished run aside and runs again", function()
    local out, rc = run_recipe(ref_dir, "qat.lua", TINY .. " --force")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("moved the previous run to " .. ref.dir:match("(runs/[^/]+)$") .. ".old-1", 1, true), out)
    assert.is_truthy(read(ref.dir .. ".old-1/model.safetensors"))
    assert.are.equal(read(ref.dir .. ".old-1/model.safetensors"), read(ref.dir .. "/model.safetensors"))
  end)
end)

describe("recipe options", function()
  local dir
  setup(function()
    dir = U.tmpname("_opts")
    qgru.mkdir(dir)
  end)

  it("epochs of 0 or less stop with the message and the usage, writing and loading nothing", function()
    for _, c in ipairs({ { "train_float.lua", "--epochs 0", "option --epochs must be >= 1, got 0" },
                         { "train_float.lua", "--epochs -1", "option --epochs must be >= 1, got -1" },
                         { "qat.lua", "--epochs 0", "option --epochs must be >= 1, got 0" },
                         { "qat.lua", "--float_epochs -1", "option --float_epochs must be >= 1, got -1" },
                         { "qat.lua", "--epochs 1.5", "option --epochs expects an integer, got 1.5" },
                         { "qat.lua", "--config " .. ROOT .. "/config/nosuch.json", "nosuch.json" },
                         { "qat.lua", "--weights /no/such.safetensors", "--weights /no/such.safetensors: no such file" },
                         { "qat.lua", "--resume /tmp", "not a run folder" } }) do
      local out, rc = run_recipe(dir, c[1], c[2])
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find(c[3], 1, true), out)
      assert.is_truthy(out:find("recipes/" .. c[1] .. ":", 1, true), out)   -- the usage
      assert.is_nil(out:find("data:", 1, true), out)
      assert.is_nil(io.open(dir .. "/runs", "rb"), out)                     -- nothing was written
    end
  end)

  it("a checkpoint that does not fit stops the run before the data is loaded", function()
    -- a train_float run of hidden 8 whose checkpoint is resumed as hidden 16 under the same name
    local out, rc = run_recipe(dir, "train_float.lua", "--hidden 8 --train_limit 128 --test_limit 128 --epochs 2 --name f", "any:1")
    assert.are.equal(3, rc, out)
    out, rc = run_recipe(dir, "train_float.lua", "--hidden 16 --train_limit 128 --test_limit 128 --epochs 2 --name f --resume --data_dir /no/such/data")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("cannot resume runs/f: its options differ (nothing was changed):\n  hidden: the run has 8, now 16", 1, true), out)
    assert.is_nil(out:find("/no/such/data/", 1, true), out)
    -- resumed with the same options: finishes, the first epoch is not trained again
    out, rc = run_recipe(dir, "train_float.lua", "--hidden 8 --train_limit 128 --test_limit 128 --epochs 2 --name f --resume")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("resumed from runs/f/checkpoint.safetensors at epoch 2", 1, true), out)
    assert.is_nil(out:find("epoch 1 done", 1, true), out)
    assert.are.equal(2, #json.read(dir .. "/runs/f/metrics.json").history)
  end)
end)

describe("train.Engine", function()
  it("refuses epochs and batch sizes that are not positive integers", function()
    local m = qgru.nn.Linear(2, 2)
    local e = qgru.train.Engine{ model = m, criterion = qgru.nn.MSE(), optimizer = qgru.optim.SGD(m, { lr = 0.1 }), log = function() end }
    local ds = qgru.data.Dataset(qgru.zeros({ 4, 1, 2 }), qgru.zeros({ 4, 2 }))
    assert.raises_match(function() e:train{ data = ds, epochs = 0 } end, "Engine:train: epochs must be a positive integer, got 0")
    assert.raises_match(function() e:train{ data = ds, epochs = -1 } end, "epochs must be a positive integer, got -1")
    assert.raises_match(function() e:train{ data = ds, epochs = 2, batch_size = 0 } end, "batch_size must be a positive integer, got 0")
  end)
end)
