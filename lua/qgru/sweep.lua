-- sweep.lua: the logic of bitwidth sweeps (recipes/sweep.lua), free of models and data so that
-- it can be tested with a stub evaluator:
--   * points: grid (weight bits x activation bits) and sensitivity (a base at high bits, then
--     one unit, an operator of one layer and direction, lowered at a time); every mode starts
--     with the float point;
--   * sharding: point p (1-based) belongs to shard ((p - 1) mod n) + 1 of --shard i/n;
--   * a store in a run folder: plan.json and points.jsonl (one JSON line per finished point,
--     appended and flushed; a resumed run reads it back), and the merge of shard folders;
--   * the mixed-precision search (greedy, least sensitive operator first), replayable from its
--     recorded evaluations;
--   * the result files: results.jsonl, results.csv, results.md, SVG plots (qgru.plot) and, for
--     mixed, mixed_config.json in the seed's format. They depend only on the result-defining
--     options, the plan and the point records, so a merged sharded run writes the same bytes as
--     an unsharded one (no times, dates, shard numbers or paths in them).
-- The run folders themselves (names, finished runs never overwritten, --resume, --force, locks,
-- options.json, log.txt) are qgru.rundir's; recipes/sweep.lua uses it.
local json = require("qgru.json")
local config = require("qgru.quant.config")
local plot = require("qgru.plot")
local serialize = require("qgru.serialize")

local sweep = {}

sweep.MODES = { "grid", "sensitivity", "mixed" }
sweep.OPS = config.OPS
sweep.isWeight = config.isWeight

-- Options that do not change any result: they may differ between a run and its resume, and
-- between the shards of one sweep.
sweep.FREE_OPTIONS = { name = true, shard = true, resume = true, force = true, threads = true, device = true,
                       data_dir = true, merge = true, plan = true }

local function fail(fmt, ...) error("qgru: " .. string.format(fmt, ...), 0) end

local function copy(t)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  return o
end

-- ---- option values -------------------------------------------------------------------------

-- "2,3,4" -> {2, 3, 4} (integers 1..32, no duplicates, kept in the given order).
function sweep.parseBits(s, what)
  if type(s) ~= "string" then fail("option --%s: expected a comma-separated list of bitwidths, got %s", what, type(s)) end
  local out, seen = {}, {}
  for item in (s .. ","):gmatch("([^,]*),") do
    local v = tonumber(item:match("^%s*(.-)%s*$"))
    if not v or v % 1 ~= 0 then fail("option --%s: expected integers separated by commas, got '%s'", what, s) end
    if v < 1 or v > 32 then fail("option --%s: bitwidths must be 1..32, got %d", what, v) end
    if seen[v] then fail("option --%s: %d is listed twice", what, v) end
    seen[v] = true
    out[#out + 1] = v
  end
  if #out == 0 then fail("option --%s: no bitwidths given", what) end
  return out
end

-- "i/n" -> i, n with 1 <= i <= n; "" -> 1, 1 (no sharding).
function sweep.parseShard(s)
  if s == nil or s == "" then return 1, 1 end
  local i, n = tostring(s):match("^(%d+)/(%d+)$")
  i, n = tonumber(i), tonumber(n)
  if not i then fail("option --shard: expected i/n (shard i of n, 1 <= i <= n), got '%s'", tostring(s)) end
  if n < 1 or n > 100000 then fail("option --shard: the number of shards must be 1..100000, got %d", n) end
  if i < 1 or i > n then fail("option --shard: shard %d of %d does not exist (expected 1 <= i <= %d)", i, n, n) end
  return i, n
end

-- ---- points --------------------------------------------------------------------------------

local function indexed(points)
  for i, p in ipairs(points) do p.index = i end
  return points
end

-- The float point, then every (w, a) pair, weights outer, in the given orders.
function sweep.gridPoints(wbits, abits)
  local pts = { { key = "float", kind = "float" } }
  for _, w in ipairs(wbits) do
    for _, a in ipairs(abits) do
      pts[#pts + 1] = { key = string.format("w%da%d", w, a), kind = "grid", weight_bits = w, act_bits = a }
    end
  end
  return indexed(pts)
end

-- units: {{name = "1.l0.fwd.weight.W", layer = 0, direction = "fwd", op = "weight.W"}, ...}.
-- The float point, the base (every operator at high bits), then each unit at low bits.
function sweep.sensitivityPoints(units, high, low)
  local pts = { { key = "float", kind = "float" }, { key = "base", kind = "base", bits = high } }
  for _, u in ipairs(units) do
    pts[#pts + 1] = { key = "low:" .. u.name, kind = "unit", unit = u.name, layer = u.layer, direction = u.direction, op = u.op, bits = low }
  end
  return indexed(pts)
end

-- The points of shard i of n (round robin, so each shard gets a mix of cheap and costly points).
function sweep.slice(points, i, n)
  local out = {}
  for _, p in ipairs(points) do
    if (p.index - 1) % n == i - 1 then out[#out + 1] = p end
  end
  return out
end

-- Bits per operator of a grid point or a sensitivity base: weights at wb, the rest at ab.
function sweep.uniformBits(wb, ab)
  local bits = {}
  for _, op in ipairs(config.OPS) do bits[op] = config.isWeight(op) and wb or ab end
  return bits
end

-- The seed's config format for bits per operator (every operator listed, with the defaults'
-- symmetric / unsigned choices): a JSON object ready for json.encode or quant.fromTable.
function sweep.configDoc(bits, description)
  local ops = {}
  for _, op in ipairs(config.OPS) do
    local b = bits[op]
    if type(b) ~= "number" or b % 1 ~= 0 or b < 1 or b > 32 then fail("sweep.configDoc: %s: expected a bitwidth 1..32, got %s", op, tostring(b)) end
    local d = config.default_op(op, b)
    ops[#ops + 1] = op
    ops[#ops + 1] = json.object("bitwidth", b, "is_symmetric", d.is_symmetric, "is_unsigned", d.is_unsigned)
  end
  return json.object("description", description,
    "GRU_config", json.object("default_config", json.object("disable_quantization", false),
                              "operator_config", json.object(unpack(ops))))
end

-- A compact signature of bits per operator, in config.OPS order: "8-8-6-...".
function sweep.signature(bits)
  local s = {}
  for i, op in ipairs(config.OPS) do s[i] = tostring(bits[op]) end
  return table.concat(s, "-")
end

-- Average bits of a config: weights weighted by their parameter counts (counts[op], summed over
-- layers and directions), activations as the plain mean over the activation operators.
function sweep.averageBits(bits, counts)
  local wsum, wn, asum, an = 0, 0, 0, 0
  for _, op in ipairs(config.OPS) do
    if config.isWeight(op) then
      local c = counts[op] or 1
      wsum, wn = wsum + c * bits[op], wn + c
    else
      asum, an = asum + bits[op], an + 1
    end
  end
  return wsum / wn, asum / an
end

-- ---- records -------------------------------------------------------------------------------

local FIELD_ORDER = { "index", "key", "kind", "weight_bits", "act_bits", "unit", "layer", "direction", "op", "bits", "config",
                      "acc", "ptq_acc", "qat_acc" }
local KNOWN = {}
for _, k in ipairs(FIELD_ORDER) do KNOWN[k] = true end

-- One record as a JSON line (fields in a fixed order; accuracies keep every bit).
function sweep.encodeRecord(rec)
  local kv = {}
  for _, k in ipairs(FIELD_ORDER) do
    if rec[k] ~= nil then kv[#kv + 1] = k; kv[#kv + 1] = rec[k] end
  end
  for k in pairs(rec) do
    if not KNOWN[k] then fail("sweep.encodeRecord: unknown field '%s'", tostring(k)) end
  end
  return json.encode(json.object(unpack(kv)))
end

local function plain(v)   -- a decoded JSON object as a plain table
  local t = {}
  for k, x in pairs(v) do t[k] = x end
  return t
end

-- Reads a JSON-lines file of records: {records}, or nil when the file is missing. A last line
-- without its newline (a write cut short) is dropped and reported through dropped.
function sweep.readRecords(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  local out, dropped = {}, nil
  local pos, lineno = 1, 0
  while pos <= #text do
    local nl = text:find("\n", pos, true)
    lineno = lineno + 1
    if not nl then dropped = text:sub(pos); break end
    local line = text:sub(pos, nl - 1)
    if line ~= "" then
      local ok, v = pcall(json.decode, line, path .. ":" .. lineno)
      if not ok then fail("%s: line %d is not a point record: %s", path, lineno, tostring(v):gsub("^qgru: ", "")) end
      if not json.isObject(v) or type(v.key) ~= "string" then fail("%s: line %d: expected an object with a \"key\"", path, lineno) end
      out[#out + 1] = plain(v)
    end
    pos = nl + 1
  end
  return out, dropped
end

-- ---- run directories -----------------------------------------------------------------------

function sweep.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- The folder of a run: runs/<name>, or runs/<name>/shard-<i>-of-<n> for shard i of n > 1.
function sweep.runDir(name, i, n)
  local dir = "runs/" .. name
  if n and n > 1 then dir = string.format("%s/shard-%d-of-%d", dir, i, n) end
  return dir
end

local function options_diff(a, b)
  local keys, seen = {}, {}
  for k in pairs(a) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
  for k in pairs(b) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
  table.sort(keys)
  local d = {}
  for _, k in ipairs(keys) do
    if not sweep.FREE_OPTIONS[k] and a[k] ~= b[k] then d[#d + 1] = string.format("%s: %s vs %s", k, tostring(a[k]), tostring(b[k])) end
  end
  return d
end
sweep.optionsDiff = options_diff

local function read_json_plain(path)
  local v = json.read(path)
  if not json.isObject(v) then fail("%s: expected a JSON object", path) end
  return plain(v)
end

-- The store of a run folder (created by the caller): writes plan.json, reads the points that
-- points.jsonl holds already (a resumed run; a last line cut short by a kill is dropped and the
-- file rewritten without it), and appends new ones. store.done[key] = record; store.resumed =
-- the number read back; store.dropped = the dropped text, if any.
local Store = {}
Store.__index = Store

function sweep.openStore(dir, plan)
  serialize.mkdir(dir)
  local self = setmetatable({ dir = dir, done = {}, records = {}, resumed = 0 }, Store)
  local recs, dropped = sweep.readRecords(dir .. "/points.jsonl")
  if recs then
    for _, r in ipairs(recs) do
      if not self.done[r.key] then self.records[#self.records + 1] = r end
      self.done[r.key] = r
    end
    self.resumed = #self.records
    self.dropped = dropped
    if dropped then
      local f = assert(io.open(dir .. "/points.jsonl.tmp", "wb"))
      for _, r in ipairs(self.records) do f:write(sweep.encodeRecord(r), "\n") end
      f:close()
      assert(os.rename(dir .. "/points.jsonl.tmp", dir .. "/points.jsonl"))
    end
  end
  json.write(dir .. "/plan.json", plan)
  self.f = assert(io.open(dir .. "/points.jsonl", "ab"))
  return self
end

function Store:add(rec)
  local line = sweep.encodeRecord(rec)
  self.f:write(line, "\n")
  self.f:flush()
  self.done[rec.key] = rec
  self.records[#self.records + 1] = rec
end

function Store:close()
  if self.f then self.f:close(); self.f = nil end
end

-- ---- running points --------------------------------------------------------------------------

-- Runs the points not yet in the store: evaluate(point) returns the result fields ({acc = } or
-- {ptq_acc =, qat_acc =}); each finished point is recorded at once. Returns (run, skipped).
-- progress(k, n, point, rec, seconds) is called after each point run (optional).
function sweep.runPoints(store, points, evaluate, progress, clock)
  local todo = {}
  for _, p in ipairs(points) do if not store.done[p.key] then todo[#todo + 1] = p end end
  local skipped = #points - #todo
  for k, p in ipairs(todo) do
    local t0 = clock and clock() or 0
    local res = evaluate(p)
    local rec = copy(p)
    for f, v in pairs(res) do rec[f] = v end
    store:add(rec)
    if progress then progress(k, #todo, p, rec, clock and (clock() - t0) or 0) end
  end
  return #todo, skipped
end

-- ---- the mixed-precision search --------------------------------------------------------------

-- The next lower bitwidth on a ladder (descending or not), or nil.
local function next_lower(ladder, b)
  local best
  for _, v in ipairs(ladder) do
    if v < b and (not best or v > best) then best = v end
  end
  return best
end
sweep.nextLower = next_lower

-- The greedy search. o: float_acc, start (bits of every operator at the start), low (the bits of
-- the sensitivity probe), w_ladder, a_ladder (bitwidths weights / activations may take),
-- tolerance (points of accuracy below float that are allowed), evaluate(bits) -> accuracy (a
-- fraction), counts (weight parameter counts per operator), ops (default config.OPS).
-- 1. base: every operator at start bits; 2. probe: each operator alone at low bits, drop =
-- base - probe; 3. rounds: in order of increasing drop, each operator not yet stopped is lowered
-- one ladder step; the step is kept when float - accuracy <= tolerance, else the operator stops
-- at its bits. Rounds repeat until no operator moves.
-- Returns {base_acc, ranking = {{op, acc, drop}, ...}, path = {{step, op, from, to, acc, drop,
-- accepted, weight_bits, act_bits}, ...}, bits (final), acc (final)}.
function sweep.mixedSearch(o)
  local ops = o.ops or config.OPS
  local tol = o.tolerance / 100
  local cur = {}
  for _, op in ipairs(ops) do cur[op] = o.start end
  local base_acc = o.evaluate(copy(cur))
  local ranking = {}
  for i, op in ipairs(ops) do
    local b = copy(cur)
    b[op] = o.low
    local acc = o.evaluate(b)
    ranking[#ranking + 1] = { op = op, acc = acc, drop = 100 * (base_acc - acc), order = i }
  end
  table.sort(ranking, function(a, b)
    if a.drop ~= b.drop then return a.drop < b.drop end
    return a.order < b.order
  end)
  local path, stopped = {}, {}
  local cur_acc = base_acc
  local step = 0
  local ok_base = o.float_acc - base_acc <= tol + 1e-12
  local moved = ok_base
  while moved do
    moved = false
    for _, r in ipairs(ranking) do
      local op = r.op
      if not stopped[op] then
        local ladder = config.isWeight(op) and o.w_ladder or o.a_ladder
        local nb = next_lower(ladder, cur[op])
        if not nb then
          stopped[op] = true
        else
          local trial = copy(cur)
          trial[op] = nb
          local acc = o.evaluate(trial)
          step = step + 1
          local accepted = o.float_acc - acc <= tol + 1e-12
          local wb, ab = sweep.averageBits(accepted and trial or cur, o.counts or {})
          path[#path + 1] = { step = step, op = op, from = cur[op], to = nb, acc = acc, drop = 100 * (o.float_acc - acc),
                              accepted = accepted, weight_bits = wb, act_bits = ab }
          if accepted then
            cur, cur_acc, moved = trial, acc, true
          else
            stopped[op] = true
          end
        end
      end
    end
  end
  return { base_acc = base_acc, base_ok = ok_base, ranking = ranking, path = path, bits = cur, acc = cur_acc }
end

-- ---- merging shards --------------------------------------------------------------------------

-- Reads one run folder: options, plan and the point records.
function sweep.readRun(dir)
  if not sweep.exists(dir .. "/options.json") then fail("%s: no options.json (not a sweep run folder)", dir) end
  if not sweep.exists(dir .. "/plan.json") then fail("%s: no plan.json (not a sweep run folder)", dir) end
  local opts = read_json_plain(dir .. "/options.json")
  local plan = json.read(dir .. "/plan.json")
  local recs = sweep.readRecords(dir .. "/points.jsonl") or {}
  return { dir = dir, options = opts, plan = plan, records = recs }
end

-- The shard folders inside a run folder (shard-<i>-of-<n>), or {dir} when it has none.
function sweep.expandMergeDirs(dirs)
  local out = {}
  for _, d in ipairs(dirs) do
    d = d:gsub("/+$", "")
    local found
    if not sweep.exists(d .. "/options.json") then
      local ns = {}
      for n = 2, 4096 do
        if sweep.exists(string.format("%s/shard-1-of-%d/options.json", d, n)) then ns[#ns + 1] = n end
      end
      if #ns > 1 then
        fail("--merge: %s holds shards of runs split %s ways: name the shard folders (e.g. %s/shard-*-of-%d)", d,
          table.concat(ns, ", ", 1, #ns - 1) .. " and " .. ns[#ns], d, ns[#ns])
      end
      found = ns[1]
    end
    if found then
      for i = 1, found do out[#out + 1] = string.format("%s/shard-%d-of-%d", d, i, found) end
    else
      out[#out + 1] = d
    end
  end
  return out
end

-- Joins run folders (the shards of one sweep) into one: checks that they share the result
-- options and the plan, that together they are shards 1..n of n, and that every planned point
-- has exactly one result (a point found twice must have the same result). Returns
-- (options, plan, records sorted by index).
function sweep.merge(dirs)
  if #dirs == 0 then fail("--merge: no run folders given") end
  local runs = {}
  for i, d in ipairs(dirs) do runs[i] = sweep.readRun(d) end
  local first = runs[1]
  local plan_text = json.encode(first.plan)
  local shards, n = {}, nil
  for _, r in ipairs(runs) do
    local d = options_diff(first.options, r.options)
    if #d > 0 then fail("--merge: %s and %s are runs of different sweeps (%s)", first.dir, r.dir, table.concat(d, "; ")) end
    if json.encode(r.plan) ~= plan_text then fail("--merge: %s and %s have different plans (another model or other points)", first.dir, r.dir) end
    local i, rn = sweep.parseShard(r.options.shard or "")
    n = n or rn
    if rn ~= n then fail("--merge: %s is shard %d of %d, %s one of %d", r.dir, i, rn, first.dir, n) end
    if shards[i] then fail("--merge: shard %d/%d given twice (%s and %s)", i, n, shards[i], r.dir) end
    shards[i] = r.dir
  end
  local missing_shards = {}
  for i = 1, n do if not shards[i] then missing_shards[#missing_shards + 1] = i .. "/" .. n end end
  if #missing_shards > 0 then fail("--merge: shard(s) %s missing", table.concat(missing_shards, ", ")) end
  local by_key, from = {}, {}
  for _, r in ipairs(runs) do
    for _, rec in ipairs(r.records) do
      local prev = by_key[rec.key]
      if prev and sweep.encodeRecord(prev) ~= sweep.encodeRecord(rec) then
        fail("--merge: point '%s' has different results in %s and %s", rec.key, from[rec.key], r.dir)
      end
      by_key[rec.key], from[rec.key] = rec, r.dir
    end
  end
  local records = {}
  if first.plan.points then
    local missing = {}
    for _, key in ipairs(first.plan.points) do
      if by_key[key] then records[#records + 1] = by_key[key] else missing[#missing + 1] = key end
    end
    if #missing > 0 then
      fail("--merge: %d point(s) have no result (first: %s): finish the shards (rerun them with --resume)", #missing, missing[1])
    end
  else
    for _, r in ipairs(runs) do for _, rec in ipairs(r.records) do records[#records + 1] = rec end end
  end
  table.sort(records, function(a, b) return a.index < b.index end)
  local o = copy(first.options)
  o.shard = nil
  return o, first.plan, records
end

-- ---- result files ----------------------------------------------------------------------------

-- Decimals through integers (half away from zero): the 2-decimal values of the markdown are
-- exactly the 4-decimal values of the CSV rounded again, with no binary rounding artefacts.
local function q4(x)
  local q = math.floor(math.abs(x) * 1e4 + 0.5)
  return x < 0 and -q or q
end
local function d4(x)
  if x == nil then return "" end
  local q = q4(x)
  local a = math.abs(q)
  return string.format("%s%d.%04d", q < 0 and "-" or "", math.floor(a / 1e4), a % 1e4)
end
local function d2(x)
  if x == nil then return "" end
  local q = q4(x)
  local a = math.floor((math.abs(q) + 50) / 100)
  return string.format("%s%d.%02d", (q < 0 and a > 0) and "-" or "", math.floor(a / 100), a % 100)
end
sweep.decimals4, sweep.decimals2 = d4, d2
local function pct(v) return v and d2(100 * v) or "" end
local function pct4(v) return v and d4(100 * v) or "" end

local function by_kind(records)
  local out = { float = nil, list = {} }
  for _, r in ipairs(records) do
    if r.kind == "float" then out.float = r else out.list[#out.list + 1] = r end
  end
  return out
end

local function calib_text(o)
  return string.format("PTQ: %s calibration of activations (%d pass%s, %d batches of %d), weights per channel by %s",
    tostring(o.method), o.passes or 0, (o.passes or 0) == 1 and "" or "es", o.calib_batches or 0, o.calib_batch_size or 0,
    tostring(o.weight_method))
end

local function write_text(path, text) plot.write(path, text) end

local function grid_results(dir, o, plan, records, files)
  local k = by_kind(records)
  local float = k.float and k.float.acc
  local ws, as, cell, qcell = {}, {}, {}, {}
  local wseen, aseen = {}, {}
  for _, r in ipairs(k.list) do
    if not wseen[r.weight_bits] then wseen[r.weight_bits] = true; ws[#ws + 1] = r.weight_bits end
    if not aseen[r.act_bits] then aseen[r.act_bits] = true; as[#as + 1] = r.act_bits end
    cell[r.weight_bits .. "/" .. r.act_bits] = r
  end
  table.sort(ws); table.sort(as)
  local has_qat = (o.qat or 0) > 0
  -- CSV
  local csv = { "key,weight_bits,act_bits,ptq_acc,qat_acc,ptq_drop,qat_drop" }
  if float then csv[#csv + 1] = string.format("float,,,%s,,,", pct4(float)) end
  for _, r in ipairs(k.list) do
    csv[#csv + 1] = string.format("%s,%d,%d,%s,%s,%s,%s", r.key, r.weight_bits, r.act_bits, pct4(r.ptq_acc), pct4(r.qat_acc),
      float and d4(100 * (float - r.ptq_acc)) or "",
      (float and r.qat_acc) and d4(100 * (float - r.qat_acc)) or "")
  end
  write_text(dir .. "/results.csv", table.concat(csv, "\n") .. "\n")
  -- markdown
  local md = { "# Bitwidth grid: test accuracy (%)", "", "Model: " .. tostring(plan.model) .. ". " .. calib_text(o) .. ".",
               "Float: " .. pct(float) .. "." }
  if has_qat then md[#md + 1] = string.format("QAT: %d epoch%s of Adam (peak lr %g, cosine decay) from the PTQ start.", o.qat, o.qat == 1 and "" or "s", o.lr) end
  local function matrix(title, field)
    md[#md + 1] = ""
    md[#md + 1] = title
    md[#md + 1] = ""
    local head, rule = { "| W \\ A |" }, { "|---|" }
    for _, a in ipairs(as) do head[#head + 1] = " A" .. a .. " |"; rule[#rule + 1] = "---|" end
    md[#md + 1] = table.concat(head)
    md[#md + 1] = table.concat(rule)
    for _, w in ipairs(ws) do
      local row = { "| W" .. w .. " |" }
      for _, a in ipairs(as) do
        local r = cell[w .. "/" .. a]
        row[#row + 1] = " " .. ((r and r[field]) and pct(r[field]) or "") .. " |"
      end
      md[#md + 1] = table.concat(row)
    end
  end
  matrix("PTQ (rows: weight bits, columns: activation bits)", "ptq_acc")
  if has_qat then matrix(string.format("QAT, %d epoch%s", o.qat, o.qat == 1 and "" or "s"), "qat_acc") end
  write_text(dir .. "/results.md", table.concat(md, "\n") .. "\n")
  -- plot: accuracy vs activation bits, one line per weight bitwidth
  local series = {}
  for _, w in ipairs(ws) do
    local pts, qpts = {}, {}
    for _, a in ipairs(as) do
      local r = cell[w .. "/" .. a]
      if r then
        pts[#pts + 1] = { a, 100 * r.ptq_acc }
        if r.qat_acc then qpts[#qpts + 1] = { a, 100 * r.qat_acc } end
      end
    end
    local color = plot.PALETTE[(#series / (has_qat and 2 or 1)) % #plot.PALETTE + 1]
    series[#series + 1] = { label = "W" .. w .. " PTQ", points = pts, color = color }
    if has_qat then series[#series + 1] = { label = "W" .. w .. " QAT", points = qpts, color = color, dashed = true, marker = "cross" } end
  end
  write_text(dir .. "/accuracy_vs_bits.svg", plot.lines{ title = "Test accuracy vs activation bits (one line per weight bitwidth)",
    xlabel = "activation bits", ylabel = "test accuracy (%)", series = series, xticks = as,
    hlines = float and { { y = 100 * float, label = "float " .. pct(float) } } or nil })
  files[#files + 1] = "accuracy_vs_bits.svg"
end

-- The sensitivity ranking: units sorted by drop (base - acc), largest first; ties by index.
function sweep.rankSensitivity(records)
  local base
  for _, r in ipairs(records) do if r.kind == "base" then base = r end end
  if not base then fail("sweep: the sensitivity results have no base point") end
  local units = {}
  for _, r in ipairs(records) do
    if r.kind == "unit" then units[#units + 1] = { rec = r, drop = 100 * (base.acc - r.acc) } end
  end
  table.sort(units, function(a, b)
    if a.drop ~= b.drop then return a.drop > b.drop end
    return a.rec.index < b.rec.index
  end)
  return base, units
end

local function sensitivity_results(dir, o, plan, records, files)
  local k = by_kind(records)
  local float = k.float and k.float.acc
  local base, units = sweep.rankSensitivity(records)
  local csv = { "rank,unit,layer,direction,op,bits,acc,drop" }
  if float then csv[#csv + 1] = string.format(",float,,,,,%s,", pct4(float)) end
  csv[#csv + 1] = string.format(",base,,,,%d,%s,0.0000", base.bits, pct4(base.acc))
  for i, u in ipairs(units) do
    local r = u.rec
    csv[#csv + 1] = string.format("%d,%s,%d,%s,%s,%d,%s,%s", i, r.unit, r.layer, r.direction, r.op, r.bits, pct4(r.acc), d4(u.drop))
  end
  write_text(dir .. "/results.csv", table.concat(csv, "\n") .. "\n")
  local md = { "# Sensitivity: one operator (per layer and direction) lowered at a time", "",
               "Model: " .. tostring(plan.model) .. ". " .. calib_text(o) .. ".",
               string.format("Float: %s. Base (every operator at %d bits): %s. Each row lowers one operator to %d bits; drop = base - accuracy, in points.",
                 pct(float), base.bits, pct(base.acc), o.low),
               "", "| rank | operator | bits | test accuracy (%) | drop (points) |", "|---|---|---|---|---|" }
  for i, u in ipairs(units) do
    md[#md + 1] = string.format("| %d | %s | %d | %s | %s |", i, u.rec.unit, u.rec.bits, pct(u.rec.acc), d2(u.drop))
  end
  write_text(dir .. "/results.md", table.concat(md, "\n") .. "\n")
  local labels, values = {}, {}
  for i, u in ipairs(units) do labels[i] = u.rec.unit; values[i] = u.drop end
  write_text(dir .. "/sensitivity.svg", plot.bars{ title = string.format("Accuracy drop with one operator at %d bits (base: all at %d bits, %s%%)",
    o.low, base.bits, pct(base.acc)), xlabel = "drop in test accuracy (points)", labels = labels, values = values })
  files[#files + 1] = "sensitivity.svg"
end

-- Replays the mixed search from its records (no evaluation may be missing).
function sweep.replayMixed(o, plan, records)
  local acc_of, float = {}, nil
  for _, r in ipairs(records) do
    if r.kind == "float" then float = r.acc elseif r.config then acc_of[r.config] = r.acc end
  end
  if not float then fail("sweep: the mixed results have no float point") end
  local search = sweep.mixedSearch(sweep.mixedOptions(o, plan, float, function(bits)
    local sig = sweep.signature(bits)
    local a = acc_of[sig]
    if not a then fail("sweep: the mixed results lack the evaluation of %s (resume the run to finish it)", sig) end
    return a
  end))
  return search, float
end

-- The options of sweep.mixedSearch from the recipe's options and the plan.
function sweep.mixedOptions(o, plan, float_acc, evaluate)
  return { float_acc = float_acc, start = o.start, low = o.low, tolerance = o.tolerance,
           w_ladder = sweep.parseBits(o.w_ladder, "w_ladder"), a_ladder = sweep.parseBits(o.a_ladder, "a_ladder"),
           counts = plan.param_counts, evaluate = evaluate }
end

local function mixed_results(dir, o, plan, records, files)
  local s, float = sweep.replayMixed(o, plan, records)
  local counts = plan.param_counts or {}
  local fw, fa = sweep.averageBits(s.bits, counts)
  local csv = { "step,op,from,to,acc,drop,accepted,weight_bits_avg,act_bits_avg" }
  for _, p in ipairs(s.path) do
    csv[#csv + 1] = string.format("%d,%s,%d,%d,%s,%s,%s,%s,%s", p.step, p.op, p.from, p.to, pct4(p.acc), d4(p.drop), tostring(p.accepted),
      d4(p.weight_bits), d4(p.act_bits))
  end
  write_text(dir .. "/results.csv", table.concat(csv, "\n") .. "\n")
  local int8 = 8
  local desc = string.format("mixed precision from recipes/sweep.lua --mode mixed: test accuracy %s%% (float %s%%, tolerance %g points); weights %s bits on average (by parameter count), activations %s bits on average",
    pct(s.acc), pct(float), o.tolerance, d2(fw), d2(fa))
  local doc = sweep.configDoc(s.bits, desc)
  write_text(dir .. "/mixed_config.json", json.encode(doc, { pretty = true }) .. "\n")
  files[#files + 1] = "mixed_config.json"
  local md = { "# Mixed precision: least sensitive operators lowered while accuracy stays within tolerance", "",
               "Model: " .. tostring(plan.model) .. ". " .. calib_text(o) .. ".",
               string.format("Float: %s. Start: every operator at %d bits, %s. Tolerance: %g points below float. Ladders: weights %s, activations %s.",
                 pct(float), o.start, pct(s.base_acc), o.tolerance, o.w_ladder, o.a_ladder) }
  if not s.base_ok then
    md[#md + 1] = string.format("The start config is already %s points below float: nothing was lowered.", d2(100 * (float - s.base_acc)))
  end
  md[#md + 1] = ""
  local diff = 100 * (s.acc - float)
  md[#md + 1] = string.format("**Result** (`mixed_config.json`): test accuracy %s (%s%s points vs float); weights and biases %s bits on average by parameter count (%.1f%% fewer than int8), activations %s bits on average (max %d).",
    pct(s.acc), diff >= 0 and "+" or "", d2(diff), d2(fw), 100 * (1 - fw / int8), d2(fa), (function()
      local m = 0
      for _, op in ipairs(config.OPS) do if not config.isWeight(op) then m = math.max(m, s.bits[op]) end end
      return m
    end)())
  md[#md + 1] = ""
  md[#md + 1] = "| operator | bits |"
  md[#md + 1] = "|---|---|"
  for _, op in ipairs(config.OPS) do md[#md + 1] = string.format("| %s | %d |", op, s.bits[op]) end
  md[#md + 1] = ""
  md[#md + 1] = string.format("Sensitivity (each operator alone at %d bits, all others at %d), least sensitive first:", o.low, o.start)
  md[#md + 1] = ""
  md[#md + 1] = "| order | operator | test accuracy (%) | drop (points) |"
  md[#md + 1] = "|---|---|---|---|"
  for i, r in ipairs(s.ranking) do md[#md + 1] = string.format("| %d | %s | %s | %s |", i, r.op, pct(r.acc), d2(r.drop)) end
  md[#md + 1] = ""
  md[#md + 1] = "Path (each step lowers one operator by one ladder step; kept while within tolerance):"
  md[#md + 1] = ""
  md[#md + 1] = "| step | operator | bits | test accuracy (%) | below float (points) | kept | avg weight bits | avg activation bits |"
  md[#md + 1] = "|---|---|---|---|---|---|---|---|"
  for _, p in ipairs(s.path) do
    md[#md + 1] = string.format("| %d | %s | %d -> %d | %s | %s | %s | %s | %s |", p.step, p.op, p.from, p.to, pct(p.acc), d2(p.drop),
      p.accepted and "yes" or "no", d2(p.weight_bits), d2(p.act_bits))
  end
  write_text(dir .. "/results.md", table.concat(md, "\n") .. "\n")
  local kept, rejected = { { 0, 100 * s.base_acc } }, {}
  for _, p in ipairs(s.path) do
    if p.accepted then kept[#kept + 1] = { p.step, 100 * p.acc } else rejected[#rejected + 1] = { p.step, 100 * p.acc } end
  end
  local series = { { label = "kept steps", points = kept, color = plot.PALETTE[3] } }
  if #rejected > 0 then series[2] = { label = "rejected steps", points = rejected, color = plot.PALETTE[4], marker = "cross", line = false } end
  write_text(dir .. "/mixed_path.svg", plot.lines{ title = string.format("Mixed-precision path: W %.2f bits, A %.2f bits on average at the end", fw, fa),
    xlabel = "step (0 = every operator at " .. o.start .. " bits)", ylabel = "test accuracy (%)", series = series,
    hlines = { { y = 100 * float, label = "float " .. pct(float) }, { y = 100 * float - o.tolerance, label = "tolerance", color = plot.PALETTE[4] } } })
  files[#files + 1] = "mixed_path.svg"
  return s
end

-- Writes the result files of a complete sweep into dir; returns the list of file names.
-- o: the options (result-defining ones are read), plan, records (every point).
function sweep.writeResults(dir, o, plan, records)
  local sorted = {}
  for i, r in ipairs(records) do sorted[i] = r end
  table.sort(sorted, function(a, b) return a.index < b.index end)
  local lines = {}
  for i, r in ipairs(sorted) do lines[i] = sweep.encodeRecord(r) end
  write_text(dir .. "/results.jsonl", table.concat(lines, "\n") .. "\n")
  local files = { "results.jsonl", "results.csv", "results.md" }
  local extra
  if o.mode == "grid" then grid_results(dir, o, plan, sorted, files)
  elseif o.mode == "sensitivity" then sensitivity_results(dir, o, plan, sorted, files)
  elseif o.mode == "mixed" then extra = mixed_results(dir, o, plan, sorted, files)
  else fail("sweep: unknown mode '%s'", tostring(o.mode)) end
  return files, extra
end

return sweep
