-- recipes/sweep.lua: bitwidth sweeps from one float checkpoint and a calibration set.
--   --mode grid         weight bits x activation bits (default W 2,3,4,6,8 x A 4,6,8,10,12,16):
--                       PTQ accuracy per point, and with --qat N the accuracy after N QAT epochs
--   --mode sensitivity  every operator at --high bits, then one operator (per layer and
--                       direction) at a time lowered to --low bits: accuracy drops, ranked
--   --mode mixed        lowers the least sensitive operators step by step while accuracy stays
--                       within --tolerance points of float; writes mixed_config.json (the
--                       seed's format, for recipes/qat.lua --config) and its average bits
-- Writes runs/<name>/ (qgru.rundir: run.json, options.json, log.txt, metrics.json; the name is
-- sweep plus the options that differ from their defaults, e.g. runs/sweep-mode=sensitivity,
-- unless --name is given): plan.json, points.jsonl (one line per finished point), results.jsonl,
-- results.csv, results.md and SVG plots (accuracy_vs_bits.svg, sensitivity.svg, mixed_path.svg;
-- mixed: mixed_config.json). A finished run is not overwritten (--force moves it aside).
-- Sharding (grid, sensitivity): --shard i/n runs points i, i+n, ... into
-- runs/<name>/shard-<i>-of-<n>/; `--merge runs/<name>` (or --merge DIR...) joins the shards into
-- the same result files as an unsharded run. --resume skips finished points.
-- scripts/sweep_local.sh runs one shard per GPU (or N processes on the CPU);
-- scripts/sweep_slurm.sh submits a Slurm job array and a merge job.
--   ./qgru recipes/sweep.lua --mode grid --w_bits 4,8 --a_bits 6,8
--   ./qgru recipes/sweep.lua --mode sensitivity --shard 2/4 --resume
--   ./qgru recipes/sweep.lua --merge runs/sweep-mode=sensitivity
-- (recipes/compare.lua keeps the PTQ/QAT comparison table of fixed configs.)
local qgru = require("qgru")
local sweep = require("qgru.sweep")
local quant, cli, zoo, train, optim, json, data, nn = qgru.quant, qgru.cli, qgru.zoo, qgru.train, qgru.optim, qgru.json, qgru.data, qgru.nn
local rundir, progress = qgru.rundir, qgru.progress

-- --merge takes one or more folders: take them out before the ordinary option parser.
local args, merge_dirs = {}, nil
do
  local i = 1
  while i <= #arg do
    if arg[i] == "--merge" then
      merge_dirs = merge_dirs or {}
      i = i + 1
      while arg[i] ~= nil and not arg[i]:match("^%-%-") do merge_dirs[#merge_dirs + 1] = arg[i]; i = i + 1 end
    else
      args[#args + 1] = arg[i]
      i = i + 1
    end
  end
end

local METHODS = { "minmax", "histogram", "mse", "percentile" }
local BITS = { int = true, min = 1, max = 32 }
local spec = rundir.options({
  mode = { "grid", "grid | sensitivity | mixed", { choices = sweep.MODES } },
  weights = { "runs/train_float/model.safetensors", "float checkpoint (recipes/train_float.lua)" },
  w_bits = { "2,3,4,6,8", "grid: weight bitwidths" },
  a_bits = { "4,6,8,10,12,16", "grid: activation bitwidths" },
  qat = { 0, "grid: QAT epochs per point after PTQ (0 = PTQ only)", { int = true, min = 0 } },
  lr = { 2e-4, "QAT peak learning rate (cosine decay to lr/100)", { min = 0 } },
  batch_size = { 128, "QAT batch size", { int = true, min = 1 } },
  high = { 8, "sensitivity: bits of every operator in the base", BITS },
  low = { 4, "sensitivity, mixed: bits of the operator lowered in the probe", BITS },
  start = { 8, "mixed: bits of every operator at the start", BITS },
  tolerance = { 0.5, "mixed: accuracy allowed below float, in points", { min = 0 } },
  w_ladder = { "8,7,6,5,4,3,2", "mixed: bitwidths weights and biases may take" },
  a_ladder = { "8,7,6,5,4", "mixed: bitwidths activations may take" },
  method = { "histogram", "activation calibration method", { choices = METHODS } },
  weight_method = { "minmax", "weight calibration method (per channel)", { choices = METHODS } },
  passes = { 2, "calibration passes", { int = true, min = 1 } },
  calib_batches = { 8, "calibration batches (the first of the training set, in order)", { int = true, min = 1 } },
  calib_batch_size = { 256, "calibration batch size", { int = true, min = 1 } },
  train_limit = { 0, "use only the first N training images (0 = all)", { int = true, min = 0 } },
  test_limit = { 0, "evaluate on the first N test images (0 = all)", { int = true, min = 0 } },
  seed = { 1, "seed (QAT data order)" },
  shard = { "", "run shard i of n (i/n, 1 <= i <= n): points i, i+n, ..." },
  plan = { false, "print the run folder and the number of points, then exit" },
  threads = { 0, "BLAS threads (0 = OpenBLAS default)", { int = true, min = 0 } },
  data_dir = { data.fashionMNISTDir(), "Fashion-MNIST folder (IDX .gz files)" },
}, { resume = true })
spec.force[2] = "start again when the run folder holds a run (moved aside to <folder>.old-N); with --merge: replace the merged results"
-- Options left out of the derived run name (they do not change the results, or name the shard).
local NAME_IGNORE = { name = true, resume = true, force = true, threads = true, data_dir = true, device = true, shard = true, plan = true }
local TITLE = "recipes/sweep.lua: bitwidth grid, sensitivity and mixed-precision sweeps\n" ..
              "  merge shards: recipes/sweep.lua --merge runs/<name> (or --merge DIR DIR ...) [--name OUT] [--force]"

-- The network stored in a weights file: GRU(C -> H, L layers, 1 or 2 directions), last step,
-- Linear(dirs * H -> K), as zoo.fmnistGRU and recipes/train_float.lua build it.
local function arch_of(path)
  local f = qgru.serialize.open(path)
  local e = f.entries
  f:close()
  local w0 = e["1.l0.fwd.W"]
  local lin = e["3.weight"]
  if not w0 or not lin or #w0.shape ~= 2 or #lin.shape ~= 2 then
    error("qgru: " .. path .. ": not the weights of a GRU classifier (expected tensors 1.l0.fwd.W and 3.weight, as recipes/train_float.lua saves)", 0)
  end
  local a = { C = w0.shape[2], H = w0.shape[1] / 3, L = 0, dirs = e["1.l0.bwd.W"] and 2 or 1, K = lin.shape[1] }
  while e[string.format("1.l%d.fwd.W", a.L)] do a.L = a.L + 1 end
  return a
end

local function build(a)
  return nn.Sequential()
    :add(nn.GRU(a.C, a.H, { layers = a.L, bidirectional = a.dirs == 2 }))
    :add(nn.Last())
    :add(nn.Linear(a.dirs * a.H, a.K))
end

-- The model's quantizable units (operator x layer x direction) and weight parameter counts.
local function units_of(a)
  local m = build(a)
  quant.prepare(m, quant.uniform(8))
  local units, counts = {}, {}
  for _, e in ipairs(quant.quantizers(m)) do
    local lq, q = e.layer, e.quantizer
    units[#units + 1] = { name = e.name, layer = lq.l, direction = lq.d == 0 and "fwd" or "bwd", op = q.op }
    local n = ({ ["weight.W"] = 3 * lq.H * lq.C, ["weight.R"] = 3 * lq.H * lq.H, ["weight.bw"] = 3 * lq.H, ["weight.br"] = 3 * lq.H })[q.op]
    if n then counts[q.op] = (counts[q.op] or 0) + n end
  end
  return units, counts
end

local arch, run, shard_i, shard_n
local opt = cli.main(args, spec, TITLE, function(o)
  if o.name == "" then o.name = rundir.deriveName("sweep", spec, o, NAME_IGNORE) end
  if merge_dirs then
    if #merge_dirs == 0 then error("qgru: --merge needs one or more run folders", 0) end
    return
  end
  if o.resume ~= "" and o.force then error("qgru: --resume and --force exclude each other", 0) end
  shard_i, shard_n = sweep.parseShard(o.shard)
  if o.mode == "grid" then
    sweep.parseBits(o.w_bits, "w_bits")
    sweep.parseBits(o.a_bits, "a_bits")
  elseif o.mode == "sensitivity" then
    if o.low >= o.high then error(string.format("qgru: option --low (%d) must be below --high (%d)", o.low, o.high), 0) end
  else
    sweep.parseBits(o.w_ladder, "w_ladder")
    sweep.parseBits(o.a_ladder, "a_ladder")
    if shard_n > 1 then
      error("qgru: --mode mixed is a sequential search and cannot be sharded: shard --mode sensitivity instead", 0)
    end
  end
  if not zoo.exists(o.weights) then error("qgru: no float checkpoint at " .. o.weights .. " (option --weights; recipes/train_float.lua writes one)", 0) end
  arch = arch_of(o.weights)
  if o.plan then return end
  -- the run folder: runs/<name>, or runs/<name>/shard-<i>-of-<n>; a finished run is not
  -- overwritten, an unfinished one (points.jsonl) is continued with --resume only
  local may_differ = {}
  for k in pairs(sweep.FREE_OPTIONS) do may_differ[#may_differ + 1] = k end
  run = rundir.prepare{ recipe = "sweep", spec = spec, opt = o, resume = o.resume, force = o.force,
                        name = shard_n > 1 and string.format("shard-%d-of-%d", shard_i, shard_n) or o.name,
                        root = shard_n > 1 and ("runs/" .. o.name) or "runs",
                        may_differ = may_differ, checkpoints = { "points.jsonl" } }
end)

-- ---- --merge: shards -> one set of result files ------------------------------------------------
if merge_dirs then
  local dirs = cli.guard(sweep.expandMergeDirs, merge_dirs)
  local o, plan, records = cli.guard(sweep.merge, dirs)
  local name = cli.given(opt).name and opt.name or o.name
  local dir = sweep.runDir(name)
  cli.guard(function()
    if not opt.force and sweep.exists(dir .. "/results.md") then
      error("qgru: " .. dir .. " already holds results: --force replaces them", 0)
    end
    if sweep.exists(dir .. "/points.jsonl") then
      error("qgru: " .. dir .. " holds an unsharded run: merge into another folder (--name)", 0)
    end
  end)
  local _, log = zoo.run(name)
  log("qgru " .. qgru.VERSION .. "  recipes/sweep.lua --merge " .. table.concat(dirs, " "))
  local files = sweep.writeResults(dir, o, plan, records)
  log(string.format("merged %d shard folder(s), %d points: %s/{%s}", #dirs, #records, dir, table.concat(files, ", ")))
  local f = io.open(dir .. "/results.md", "rb")
  log(f:read("*a"))
  f:close()
  os.exit(0)
end

-- ---- the plan ---------------------------------------------------------------------------------
local units, counts = units_of(arch)
local model_text = string.format("GRU %d -> %d (%d layer%s%s), last step, Linear %d -> %d", arch.C, arch.H, arch.L, arch.L == 1 and "" or "s",
  arch.dirs == 2 and ", bidirectional" or "", arch.dirs * arch.H, arch.K)
local points
if opt.mode == "grid" then
  points = sweep.gridPoints(sweep.parseBits(opt.w_bits, "w_bits"), sweep.parseBits(opt.a_bits, "a_bits"))
elseif opt.mode == "sensitivity" then
  points = sweep.sensitivityPoints(units, opt.high, opt.low)
end
local keys
if points then
  keys = {}
  for i, p in ipairs(points) do keys[i] = p.key end
end
local plan = json.object("mode", opt.mode, "model", model_text, "param_counts", counts, "points", keys and json.array(keys) or nil)
if opt.plan then
  print(string.format("%s\t%d", sweep.runDir(opt.name), points and #points or 0))
  os.exit(0)
end

-- ---- the run folder, data and model -------------------------------------------------------------
run:create()
local run_dir = run.dir
local function log(line) run:log(line) end
local store = sweep.openStore(run_dir, plan)
log("qgru " .. qgru.VERSION .. "  recipes/sweep.lua  ->  " .. run_dir .. "\n" .. cli.describe(opt))
log(rundir.deviceLine())
log("model: " .. model_text)
if store.dropped then log("resume: dropped an incomplete last line of points.jsonl") end
if opt.threads > 0 then qgru.setNumThreads(opt.threads) end

local trainset, testset = zoo.fmnist({ dir = opt.data_dir, train_limit = opt.train_limit > 0 and opt.train_limit or nil,
                                       test_limit = opt.test_limit > 0 and opt.test_limit or nil })
local crit = nn.CrossEntropy()
local quiet = function() end

local function fresh()
  local m = build(arch)
  qgru.load(m, opt.weights)
  return m
end
local function accuracy(m)
  local _, acc = train.Engine{ model = m, criterion = crit, log = quiet }:evaluate(testset, 256)
  return acc
end

-- PTQ (and QAT) of one configuration: bits per operator, overrides per unit (quantizer name).
local function run_config(bits, overrides)
  local m = fresh()
  local src = "<sweep point " .. sweep.signature(bits) .. ">"
  quant.prepare(m, quant.fromTable(json.decode(json.encode(sweep.configDoc(bits)), src), src))
  for name, b in pairs(overrides or {}) do quant.get(m, name):setBitwidth(b) end
  quant.calibrate(m, trainset, { method = opt.method, weight_method = opt.weight_method, passes = opt.passes,
                                 batches = opt.calib_batches, batch_size = opt.calib_batch_size })
  local ptq = accuracy(m)
  local qat
  if opt.qat > 0 then
    local o = optim.Adam(m, { lr = opt.lr, clip = 1.0 })
    train.Engine{ model = m, criterion = crit, optimizer = o, log = quiet }:train{
      data = trainset, batch_size = opt.batch_size, epochs = opt.qat, seed = opt.seed + 100,
      lr_schedule = function(s, n) return optim.cosine(opt.lr, s, n, 0.01) end }
    qat = accuracy(m)
  end
  return ptq, qat
end

local function evaluate_point(p)
  if p.kind == "float" then return { acc = accuracy(fresh()) } end
  if p.kind == "grid" then
    local ptq, qat = run_config(sweep.uniformBits(p.weight_bits, p.act_bits))
    return { ptq_acc = ptq, qat_acc = qat }
  end
  if p.kind == "base" then return { acc = (run_config(sweep.uniformBits(p.bits, p.bits))) } end
  if p.kind == "unit" then return { acc = (run_config(sweep.uniformBits(opt.high, opt.high), { [p.unit] = p.bits })) } end
  error("qgru: sweep: unknown point kind " .. tostring(p.kind), 0)
end

local function fmt_rec(r)
  if r.ptq_acc then
    return string.format("PTQ %.2f%%%s", 100 * r.ptq_acc, r.qat_acc and string.format(", QAT %.2f%%", 100 * r.qat_acc) or "")
  end
  return string.format("%.2f%%", 100 * r.acc)
end

local t_all = qgru.wallTime()
local spent, ran, bar = 0, 0, nil
-- After each point: a plain line (log.txt, and stdout above the bar), and the bar on a terminal.
local function on_point(k, n, p, rec, secs)
  spent, ran = spent + secs, ran + 1
  local eta = (n - k) * spent / ran
  log(string.format("[%d/%d] %s: %s  (%.1f s, about %.0f s left)", k, n, p.key, fmt_rec(rec), secs, eta))
  bar = bar or progress.new{ total = n, label = opt.mode }
  bar:update(k, p.key)
end

if opt.mode ~= "mixed" then
  local mine = sweep.slice(points, shard_i, shard_n)
  local pending = 0
  for _, p in ipairs(mine) do if not store.done[p.key] then pending = pending + 1 end end
  log(string.format("%s sweep: %d points%s; %d to run, %d finished before", opt.mode, #points,
    shard_n > 1 and string.format(", shard %d/%d holds %d", shard_i, shard_n, #mine) or "", pending, #mine - pending))
  local nrun = sweep.runPoints(store, mine, evaluate_point, on_point, qgru.wallTime)
  if bar then bar:done() end
  store:close()
  log(string.format("ran %d point(s) in %.1f s", nrun, qgru.wallTime() - t_all))
  if shard_n > 1 then
    log(string.format("shard %d/%d finished: %s/points.jsonl; join the shards with ./qgru recipes/sweep.lua --merge %s", shard_i, shard_n,
      run_dir, sweep.runDir(opt.name)))
    run:finish(json.object("recipe", "sweep", "mode", opt.mode, "shard", opt.shard, "points", #mine, "ran", nrun))
    os.exit(0)
  end
else
  -- mixed: every evaluation is one record keyed by its configuration, so a resumed search
  -- replays the finished ones from points.jsonl.
  local float_rec = store.done.float
  if not float_rec then
    float_rec = { index = 1, key = "float", kind = "float", acc = accuracy(fresh()) }
    store:add(float_rec)
  end
  log(string.format("float: %.2f%%", 100 * float_rec.acc))
  local seen, count, fresh_runs = {}, 1, 0
  local function evaluate(bits)
    local sig = sweep.signature(bits)
    local key = "cfg:" .. sig
    if not seen[sig] then seen[sig] = true; count = count + 1 end
    local r = store.done[key]
    if r then return r.acc end
    local t0 = qgru.wallTime()
    local acc = run_config(bits)
    store:add({ index = count, key = key, kind = "config", config = sig, acc = acc })
    fresh_runs = fresh_runs + 1
    local wb, ab = sweep.averageBits(bits, counts)
    log(string.format("[%d] %s: %.2f%%  (W %.2f A %.2f bits on average; %.1f s)", count, sig, 100 * acc, wb, ab, qgru.wallTime() - t0))
    return acc
  end
  local search = sweep.mixedSearch(sweep.mixedOptions(opt, plan, float_rec.acc, evaluate))
  store:close()
  log(string.format("mixed search: %d configurations evaluated (%d now, %d from before) in %.1f s", count, fresh_runs,
    count - fresh_runs, qgru.wallTime() - t_all))
  local wb, ab = sweep.averageBits(search.bits, counts)
  log(string.format("result: %.2f%% (float %.2f%%): weights %.2f bits on average by parameter count (%.1f%% fewer than int8), activations %.2f bits on average",
    100 * search.acc, 100 * float_rec.acc, wb, 100 * (1 - wb / 8), ab))
end

local files, mixed = sweep.writeResults(run_dir, opt, plan, store.records)
log(string.format("done in %.0f s: %s/{%s}", qgru.wallTime() - t_all, run_dir, table.concat(files, ", ")))
local f = io.open(run_dir .. "/results.md", "rb")
log(f:read("*a"))
f:close()
local wb, ab
if mixed then wb, ab = sweep.averageBits(mixed.bits, counts) end
local summary = json.object("recipe", "sweep", "mode", opt.mode, "points", #store.records, "float_acc", store.done.float.acc,
  "acc", mixed and mixed.acc or nil, "weight_bits", wb, "act_bits", ab, "files", json.array(files))
run:finish(summary)
