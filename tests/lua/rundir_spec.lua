-- rundir_spec.lua: run directories (qgru.rundir) in-process: derived names, the rules for an
-- existing folder (finished: never overwritten; unfinished: --resume or --force; options that
-- differ are named), logs appended and never truncated, metrics lines not duplicated by a
-- resumed epoch, locks of live and dead processes, and cli's --resume alone / given options.
local qgru = require("qgru")
local U = require("testutil")
local rundir, cli, json, posix = qgru.rundir, qgru.cli, qgru.json, require("qgru.posix")

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end
local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local SPEC = rundir.options({
  epochs = { 12, "epochs", { int = true, min = 1 } },
  lr = { 2e-3, "lr" },
  config = { "config/int8.json", "config" },
  weights = { "", "weights" },
  threads = { 0, "threads" },
}, { resume = true })

local function parse(args) return cli.parse(args, SPEC) end

describe("rundir.deriveName", function()
  it("is the recipe's name for the defaults, plus sorted key=value for the options that differ", function()
    assert.are.equal("qat", rundir.deriveName("qat", SPEC, parse({})))
    assert.are.equal("qat-epochs=3-lr=0.0001", rundir.deriveName("qat", SPEC, parse({ "--lr", "1e-4", "--epochs", "3" })))
    -- name, resume, force and threads do not name a run
    assert.are.equal("qat", rundir.deriveName("qat", SPEC, parse({ "--threads", "2", "--force", "--resume" })))
  end)
  it("shortens paths, replaces odd characters and bounds the length with a hash", function()
    assert.are.equal("qat-config=w4a8", rundir.deriveName("qat", SPEC, parse({ "--config", "config/w4a8.json" })))
    assert.are.equal("qat-weights=train_float-epochs=3_model",
                     rundir.deriveName("qat", SPEC, parse({ "--weights", "runs/train_float-epochs=3/model.safetensors" })))
    assert.are.equal("qat-weights=a_b_c_d", rundir.deriveName("qat", SPEC, parse({ "--weights", "a b/c$d" })))
    local long = rundir.deriveName("qat", SPEC, parse({ "--weights", string.rep("x", 300) }))
    assert.are.equal(100, #long)
    assert.is_truthy(long:match("^qat%-weights=xxxx.*%-%x%x%x%x%x%x%x%x$"), long)
    local long2 = rundir.deriveName("qat", SPEC, parse({ "--weights", string.rep("x", 299) .. "y" }))
    assert.are_not.equal(long, long2)   -- the same prefix, another hash
  end)
end)

describe("rundir", function()
  local root
  before_each(function()
    root = U.tmpname("_runs")
    qgru.mkdir(root)
  end)
  local function prep(args, extra)
    local opt = parse(args or {})
    local o = { recipe = "qat", spec = SPEC, opt = opt, name = opt.name, resume = opt.resume, force = opt.force, root = root, echo = false }
    for k, v in pairs(extra or {}) do o[k] = v end
    return rundir.prepare(o)
  end

  it("prepare creates nothing; create writes options.json, run.json (running), the lock; finish marks it finished", function()
    local run = prep({ "--epochs", "3" })
    assert.are.equal(root .. "/qat-epochs=3", run.dir)
    assert.is_nil(read(run.dir .. "/run.json"))
    assert.is_nil(io.open(run.dir, "rb"))
    run:create()
    local st = json.read(run.dir .. "/run.json")
    assert.are.equal("running", st.status)
    assert.are.equal("qat", st.recipe)
    assert.are.equal(1, st.attempts)
    local o = json.read(run.dir .. "/options.json")
    assert.are.equal(3, o.epochs)
    assert.are.equal("config/int8.json", o.config)
    assert.is_nil(o.resume)
    assert.are.equal(string.format("%d %s\n", posix.pid(), posix.hostname()), read(run.dir .. "/run.lock"))
    run:log("first line")
    run:completePhase("float", { test_acc = 0.5 })
    run:finish({ acc = 0.5 })
    assert.are.equal("finished", json.read(run.dir .. "/run.json").status)
    assert.are.equal(0.5, json.read(run.dir .. "/run.json").phases.float.test_acc)
    assert.are.equal(0.5, json.read(run.dir .. "/metrics.json").acc)
    assert.is_nil(read(run.dir .. "/run.lock"))
  end)

  it("a finished run is not overwritten; --resume with the same options has nothing to do; --force moves it aside", function()
    local run = prep({}):create()
    run:log("the first run's log")
    write(run.dir .. "/model.safetensors", "weights of the first run")
    run:finish({ acc = 1 })
    assert.raises_match(function() prep({}) end, "qgru: " .. root .. "/qat holds a finished run")
    assert.raises_match(function() prep({}) end, "use --name for another run, --force to move it aside")
    local again = prep({ "--resume" })
    assert.is_true(again.finished)
    -- a run that may differ only in threads is still the same finished run
    assert.is_true(prep({ "--resume", "--threads", "4", "--name", "qat" }).finished)
    -- more epochs: the finished run continues (resumed, not finished)
    local more = prep({ "--resume", "--epochs", "20", "--name", "qat" })
    assert.is_false(more.finished)
    assert.is_true(more.resumed)
    assert.are.equal("weights of the first run", read(run.dir .. "/model.safetensors"))
    local forced = prep({ "--force" }):create()
    assert.are.equal(root .. "/qat.old-1", forced.moved_to)
    assert.are.equal("weights of the first run", read(root .. "/qat.old-1/model.safetensors"))
    assert.is_truthy(read(root .. "/qat.old-1/log.txt"):find("the first run's log", 1, true))
    assert.is_nil(read(root .. "/qat/model.safetensors"))
    assert.are.equal("running", json.read(root .. "/qat/run.json").status)
    forced:finish()
    prep({ "--force" }):create():close()
    assert.is_truthy(read(root .. "/qat.old-2/run.json"))   -- the next one goes to .old-2
  end)

  it("an unfinished run needs --resume or --force; resuming keeps phases and appends to the log", function()
    local run = prep({}):create()
    run:log("attempt one")
    run:completePhase("float", { test_acc = 0.25 })
    run:close()
    assert.raises_match(function() prep({}) end, "holds an unfinished run")
    assert.raises_match(function() prep({}) end, "phases done: float): --resume continues it, --force moves it aside")
    local r2 = prep({ "--resume" })
    assert.is_true(r2.resumed)
    assert.is_false(r2.finished)
    r2:create()
    assert.are.equal(0.25, r2:phase("float").test_acc)
    assert.is_nil(r2:phase("calibrate"))
    r2:log("attempt two")
    r2:close()
    local log = read(run.dir .. "/log.txt")
    assert.is_truthy(log:find("attempt one\n", 1, true))
    assert.is_truthy(log:find("attempt two\n", 1, true))
    assert.are.equal(2, json.read(run.dir .. "/run.json").attempts)
    -- a checkpoint alone also makes a run resumable
    local c = prep({ "--name", "ck" }):create()
    write(c.dir .. "/checkpoint.safetensors", "x")
    c:close()
    assert.raises_match(function() prep({ "--name", "ck" }) end, "holds an unfinished run")
    -- a run that stopped before doing anything is simply reused (its log is appended to)
    local e = prep({ "--name", "empty" }):create()
    e:log("stopped early")
    e:close()
    local e2 = prep({ "--name", "empty" })
    assert.is_false(e2.resumed)
    e2:create():log("next")
    e2:close()
    assert.are.equal("stopped early\nnext\n", read(e.dir .. "/log.txt"))
  end)

  it("resuming with options that may not differ names them and changes nothing", function()
    local run = prep({ "--name", "r", "--lr", "0.01" }):create()
    run:completePhase("float", {})
    run:close()
    local before = read(run.dir .. "/run.json")
    local ok, err = pcall(prep, { "--name", "r", "--lr", "0.02", "--config", "config/w4a8.json", "--epochs", "5", "--resume" })
    assert.is_false(ok)
    assert.is_truthy(err:find("cannot resume " .. root .. "/r: its options differ (nothing was changed):\n" ..
                              "  config: the run has 'config/int8.json', now 'config/w4a8.json'\n  lr: the run has 0.01, now 0.02", 1, true), err)
    assert.is_nil(err:find("epochs", 1, true))   -- epochs may differ
    assert.are.equal(before, read(run.dir .. "/run.json"))
  end)

  it("--resume FOLDER takes the run's options for every option not given", function()
    local run = prep({ "--lr", "0.01", "--epochs", "3" }):create()
    run:completePhase("float", {})
    run:close()
    local r = prep({ "--resume", run.dir })
    assert.are.equal(0.01, r.opt.lr)
    assert.are.equal(3, r.opt.epochs)
    assert.are.equal(run.dir, r.dir)
    assert.is_true(r.resumed)
    local r2 = prep({ "--resume", run.dir .. "/", "--epochs", "6" })
    assert.are.equal(6, r2.opt.epochs)
    assert.raises_match(function() prep({ "--resume", run.dir, "--lr", "0.5" }) end, "lr: the run has 0.01, now 0.5")
    assert.raises_match(function() prep({ "--resume", root .. "/nothing" }) end, "--resume " .. root .. "/nothing: no such run folder")
  end)

  it("metrics.jsonl: one line per record, an epoch redone after a resume is not written twice", function()
    local run = prep({}):create()
    assert.is_true(run:metric({ phase = "qat", epoch = 1, acc = 0.5 }))
    assert.is_true(run:metric({ phase = "ptq", acc = 0.4 }))
    run:close()
    local r2 = prep({ "--resume" }):create()
    assert.is_false(r2:metric({ phase = "qat", epoch = 1, acc = 0.5 }))
    assert.is_true(r2:metric({ phase = "qat", epoch = 2, acc = 0.6 }))
    local lines = {}
    for l in read(run.dir .. "/metrics.jsonl"):gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.are.same({ '{"acc":0.5,"epoch":1,"phase":"qat"}', '{"acc":0.40000000000000002,"phase":"ptq"}',
                      '{"acc":0.59999999999999998,"epoch":2,"phase":"qat"}' }, lines)
    assert.are.equal(3, #r2:metrics())
  end)

  it("a folder in use by a live process is refused; a dead process's lock is taken over", function()
    local run = prep({}):create()
    run:close()
    write(run.dir .. "/run.lock", "1 " .. posix.hostname() .. "\n")   -- pid 1 always lives
    assert.raises_match(function() prep({ "--resume" }) end, root .. "/qat is in use by process 1 (this machine)")
    write(run.dir .. "/run.lock", "1 some-other-host\n")
    assert.raises_match(function() prep({ "--resume" }) end, "in use by process 1 on some-other-host (if that run is gone, remove")
    -- a pid that does not exist: find one
    local dead = 4194000
    while posix.alive(dead) do dead = dead - 1 end
    write(run.dir .. "/run.lock", dead .. " " .. posix.hostname() .. "\n")
    local r = prep({ "--resume" }):create()
    assert.are.equal(string.format("%d %s\n", posix.pid(), posix.hostname()), read(run.dir .. "/run.lock"))
    r:close()
  end)

  it("folders of an earlier qgru (no run.json) are neither overwritten nor resumed, unless asked", function()
    qgru.mkdir(root .. "/qat")
    write(root .. "/qat/model.safetensors", "old")
    assert.raises_match(function() prep({}) end, "holds files of an earlier qgru version (no run.json)")
    assert.raises_match(function() prep({ "--resume" }) end, "holds files of an earlier qgru version")
    local l = prep({}, { legacy = "use" })
    assert.is_true(l.legacy and l.finished)
    local f = prep({ "--force" }):create()
    assert.are.equal("old", read(root .. "/qat.old-1/model.safetensors"))
    f:close()
    -- a file where the folder should be
    write(root .. "/afile", "x")
    assert.raises_match(function() prep({ "--name", "afile" }) end, root .. "/afile exists and is not a folder")
  end)

  it("run:plot writes a chart through qgru.plot when that module is there, and says false otherwise", function()
    local run = prep({}):create()
    local saved = package.loaded["qgru.plot"]
    package.loaded["qgru.plot"] = { lines = function(o) return "<svg>" .. o.title .. ":" .. #o.series[1].points .. "</svg>" end,
                                    write = function(path, text) write(path, text) end }
    assert.is_true(run:plot("curves.svg", { title = "t", series = { { label = "a", points = { { 1, 2 }, { 2, 3 } } } } }))
    assert.are.equal("<svg>t:2</svg>", read(run.dir .. "/curves.svg"))
    package.loaded["qgru.plot"] = {}   -- a module without charts
    local ok_plot = run:plot("other.svg", { title = "t", series = {} })
    package.loaded["qgru.plot"] = saved
    assert.is_false(ok_plot)
    assert.is_nil(read(run.dir .. "/other.svg"))
    run:close()
  end)

  it("another recipe's run of the same name is refused", function()
    local run = prep({}):create()
    run:close()
    assert.raises_match(function() prep({ "--name", "qat" }, { recipe = "calibrate" }) end, "holds a run of qat, not calibrate")
  end)
end)

describe("cli", function()
  it("--resume alone takes the bare value; cli.given lists the options on the command line", function()
    local o = parse({ "--resume", "--epochs", "3" })
    assert.are.equal("true", o.resume)
    assert.are.equal("runs/x", parse({ "--resume", "runs/x" }).resume)
    assert.are.equal("true", parse({ "--epochs", "3", "--resume" }).resume)
    assert.are.same({ resume = true, epochs = true }, cli.given(o))
    assert.are.same({}, cli.given(parse({})))
  end)
end)
