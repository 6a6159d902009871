-- rundir.lua: run directories. Every recipe writes into runs/<name>/, and this module decides
-- what that folder may be used for: a new run, the continuation of an interrupted one, or
-- nothing (a finished run is never overwritten unless asked). Everything is checked before
-- anything is created, so a recipe calls rundir.prepare right after its options are parsed and
-- before any data is loaded.
--
-- A run directory holds:
--   run.json       recipe, status ("running" | "finished"), the completed phases and their
--                  results, times, attempts (written atomically after every change)
--   options.json   the run's options (every option, defaults included)
--   log.txt        the log; always appended to, never truncated
--   metrics.jsonl  one JSON object per line (an epoch, a phase's result)
--   metrics.json   the summary, written when the run finishes
--   run.lock       "pid host" of the process using it (a dead process's lock is taken over)
--   ...            the recipe's own files (checkpoints, weights, exported parameters, plots)
--
-- API
--   local rundir = require("qgru.rundir")
--   rundir.deriveName(recipe, spec, opt[, ignore]) -> "qat-config=w4a8-epochs=3"
--       the recipe's name, then key=value for each option that differs from its default in spec
--       (cli spec: {key = {default, help, rules}}), sorted by key; options in ignore (a set;
--       default rundir.NAME_IGNORE: name, resume, force, threads, data_dir) are left out. Paths
--       lose their folder prefixes runs/ and config/ and their extension; other characters than
--       letters, digits and . _ - = , + become _; a name over 100 characters ends in a hash.
--   local run = rundir.prepare{
--       recipe = "qat",        -- required: the recipe's name (the default run name)
--       spec = spec, opt = opt,-- required: the cli spec and the parsed options
--       name = opt.name,       -- "" / nil: rundir.deriveName(recipe, spec, opt)
--       resume = false,        -- true: continue runs/<name> if it holds an unfinished run (start
--                              --   it when there is none); a folder path: continue that run, whose
--                              --   options.json gives every option not given on the command line
--                              --   (cli.given(opt))
--       force = false,         -- true: an existing run is moved aside to runs/<name>.old-N
--       root = "runs",         -- the parent folder
--       may_differ = {...},    -- options that may differ when resuming (default
--                              --   rundir.MAY_DIFFER: resume, force, threads, epochs, name, data_dir)
--       checkpoints = {"checkpoint.safetensors"},  -- files whose presence makes a run resumable
--       echo = true,           -- false: run:log writes only to log.txt (tests)
--       legacy = nil,          -- "use": a folder of an earlier qgru (no run.json) is taken as a
--                              --   finished run (run.legacy = true) instead of an error
--   }
--       Raises "qgru: ..." errors (a finished run without force, an unfinished one without resume
--       or force, options that differ from the run's, a run in use by a live process); creates
--       nothing. Returns a run (not yet created) with:
--         run.dir, run.name, run.opt (the effective options), run.resumed (a previous attempt's
--         state is there: continue it), run.finished (resume of a finished run with the same
--         options: nothing to do), run.previous (its run.json, or nil), run.moved_aside (force)
--   rundir.options(spec, {resume = true})  -- adds the options every recipe has to its cli spec:
--                          -- --name (default "": derived), --force and, for a recipe that trains,
--                          -- --resume (alone: this run; or a run folder)
--   rundir.fromOptions(recipe, spec, opt[, extra])  -- prepare{recipe =, spec =, opt =, name = opt.name,
--                          -- resume = opt.resume, force = opt.force, ...extra}
--   run:create()           -- makes the folder (moving an old run aside when forced), takes the
--                          -- lock, writes options.json and run.json (status "running"); returns run
--   rundir.open(o)         -- prepare(o):create()
--   run:path(file)         -- run.dir .. "/" .. file
--   run:log(line)          -- stdout (above a live progress bar) and log.txt
--   run:logFile(line)      -- log.txt only
--   run:metric(rec)        -- appends rec (a table) to metrics.jsonl as one line; a record with
--                          -- phase and epoch that is there already (a resumed run redoing an
--                          -- epoch) is not written twice
--   run:metrics()          -- the records of metrics.jsonl, in order
--   run:phase(name)        -- the record of a completed phase, or nil
--   run:completePhase(name, rec)  -- records a phase as completed (run.json)
--   run:plot(file, chart)  -- writes an SVG line chart (chart: the options of qgru.plot.lines:
--                          -- title, xlabel, ylabel, series = {{label, points = {{x, y}, ...}}},
--                          -- hlines) as run.dir/file; false when there is no qgru.plot module
--   run:finish(summary)    -- writes metrics.json (summary), status "finished", drops the lock
--   run:close()            -- drops the lock and closes the log (an unfinished run stays resumable)
-- Nothing here runs a shell: folders are made by qgru.mkdir, moved by os.rename.
local json = require("qgru.json")
local posix = require("qgru.posix")
local progress = require("qgru.progress")

local rundir = {}

rundir.NAME_IGNORE = { name = true, resume = true, force = true, threads = true, data_dir = true }
rundir.MAY_DIFFER = { resume = true, force = true, threads = true, epochs = true, name = true, data_dir = true, device = true }

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- Whether path is a directory (opening a directory for reading succeeds, reading it fails).
local function is_dir(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local _, _, code = f:read(1)
  f:close()
  return code == 21
end

local function fnv1a(s)
  local bit = require("bit")
  local h = 0x811c9dc5
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i))
    h = bit.tobit(h * 16777619 % 4294967296)
  end
  return bit.tohex(h)
end

local function short_value(v)
  if type(v) == "number" then return string.format("%.6g", v) end
  if type(v) ~= "string" then return tostring(v) end
  local s = v:gsub("^%./", "")
  if s:find("/", 1, true) then
    s = s:gsub("^runs/", ""):gsub("^config/", "")
    s = s:gsub("%.safetensors$", ""):gsub("%.json$", "")
    s = s:gsub("/", "_")
  elseif s:match("%.json$") then
    s = s:gsub("%.json$", "")
  end
  return s == "" and "none" or s
end

function rundir.deriveName(recipe, spec, opt, ignore)
  if type(recipe) ~= "string" or recipe == "" then error("qgru: rundir.deriveName: recipe must be a non-empty string", 2) end
  ignore = ignore or rundir.NAME_IGNORE
  local keys = {}
  for k, v in pairs(opt) do
    if not ignore[k] and spec[k] and v ~= spec[k][1] then keys[#keys + 1] = k end
  end
  table.sort(keys)
  local parts = { recipe }
  for _, k in ipairs(keys) do parts[#parts + 1] = k .. "=" .. short_value(opt[k]) end
  local name = table.concat(parts, "-"):gsub("[^%w%._%-=,+]", "_")
  if #name > 100 then name = name:sub(1, 91) .. "-" .. fnv1a(name) end
  return name
end

local function now() return os.date("!%Y-%m-%dT%H:%M:%SZ") end

-- A table written as a JSON object (keys sorted), even when empty.
local OBJ = { kind = "object" }
local function obj(t) return setmetatable(t, OBJ) end

local function read_json(path)
  if not exists(path) then return nil end
  local ok, v = pcall(json.read, path)
  if not ok then error("qgru: " .. path .. " cannot be read (" .. tostring(v):gsub("^qgru: ", "") .. "); move the folder away or use --force", 0) end
  return v
end

local function read_lock(dir)
  local f = io.open(dir .. "/run.lock", "rb")
  if not f then return nil end
  local s = f:read("*a") or ""
  f:close()
  local pid, host = s:match("^(%d+)%s+(%S+)")
  return { pid = tonumber(pid), host = host }
end

-- A problem with the lock of dir (held by a live process), or nil.
local function lock_problem(dir)
  local l = read_lock(dir)
  if not l or not l.pid then return nil end
  if l.pid == posix.pid() and l.host == posix.hostname() then return nil end
  if l.host == posix.hostname() then
    if posix.alive(l.pid) then return string.format("%s is in use by process %d (this machine)", dir, l.pid) end
    return nil
  end
  return string.format("%s is in use by process %d on %s (if that run is gone, remove %s/run.lock)", dir, l.pid, l.host, dir)
end

local function value_str(v) return type(v) == "string" and ("'" .. v .. "'") or tostring(v) end

local Run = {}
Run.__index = Run

local function set_of(t)
  local s = {}
  for k, v in pairs(t or {}) do if type(k) == "number" then s[v] = true else s[k] = v end end
  return s
end

function rundir.prepare(o)
  if type(o) ~= "table" then error("qgru: rundir.prepare: expected a table of options", 2) end
  for _, k in ipairs({ "recipe", "spec", "opt" }) do
    if o[k] == nil then error("qgru: rundir.prepare: missing '" .. k .. "'", 2) end
  end
  local cli = require("qgru.cli")
  local root = o.root or "runs"
  local may_differ = o.may_differ and set_of(o.may_differ) or rundir.MAY_DIFFER
  local opt = {}
  for k, v in pairs(o.opt) do opt[k] = v end
  local resume, dir, name = o.resume, nil, nil
  if resume == "" or resume == "false" then resume = false end
  if resume == "true" then resume = true end
  if type(resume) == "string" then
    dir = resume:gsub("/+$", "")
    if not is_dir(dir) then error("qgru: --resume " .. resume .. ": no such run folder", 0) end
    name = dir:match("([^/]+)$")
    -- the run's own options, then those given on the command line
    local saved = read_json(dir .. "/options.json")
    if not saved then error("qgru: --resume " .. resume .. ": no options.json there (not a run folder of this qgru)", 0) end
    local given = cli.given(o.opt)
    for k, v in pairs(saved) do
      -- the device is this machine's choice, never the saved one (a run may move between machines)
      if o.spec[k] and not given[k] and k ~= "resume" and k ~= "force" and k ~= "device" then opt[k] = v end
    end
    opt.name = name
  else
    name = (o.name and o.name ~= "") and o.name or rundir.deriveName(o.recipe, o.spec, opt)
    dir = root .. "/" .. name
  end
  -- the device option (rundir.options) applies before anything is built: a missing GPU stops here
  if opt.device then require("qgru").setDevice(opt.device) end
  local run = setmetatable({ recipe = o.recipe, dir = dir, name = name, opt = opt, resumed = false, finished = false,
                             force = o.force and true or false, spec = o.spec, echo = o.echo ~= false,
                             checkpoints = o.checkpoints or { "checkpoint.safetensors" } }, Run)
  if not is_dir(dir) then
    if exists(dir) then error("qgru: " .. dir .. " exists and is not a folder", 0) end
    return run
  end
  local problem = lock_problem(dir)
  if problem then error("qgru: " .. problem, 0) end
  local prev = read_json(dir .. "/run.json")
  local has_checkpoint = false
  for _, c in ipairs(run.checkpoints) do if exists(dir .. "/" .. c) then has_checkpoint = true end end
  local has_phase = prev and type(prev.phases) == "table" and next(prev.phases) ~= nil
  local legacy = not prev and (exists(dir .. "/log.txt") or exists(dir .. "/model.safetensors") or exists(dir .. "/metrics.json") or has_checkpoint)
  run.previous = prev
  if run.force then
    if prev or legacy then run.moved_aside = true end
    return run
  end
  if legacy and o.legacy == "use" then
    run.legacy, run.finished = true, true
    return run
  end
  if legacy then
    error("qgru: " .. dir .. " holds files of an earlier qgru version (no run.json): it is neither overwritten nor resumed; " ..
          "use --name for another run or --force to move it aside", 0)
  end
  if not prev then return run end   -- an empty folder
  if prev.recipe ~= nil and prev.recipe ~= o.recipe then
    error(string.format("qgru: %s holds a run of %s, not %s: use --name for another run or --force to move it aside", dir,
                        tostring(prev.recipe), o.recipe), 0)
  end
  local finished = prev.status == "finished"
  if not resume then
    if finished then
      error(string.format("qgru: %s holds a finished run (%s); it is not overwritten: use --name for another run, " ..
                          "--force to move it aside and start again, or --resume to see it", dir, tostring(prev.finished_at or prev.updated)), 0)
    end
    if has_phase or has_checkpoint then
      error(string.format("qgru: %s holds an unfinished run (last written %s%s): --resume continues it, --force moves it aside " ..
                          "and starts again", dir, tostring(prev.updated), has_phase and (", phases done: " .. table.concat(rundir.phaseNames(prev), ", ")) or ""), 0)
    end
    return run   -- a run that stopped before doing anything: its folder is reused, its log appended to
  end
  -- resuming: the options must agree, except those that may differ
  local saved = read_json(dir .. "/options.json") or {}
  local keys, seen = {}, {}
  -- (an option the recipe no longer has is ignored)
  for k in pairs(saved) do if not seen[k] and o.spec[k] then keys[#keys + 1] = k; seen[k] = true end end
  for k in pairs(opt) do if not seen[k] then keys[#keys + 1] = k; seen[k] = true end end
  table.sort(keys)
  local diffs, all_same = {}, true
  for _, k in ipairs(keys) do
    local a, b = saved[k], opt[k]
    if a == nil and o.spec[k] then a = o.spec[k][1] end
    if b == nil and o.spec[k] then b = o.spec[k][1] end
    if a ~= b and k ~= "resume" and k ~= "force" then
      if not rundir.NAME_IGNORE[k] then all_same = false end
      if not may_differ[k] then diffs[#diffs + 1] = string.format("%s: the run has %s, now %s", k, value_str(a), value_str(b)) end
    end
  end
  if #diffs > 0 then
    error(string.format("qgru: cannot resume %s: its options differ (nothing was changed):\n  %s", dir, table.concat(diffs, "\n  ")), 0)
  end
  run.resumed = has_phase or has_checkpoint or finished
  run.finished = finished and all_same
  return run
end

function rundir.options(spec, o)
  spec.name = spec.name or { "", "run name (folder under runs/); empty: the recipe's name and the options that differ from their defaults" }
  spec.force = { false, "start again when runs/<name> holds a run (the old one is moved aside to runs/<name>.old-N)" }
  spec.device = spec.device or { require("qgru").device(), "cpu | cuda (default: cuda when a GPU is present; QGRU_DEVICE overrides)",
                                 { choices = { "cpu", "cuda" } } }
  if o and o.resume then
    spec.resume = { "", "continue an interrupted run: --resume alone (runs/<name>), or --resume RUN_FOLDER" ..
                        (o.checkpoint and " or --resume CHECKPOINT_FILE" or ""), { bare = "true" } }
  end
  return spec
end

function rundir.fromOptions(recipe, spec, opt, extra)
  local o = { recipe = recipe, spec = spec, opt = opt, name = opt.name, resume = opt.resume, force = opt.force }
  for k, v in pairs(extra or {}) do o[k] = v end
  return rundir.prepare(o)
end

-- The names of the completed phases of a run.json table, in completion order.
function rundir.phaseNames(r)
  local list = {}
  for k, v in pairs(r and r.phases or {}) do list[#list + 1] = { k, type(v) == "table" and v.seq or 0 } end
  table.sort(list, function(a, b) return a[2] < b[2] end)
  local out = {}
  for _, e in ipairs(list) do out[#out + 1] = e[1] end
  return out
end

function Run:path(file) return self.dir .. "/" .. file end

function Run:_writeState()
  self.state.updated = now()
  json.write(self:path("run.json"), self.state)
end

function Run:create()
  if self.created then return self end
  local serialize = require("qgru.serialize")
  if self.moved_aside then
    local n = 1
    while exists(self.dir .. ".old-" .. n) do n = n + 1 end
    local to = self.dir .. ".old-" .. n
    local ok, err = os.rename(self.dir, to)
    if not ok then error("qgru: cannot move " .. self.dir .. " aside to " .. to .. ": " .. tostring(err), 0) end
    self.moved_to = to
    self.previous = nil
  end
  serialize.mkdir(self.dir)
  local lf = io.open(self:path("run.lock"), "wb")
  if not lf then error("qgru: cannot write " .. self:path("run.lock"), 0) end
  lf:write(string.format("%d %s\n", posix.pid(), posix.hostname()))
  lf:close()
  local f, err = io.open(self:path("log.txt"), "ab")
  if not f then error("qgru: cannot write " .. self:path("log.txt") .. ": " .. tostring(err), 0) end
  self.logf = f
  self.seen = {}
  for _, r in ipairs(self:metrics()) do
    if r.phase ~= nil and r.epoch ~= nil then self.seen[tostring(r.phase) .. "#" .. tostring(r.epoch)] = true end
  end
  local prev = self.previous
  local phases = obj({})
  if prev and type(prev.phases) == "table" then for k, v in pairs(prev.phases) do phases[k] = v end end
  self.state = obj({ recipe = self.recipe, name = self.name, status = self.finished and "finished" or "running",
    created = prev and prev.created or now(), finished_at = self.finished and prev and prev.finished_at or nil,
    attempts = (prev and tonumber(prev.attempts) or 0) + 1, phases = phases })
  local opts = {}
  for k, v in pairs(self.opt) do opts[k] = v end
  opts.resume, opts.force = nil, nil
  json.write(self:path("options.json"), opts)
  self:_writeState()
  self.created = true
  if self.moved_to then self:log("moved the previous run to " .. self.moved_to) end
  return self
end

function rundir.open(o) return rundir.prepare(o):create() end

-- The line recipes log after their header: where the work runs ("device: cuda  (math strict)").
function rundir.deviceLine()
  local qgru = require("qgru")
  return "device: " .. qgru.device() .. (qgru.device() == "cuda" and ("  (math " .. qgru.math() .. ")") or "")
end

function Run:logFile(line)
  if self.logf then self.logf:write(line, "\n"); self.logf:flush() end
end

function Run:log(line)
  if self.echo then progress.write(io.stdout, line) end
  self:logFile(line)
end

function Run:metrics()
  local out = {}
  local f = io.open(self:path("metrics.jsonl"), "rb")
  if not f then return out end
  for line in f:lines() do
    if line:match("%S") then
      local ok, v = pcall(json.decode, line, self:path("metrics.jsonl"))
      if ok then out[#out + 1] = v end
    end
  end
  f:close()
  return out
end

function Run:metric(rec)
  if type(rec) ~= "table" then error("qgru: run:metric: expected a table, got " .. type(rec), 2) end
  if rec.phase ~= nil and rec.epoch ~= nil then
    local key = tostring(rec.phase) .. "#" .. tostring(rec.epoch)
    if self.seen[key] then return false end
    self.seen[key] = true
  end
  local f, err = io.open(self:path("metrics.jsonl"), "ab")
  if not f then error("qgru: cannot write " .. self:path("metrics.jsonl") .. ": " .. tostring(err), 0) end
  f:write(json.encode(rec), "\n")
  f:close()
  return true
end

function Run:phase(name)
  if self.state then return self.state.phases[name] end
  if self.force or not self.previous or type(self.previous.phases) ~= "table" then return nil end
  return self.previous.phases[name]
end

function Run:completePhase(name, rec)
  local n = 0
  for _ in pairs(self.state.phases) do n = n + 1 end
  local r = obj({})
  for k, v in pairs(rec or {}) do r[k] = v end
  r.seq, r.at = n + 1, now()
  self.state.phases[name] = r
  self:_writeState()
end

function Run:plot(file, chart)
  local ok, plot = pcall(require, "qgru.plot")
  if not ok or type(plot) ~= "table" or not plot.lines then return false end
  plot.write(self:path(file), plot.lines(chart))
  return true
end

function Run:finish(summary)
  if summary then json.write(self:path("metrics.json"), summary) end
  self.state.status = "finished"
  self.state.finished_at = now()
  self:_writeState()
  self:close()
end

function Run:close()
  if self.logf then self.logf:close(); self.logf = nil end
  local l = read_lock(self.dir)
  if l and l.pid == posix.pid() then os.remove(self:path("run.lock")) end
end

return rundir
