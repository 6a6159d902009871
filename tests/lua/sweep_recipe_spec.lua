-- sweep_recipe_spec.lua: recipes/sweep.lua end to end on a tiny GRU (hidden 8, trained here for a
-- few seconds) and a slice of Fashion-MNIST: bad options stop before anything is written;
-- a grid sweep writes all its files, its shards merged equal the unsharded run byte for byte,
-- --resume recomputes nothing finished (counted in the log); a sensitivity sweep ranks every
-- operator; the mixed-precision config loads with quant.config and reproduces the accuracy the
-- sweep reported.
local qgru = require("qgru")
local sweep = require("qgru.sweep")
local json = require("qgru.json")
local U = require("testutil")

local ROOT = os.getenv("QGRU_ROOT") or "."
local LIB = os.getenv("QGRU_LIB") or (ROOT .. "/build/libqgru.so")

local function run(dir, args)
  local cmd = string.format("cd '%s' && QGRU_ROOT='%s' QGRU_LIB='%s' LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' OPENBLAS_NUM_THREADS=1 luajit '%s/recipes/sweep.lua' %s 2>&1; echo \"rc=$?\"",
                            dir, ROOT, LIB, ROOT, ROOT, ROOT, args)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end
local function exists(path) local f = io.open(path, "rb"); if f then f:close() end; return f ~= nil end
local function lines(path)
  local t = {}
  for l in U.read_bytes(path):gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

local TRAIN_LIMIT, TEST_LIMIT = 1000, 200
local COMMON = string.format("--weights float.safetensors --train_limit %d --test_limit %d --calib_batches 1 --calib_batch_size 128 --method minmax --passes 1 --threads 1",
  TRAIN_LIMIT, TEST_LIMIT)

describe("recipes/sweep.lua", function()
  local dir
  setup(function()
    dir = U.tmpname("_sweep_recipe")
    qgru.mkdir(dir)
    qgru.seed(3)
    local m = qgru.zoo.fmnistGRU(8)
    local trainset = qgru.zoo.fmnist({ train_limit = 2000, test_limit = 10 })
    local opt = qgru.optim.Adam(m, { lr = 1e-2, clip = 1.0 })
    qgru.train.Engine{ model = m, criterion = qgru.nn.CrossEntropy(), optimizer = opt, log = function() end }:train{
      data = trainset, batch_size = 50, epochs = 2, seed = 3 }
    qgru.save(m, dir .. "/float.safetensors")
  end)

  it("bad options give the message and the usage, exit 2, and write nothing", function()
    for _, c in ipairs({ { "--bogus 1", "unknown option --bogus" },
                         { "--w_bits 0,4", "option --w_bits: bitwidths must be 1..32, got 0" },
                         { "--a_bits 8,40", "option --a_bits: bitwidths must be 1..32, got 40" },
                         { "--mode sensitivity --high 33", "option --high must be <= 32, got 33" },
                         { "--mode sensitivity --low 8", "option --low (8) must be below --high (8)" },
                         { "--weights /no/such.safetensors", "no float checkpoint at /no/such.safetensors" },
                         { "--shard 3/2", "option --shard: shard 3 of 2 does not exist" },
                         { "--shard 1", "option --shard: expected i/n" },
                         { "--mode mixed --shard 1/2", "cannot be sharded" },
                         { "--mode fancy", "option --mode must be one of grid, sensitivity, mixed" },
                         { "--merge", "--merge needs one or more run folders" } }) do
      local args = c[1]:find("--weights", 1, true) and c[1] or (c[1] .. " --weights float.safetensors")
      local out, rc = run(dir, args .. " --name bad --data_dir /no/such/data")
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find(c[2], 1, true), out)
      assert.is_truthy(out:find("recipes/sweep.lua: bitwidth grid", 1, true), out)   -- the usage
      assert.is_nil(out:find("traceback", 1, true), out)
      assert.is_false(exists(dir .. "/runs/bad/options.json"), c[1])
      assert.is_false(exists(dir .. "/runs/bad/log.txt"), c[1])
    end
  end)

  it("grid: all files; shards merged equal the unsharded run; --resume recomputes nothing finished", function()
    local grid = COMMON .. " --w_bits 4,8 --a_bits 6,8"
    local out, rc = run(dir, grid .. " --name g1")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("grid sweep: 5 points; 5 to run, 0 finished before", 1, true), out)
    local g1 = dir .. "/runs/g1"
    for _, f in ipairs({ "options.json", "plan.json", "log.txt", "points.jsonl", "results.jsonl", "results.csv", "results.md", "accuracy_vs_bits.svg" }) do
      assert.is_true(exists(g1 .. "/" .. f), f)
    end
    assert.are.equal(1 + 1 + 4, #lines(g1 .. "/results.csv"))
    assert.are.equal(5, #lines(g1 .. "/results.jsonl"))
    -- three shards, each with its own thread count, then the merge
    for i = 1, 3 do
      out, rc = run(dir, grid .. " --name g3 --shard " .. i .. "/3 --threads " .. i)
      assert.are.equal(0, rc, out)
      assert.is_truthy(out:find("shard " .. i .. "/3 finished", 1, true), out)
      assert.is_false(exists(dir .. "/runs/g3/results.md"))
    end
    out, rc = run(dir, "--merge runs/g3")
    assert.are.equal(0, rc, out)
    for _, f in ipairs({ "results.jsonl", "results.csv", "results.md", "accuracy_vs_bits.svg" }) do
      assert.are.equal(U.read_bytes(g1 .. "/" .. f), U.read_bytes(dir .. "/runs/g3/" .. f), f)
    end
    -- merging again does not overwrite without being asked
    out, rc = run(dir, "--merge runs/g3")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("already holds results: --force replaces them", 1, true), out)
    -- a finished run is not overwritten; --resume runs nothing
    out, rc = run(dir, grid .. " --name g1")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("runs/g1 holds a finished run", 1, true), out)
    assert.is_truthy(out:find("it is not overwritten", 1, true), out)
    out, rc = run(dir, grid .. " --name g1 --resume")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("5 points; 0 to run, 5 finished before", 1, true), out)
    assert.is_truthy(out:find("ran 0 point(s)", 1, true), out)
    -- an interrupted run (two points recorded) resumes with the other three only
    local pl = lines(g1 .. "/points.jsonl")
    U.write_bytes(g1 .. "/points.jsonl", pl[1] .. "\n" .. pl[2] .. "\n")
    local before = U.read_bytes(g1 .. "/results.md")
    out, rc = run(dir, grid .. " --name g1 --resume")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("5 points; 3 to run, 2 finished before", 1, true), out)
    assert.is_truthy(out:find("ran 3 point(s)", 1, true), out)
    assert.are.equal(before, U.read_bytes(g1 .. "/results.md"))
    -- resuming with another result-defining option is refused before anything runs
    out, rc = run(dir, grid .. " --name g1 --resume --passes 2 --data_dir /no/such/data")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("cannot resume runs/g1: its options differ (nothing was changed):\n  passes: the run has 1, now 2", 1, true), out)
    -- --force starts again and keeps the old run, moved aside
    out, rc = run(dir, grid .. " --name g1 --force")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("moved the previous run to runs/g1.old-1", 1, true), out)
    assert.is_truthy(out:find("5 points; 5 to run, 0 finished before", 1, true), out)
    assert.are.equal(before, U.read_bytes(dir .. "/runs/g1.old-1/results.md"))
    assert.are.equal(before, U.read_bytes(g1 .. "/results.md"))
  end)

  it("sensitivity: one point per operator of the GRU, ranked", function()
    local out, rc = run(dir, COMMON .. " --mode sensitivity --name s1")
    assert.are.equal(0, rc, out)
    local csv = lines(dir .. "/runs/s1/results.csv")
    assert.are.equal(1 + 2 + 17, #csv)   -- header, float, base, 17 operators of l0.fwd
    local drops, seen = {}, {}
    for i = 4, #csv do
      local rank, unit, drop = csv[i]:match("^(%d+),([^,]+),.*,([-%d.]+)$")
      assert.are.equal(i - 3, tonumber(rank))
      seen[unit] = true
      drops[#drops + 1] = tonumber(drop)
    end
    for k = 2, #drops do assert.is_true(drops[k - 1] >= drops[k]) end
    for _, op in ipairs(qgru.quant.OPS) do assert.is_true(seen["1.l0.fwd." .. op], op) end
    assert.is_true(exists(dir .. "/runs/s1/sensitivity.svg"))
  end)

  it("mixed: the config it writes loads with quant.config and reproduces the accuracy it reported", function()
    local args = COMMON .. " --mode mixed --name m1 --w_ladder 8,4 --a_ladder 8,6 --tolerance 3"
    local out, rc = run(dir, args)
    assert.are.equal(0, rc, out)
    local m1 = dir .. "/runs/m1"
    local o = json.read(m1 .. "/options.json")
    local plan = json.read(m1 .. "/plan.json")
    local s = sweep.replayMixed(o, plan, sweep.readRecords(m1 .. "/points.jsonl"))
    assert.is_truthy(U.read_bytes(m1 .. "/results.md"):find("**Result** (`mixed_config.json`): test accuracy " .. sweep.decimals2(100 * s.acc), 1, true))
    -- a fresh model, the written config, the same calibration: the same accuracy
    local cfg = qgru.quant.config(m1 .. "/mixed_config.json")
    for _, op in ipairs(qgru.quant.OPS) do assert.are.equal(s.bits[op], cfg.ops[op].bitwidth, op) end
    local m = qgru.zoo.fmnistGRU(8)
    qgru.load(m, dir .. "/float.safetensors")
    qgru.quant.prepare(m, cfg)
    local trainset, testset = qgru.zoo.fmnist({ train_limit = TRAIN_LIMIT, test_limit = TEST_LIMIT })
    qgru.quant.calibrate(m, trainset, { method = "minmax", weight_method = "minmax", passes = 1, batches = 1, batch_size = 128 })
    local _, acc = qgru.train.Engine{ model = m, criterion = qgru.nn.CrossEntropy(), log = function() end }:evaluate(testset, 256)
    assert.are.equal(s.acc, acc)
    -- resumed: every evaluation comes from points.jsonl
    out, rc = run(dir, args .. " --resume")
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("configurations evaluated (0 now, ", 1, true), out)
  end)
end)
