-- progress_spec.lua: progress bars (qgru.progress) with the terminal and the clock injected: the
-- rewritten line (bar, count, text, ETA) on a terminal, nothing on a pipe, a whole line printed
-- above a live bar, the training engine's bar and log lines in both modes, calibration's
-- progress callback.
local qgru = require("qgru")
local progress = qgru.progress
local ffi = require("ffi")
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite); int unsetenv(const char *name);")

-- A file-like collector.
local function sink()
  local s = { parts = {} }
  function s:write(...) for _, p in ipairs({ ... }) do self.parts[#self.parts + 1] = tostring(p) end return self end
  function s:flush() end
  function s:text() return table.concat(self.parts) end
  return s
end

-- A clock the test moves.
local function fake_clock()
  local c = { t = 100 }
  return c, function() return c.t end
end

describe("progress", function()
  it("on a terminal: one rewritten line with a bar, the count, the caller's text and the ETA", function()
    local out = sink()
    local c, clock = fake_clock()
    local bar = progress.new{ total = 4, label = "epoch 1/2", out = out, tty = true, clock = clock, width = 8, columns = 200 }
    assert.is_true(bar.tty)
    c.t = 101
    bar:update(1, "loss 2.3000")
    -- 1 of 4 in 1 s: 3 s left
    assert.are.equal("\r\27[Kepoch 1/2 [##......]  25% 1/4  loss 2.3000  ETA 0:03", out:text())
    c.t = 101.05
    bar:update(2, "loss 2.1000")   -- within the redraw interval: not drawn
    assert.are.equal(1, #out.parts / 2)
    c.t = 103
    bar:update(3)                   -- the text stays
    assert.are.equal("\r\27[Kepoch 1/2 [######..]  75% 3/4  loss 2.1000  ETA 0:01", out.parts[#out.parts - 1] .. out.parts[#out.parts])
    c.t = 103.01
    bar:update(4)                   -- the last item always draws, with the time taken
    assert.are.equal("epoch 1/2 [########] 100% 4/4  loss 2.1000  in 0:03", out.parts[#out.parts])
    bar:done()
    assert.are.equal("\r\27[K", out.parts[#out.parts])
  end)

  it("cuts the line to the terminal's width, counts the ETA from a resumed start", function()
    local out = sink()
    local c, clock = fake_clock()
    local bar = progress.new{ total = 100, label = "calibrate", out = out, tty = true, clock = clock, width = 10, columns = 30, start = 50 }
    c.t = 110
    bar:update(60, "a long text that does not fit")
    assert.are.equal("calibrate [######....]  60% 6", out.parts[#out.parts])   -- 29 characters
    -- 10 items in 10 s since the start at 50: 40 left, 40 s
    assert.are.equal("calibrate [######....]  60% 60/100  ETA 0:40", (function()
      bar.columns = 200
      bar.info = ""
      return bar:line()
    end)())
  end)

  it("elsewhere it writes nothing", function()
    local out = sink()
    local bar = progress.new{ total = 3, out = out, tty = false }
    for i = 1, 3 do bar:update(i, "x") end
    bar:done()
    assert.are.equal("", out:text())
    assert.is_false(bar.tty)
  end)

  it("progress.write prints a line above a live bar and redraws it", function()
    local out = sink()
    local _, clock = fake_clock()
    local bar = progress.new{ total = 2, label = "b", out = out, tty = true, clock = clock, width = 2, columns = 80 }
    bar:update(1)
    local n = #out.parts
    progress.write(out, "a log line")
    assert.are.equal("\r\27[Ka log line\nb [#.]  50% 1/2  ETA 0:00", table.concat(out.parts, "", n + 1))
    bar:done()
    local m = #out.parts
    progress.write(out, "after")
    assert.are.equal("after\n", table.concat(out.parts, "", m + 1))
  end)

  it("formats times; detects terminals (QGRU_PROGRESS forces a mode)", function()
    assert.are.equal("0:03", progress.formatTime(3.2))
    assert.are.equal("4:07", progress.formatTime(247))
    assert.are.equal("1:05:09", progress.formatTime(3909))
    assert.are.equal("?", progress.formatTime(0 / 0))
    assert.is_false(progress.isTerminal(sink()))
    ffi.C.setenv("QGRU_PROGRESS", "bar", 1)
    assert.is_true(progress.isTerminal(sink()))
    assert.is_true(progress.new{ total = 1, out = sink() }.tty)
    ffi.C.setenv("QGRU_PROGRESS", "plain", 1)
    assert.is_false(progress.isTerminal(io.stdout))
    ffi.C.unsetenv("QGRU_PROGRESS")
    assert.raises_match(function() progress.new{ total = 0 } end, "progress.new: total must be a positive integer, got 0")
  end)
end)

describe("training engine progress", function()
  local function setup_engine(prog)
    qgru.seed(3)
    local ds = qgru.data.adding(64, 5, 2)
    local model = qgru.nn.Sequential():add(qgru.nn.GRU(2, 4)):add(qgru.nn.Last()):add(qgru.nn.Linear(4, 1))
    local logged, filed = {}, {}
    local e = qgru.train.Engine{ model = model, criterion = qgru.nn.MSE(), optimizer = qgru.optim.Adam(model, { lr = 1e-2 }),
                                 log = function(l) logged[#logged + 1] = l end, logfile = function(l) filed[#filed + 1] = l end,
                                 progress = prog }
    return e, ds, logged, filed
  end

  it("on a terminal: a bar per epoch, the periodic lines only in the log file, the epoch lines in the log", function()
    local out = sink()
    local e, ds, logged, filed = setup_engine({ tty = true, out = out, columns = 200, interval = 0 })
    e:train{ data = ds, batch_size = 16, epochs = 2, seed = 1, log_every = 2, eval = ds, eval_batch_size = 32 }
    assert.are.same({ "epoch 1/2  batch 2/4", "epoch 1/2  batch 4/4", "epoch 2/2  batch 2/4", "epoch 2/2  batch 4/4" },
                    (function() local t = {} for _, l in ipairs(filed) do t[#t + 1] = l:match("^epoch %d/%d  batch %d/%d") end return t end)())
    assert.are.equal(2, #logged)
    assert.is_truthy(logged[1]:match("^epoch 1 done in"))
    local text = out:text()
    assert.is_truthy(text:find("\r\27[Kepoch 1/2 [", 1, true), text)
    assert.is_truthy(text:find("4/4  loss ", 1, true), text)
    assert.is_truthy(text:find("epoch 2/2 [", 1, true), text)
    assert.is_truthy(text:find("\r\27[Kevaluate [########################] 100% 2/2", 1, true), text)   -- the evaluation's bar
    assert.are.equal("\r\27[K", out.parts[#out.parts])   -- cleared at the end of the epoch
  end)

  it("elsewhere: the periodic lines are printed as before, no bar", function()
    local out = sink()
    local e, ds, logged, filed = setup_engine({ tty = false, out = out })
    e:train{ data = ds, batch_size = 16, epochs = 1, seed = 1, log_every = 2 }
    assert.are.equal(3, #logged)   -- batch 2, batch 4, epoch done
    assert.is_truthy(logged[1]:match("^epoch 1/1  batch 2/4  loss "))
    assert.are.equal(0, #filed)
    assert.are.equal("", out:text())
    local e2, ds2, logged2 = setup_engine(false)
    e2:train{ data = ds2, batch_size = 16, epochs = 1, seed = 1, log_every = 2 }
    assert.are.equal(3, #logged2)
    assert.raises_match(function() qgru.train.Engine{ model = qgru.nn.Linear(1, 1), criterion = qgru.nn.MSE(), progress = "yes" } end,
                        "progress must be true, false or a table")
  end)

  it("calibration reports every forward of its sweeps", function()
    qgru.seed(4)
    local model = qgru.nn.Sequential():add(qgru.nn.GRU(2, 4)):add(qgru.nn.Last()):add(qgru.nn.Linear(4, 1))
    qgru.quant.prepare(model, qgru.quant.uniform(8))
    local ds = qgru.data.adding(64, 5, 2)
    local calls = {}
    qgru.quant.calibrate(model, ds, { method = "histogram", passes = 2, batches = 3, batch_size = 16,
                                      progress = function(d, t) calls[#calls + 1] = d .. "/" .. t end })
    -- 2 passes x (a min/max sweep + a histogram sweep) x 3 batches
    local want = {}
    for i = 1, 12 do want[i] = i .. "/12" end
    assert.are.same(want, calls)
    calls = {}
    qgru.quant.calibrate(model, ds, { method = "minmax", passes = 1, batches = 2, batch_size = 16,
                                      progress = function(d, t) calls[#calls + 1] = d .. "/" .. t end })
    assert.are.same({ "1/2", "2/2" }, calls)
    assert.raises_match(function() qgru.quant.calibrate(model, ds, { progress = 1 }) end, "progress must be a function(done, total)")
  end)
end)
