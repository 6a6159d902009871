-- tests/fuzz_lua/fuzz.lua: a deterministic mutation fuzzer for the Lua loaders (issue 9).
-- Targets: "config" (quant.config, then quant.prepare), "qparams" (quant.load into a prepared
-- model, then a forward), "checkpoint" (serialize.loadCheckpoint into a quantized model with
-- its optimizer, then a forward) and "weights" (qgru.load). Seed inputs are made here from the
-- repository's configs and a small model, so the corpus never goes stale.
--
-- Each case mutates a seed (bytes of the file, a JSON field, a safetensors entry or a metadata
-- field) with a PRNG seeded from (seed, iteration), runs the loader under pcall and records a
-- finding when the loader raises anything other than a clean "qgru..." error, or when a failed
-- load changed the model, the optimizer, the quantizers or the RNG. A crash ends the process;
-- run.lua keeps the input that was running so the crash can be replayed (regressions/).
--
--   local fuzz = require("fuzz")          -- with tests/fuzz_lua on package.path
--   local findings = fuzz.run{iterations = 200, seed = 1, targets = {"config", ...}, dir = tmpdir}
--   fuzz.replay(path)                     -- one file: target from its name prefix
local qgru = require("qgru")
local ffi = require("ffi")
local bit = require("bit")
local clib = require("qgru.clib")
local json = qgru.json
local serialize = qgru.serialize
local quant, nn, optim, Tensor = qgru.quant, qgru.nn, qgru.optim, qgru.Tensor

local M = {}
M.TARGETS = { "config", "qparams", "checkpoint", "weights" }
M.EXT = { config = ".json", qparams = ".json", checkpoint = ".safetensors", weights = ".safetensors" }

-- ---- deterministic PRNG (xorshift32) ----
local function prng(seed)
  local s = bit.tobit((seed * 2654435761 + 12345) % 4294967296)
  if s == 0 then s = 1 end
  local r = {}
  function r.int(n)   -- 1..n
    s = bit.bxor(s, bit.lshift(s, 13)); s = bit.bxor(s, bit.rshift(s, 17)); s = bit.bxor(s, bit.lshift(s, 5))
    return (s % n) + 1
  end
  function r.pick(list) return list[r.int(#list)] end
  return r
end

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- ---- the models the loaders fill ----
local function small_model(quantized)
  qgru.seed(3)
  local m = nn.Sequential():add(nn.GRU(3, 4, { bidirectional = true })):add(nn.Last()):add(nn.Linear(8, 2))
  if quantized then
    quant.prepare(m, quant.uniform(8))
    qgru.seed(4)
    quant.calibrate(m, { qgru.zeros({ 5, 2, 3 }):uniform(-1, 1) }, { method = "minmax", passes = 1 })
  end
  return m
end

local function tensor_bytes(t)
  local c = t:device() == "cpu" and t or t:to("cpu")
  return ffi.string(c:ptr(), c:numel() * clib.lib.qg_dtype_size(clib.dtypes[c:dtype()]))
end

-- Everything a failed load must leave alone, as one string.
local function snapshot(model, opt)
  local parts = {}
  for _, p in ipairs(model:namedParameters()) do parts[#parts + 1] = p.name .. "=" .. tensor_bytes(p.param) end
  if opt then
    local st = opt:state()
    local names = {}
    for n in pairs(st.tensors) do names[#names + 1] = n end
    table.sort(names)
    for _, n in ipairs(names) do parts[#parts + 1] = n .. "=" .. tensor_bytes(st.tensors[n]) end
    parts[#parts + 1] = "t=" .. tostring(opt.t) .. " lr=" .. tostring(opt.lr)
  end
  if #quant.quantizers(model) > 0 then parts[#parts + 1] = serialize.encode(quant.state(model)) end
  local s = ffi.new("uint64_t[4]")
  local ctx = clib.context("cpu")
  clib.check(ctx, clib.lib.qg_rng_get_state(ctx, s))
  parts[#parts + 1] = ffi.string(s, 32)
  return table.concat(parts, "\n")
end

local function input() qgru.seed(9); return qgru.zeros({ 4, 2, 3 }):uniform(-1, 1) end

-- ---- seeds ----
-- Writes the seed inputs of every target into dir; returns {target = {path, ...}}.
function M.makeSeeds(dir)
  local seeds = { config = {}, qparams = {}, checkpoint = {}, weights = {} }
  local root = clib.root
  for _, name in ipairs({ "int8", "int6", "w4a8", "seed_example1_full", "seed_example3_mixed" }) do
    local p = dir .. "/seed-config-" .. name .. ".json"
    write(p, read(root .. "/config/" .. name .. ".json"))
    seeds.config[#seeds.config + 1] = p
  end
  local m = small_model(true)
  local qp = dir .. "/seed-qparams.json"
  quant.export(m, qp)
  seeds.qparams[1] = qp
  local opt = optim.Adam(m, { lr = 1e-2 })
  local crit = nn.MSE()
  local x = input()
  local out = m:forward(x)
  crit:forward(out, qgru.zeros(out:shape()))
  m:zeroGrad()
  m:backward(x, crit:backward(out, qgru.zeros(out:shape())))
  opt:step()
  local ck = dir .. "/seed-checkpoint.safetensors"
  serialize.saveCheckpoint(ck, m, opt, { epoch = 1, batch = 1, step = 1, batch_size = 2, seed = 1, history = {}, losses = { 0.5 },
                                         options = { name = "x", lr = 0.01 }, quant = quant.state(m) })
  seeds.checkpoint[1] = ck
  local w = dir .. "/seed-weights.safetensors"
  qgru.save(m, w)
  seeds.weights[1] = w
  return seeds
end

-- ---- mutators ----
local INTERESTING = { 0, -1, 1, 2.5, 7, 8, 31, 32, 33, -31, -32, 1e308, -1e308, 2 ^ 53, 2 ^ 63, -2 ^ 31, 255, 256, 65535 }
local function interesting_value(r)
  local k = r.int(10)
  if k <= 4 then return r.pick(INTERESTING) end
  if k == 5 then return r.pick({ "8", "", "half_to_even", "z,r,g", "fwd", "bwd", "nan", "Infinity", string.rep("A", r.int(3000)) }) end
  if k == 6 then return r.pick({ true, false, json.null }) end
  if k == 7 then return setmetatable({}, { kind = "object" }) end
  if k == 8 then return json.array({}) end
  if k == 9 then
    local v = json.array({ 1 })
    for _ = 1, r.int(60) do v = json.array({ v }) end
    return v
  end
  return json.array({ r.pick(INTERESTING), r.pick(INTERESTING) })
end

-- All (container, key) slots of a decoded JSON value, keys in a fixed order (numbers, then
-- strings, each sorted): pairs' order follows LuaJIT's string hashes, which differ from process to
-- process, and with it the slot that a (seed, iteration) picked, so one run could find a case that
-- the next run with the same seed never tried.
local function key_before(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta == "number" end
  return a < b
end

local function slots(v, out)
  out = out or {}
  if type(v) == "table" and v ~= json.null then
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, key_before)
    for _, k in ipairs(keys) do
      out[#out + 1] = { v, k }
      slots(v[k], out)
    end
  end
  return out
end

local function mutate_json_value(doc, r)
  local all = slots(doc)
  if #all == 0 then return interesting_value(r) end
  for _ = 1, r.int(3) do
    local s = r.pick(all)
    local c, k = s[1], s[2]
    local op = r.int(6)
    if op <= 2 then c[k] = interesting_value(r)
    elseif op == 3 then c[k] = r.pick(all)[1][r.pick(all)[2]] or json.null   -- splice another value
    elseif op == 4 then
      if json.isArray(c) then table.remove(c, k) else c[k] = nil end
    elseif op == 5 then
      if json.isArray(c) then table.insert(c, k, c[k]) else c[k .. "_x"] = c[k] end
    else
      local x = c[k]
      if type(x) == "number" then c[k] = x + r.pick({ 1, -1, 0.5, 2 ^ 20, -2 ^ 20 }) else c[k] = tostring(x) end
    end
  end
  return doc
end

local function mutate_bytes(s, r)
  for _ = 1, r.int(4) do
    local n = #s
    local op = r.int(6)
    local i = n > 0 and r.int(n) or 1
    if op == 1 and n > 0 then
      s = s:sub(1, i - 1) .. string.char(r.int(256) - 1) .. s:sub(i + 1)
    elseif op == 2 then
      s = s:sub(1, i - 1) .. s:sub(i + r.int(16))
    elseif op == 3 then
      local ins = {}
      for j = 1, r.int(8) do ins[j] = string.char(r.pick({ 0, 255, 0x7F, 0x80, 34, 44, 48, 57, 91, 93, 123, 125, r.int(256) - 1 })) end
      s = s:sub(1, i - 1) .. table.concat(ins) .. s:sub(i)
    elseif op == 4 then
      local len = r.int(32)
      s = s:sub(1, i - 1) .. s:sub(i, i + len) .. s:sub(i)
    elseif op == 5 then
      s = s:sub(1, i)
    else
      local digits = { "0", "9", "-", ".", "e", "1e400", "99999999999999999999" }
      s = s:sub(1, i - 1) .. r.pick(digits) .. s:sub(i + 1)
    end
  end
  return s
end

-- A JSON text mutated structurally (when it parses) or byte-wise.
local function mutate_json_text(text, r)
  if r.int(3) > 1 then
    local ok, doc = pcall(json.decode, text)
    if ok then
      local mutated = mutate_json_value(doc, r)
      local eok, out = pcall(json.encode, mutated)
      if eok then return out end
    end
  end
  return mutate_bytes(text, r)
end

local DTYPES = { "f32", "f64", "i8", "u8", "i16", "i32", "i64" }
local NAN_BITS = { 0xFFEC0001, 0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0x7F800000 }

local function random_tensor(r, like)
  local shape
  if like and r.int(2) == 1 then
    shape = like:shape()
    if r.int(2) == 1 then shape[r.int(#shape)] = r.int(6) - 1 end
  else
    shape = {}
    for i = 1, r.int(3) do shape[i] = r.int(5) - 1 end
  end
  local dt = (like and r.int(3) > 1) and like:dtype() or r.pick(DTYPES)
  local t = Tensor.new(shape, dt)
  if t:numel() > 0 then
    local bytes = t:numel() * clib.lib.qg_dtype_size(clib.dtypes[dt])
    local p = ffi.cast("uint8_t*", t:ptr())
    for i = 0, bytes - 1 do p[i] = r.int(256) - 1 end
    if (dt == "f32") and r.int(2) == 1 then ffi.cast("uint32_t*", p)[0] = r.pick(NAN_BITS) end
  end
  return t
end

-- A checkpoint or weights file mutated at the safetensors level (entries, metadata) or byte-wise.
local function mutate_safetensors(path, r, out)
  if r.int(4) == 1 then
    write(out, mutate_bytes(read(path), r))
    return
  end
  local t, meta = serialize.load(path)
  local names = {}
  for n in pairs(t) do names[#names + 1] = n end
  table.sort(names)
  local mkeys = {}
  for k in pairs(meta) do mkeys[#mkeys + 1] = k end
  table.sort(mkeys)
  for _ = 1, r.int(2) do
    local op = r.int(8)
    if op <= 3 and #mkeys > 0 then
      local k = r.pick(mkeys)
      meta[k] = mutate_json_text(meta[k] or "", r)
    elseif op == 4 then
      local n = r.pick(names)
      t[n] = random_tensor(r, t[n])
    elseif op == 5 then
      t[r.pick(names)] = nil
    elseif op == 6 then
      t[r.pick({ "rng", "model.stowaway", "optim.exp_avg.x", "optim." .. r.pick(names) })] = random_tensor(r)
    elseif op == 7 and #mkeys > 0 then
      local v = r.pick({ "DELETE", "", "null", "1", "2", "checkpoint", "weights", "{}", "[]", "false" })
      meta[r.pick(mkeys)] = v ~= "DELETE" and v or nil
    else
      local n = r.pick(names)
      if t[n] and t[n]:dtype() == "f32" and t[n]:numel() > 0 then
        ffi.cast("uint32_t*", t[n]:ptr())[r.int(t[n]:numel()) - 1] = r.pick(NAN_BITS)
      end
    end
  end
  serialize.save(out, t, meta)
end

-- Writes a mutation of seed file `seed` for target into out.
function M.mutate(target, seed, r, out)
  if target == "config" or target == "qparams" then
    write(out, mutate_json_text(read(seed), r))
  else
    mutate_safetensors(seed, r, out)
  end
end

-- ---- running a loader ----
local function clean(err)
  if type(err) ~= "string" then return false end
  return err:match("^qgru") ~= nil or err:match("^[^\n]-:%d+: qgru") ~= nil
end

-- Runs target's loader on path. Returns nil when the outcome is acceptable, else a finding.
function M.check(target, path)
  local model, opt, load
  if target == "config" then
    model = small_model(false)
    load = function() quant.prepare(model, quant.config(path)) end
  elseif target == "qparams" then
    model = small_model(false)
    quant.prepare(model, quant.uniform(8))
    load = function() quant.load(model, path) end
  elseif target == "checkpoint" then
    model = small_model(true)
    opt = optim.Adam(model, { lr = 1e-2 })
    load = function() serialize.loadCheckpoint(path, model, opt) end
  elseif target == "weights" then
    model = small_model(false)
    load = function() qgru.load(model, path) end
  else
    error("fuzz: unknown target " .. tostring(target))
  end
  local saved_warn = serialize.warn
  serialize.warn = function() end
  local before = snapshot(model, opt)
  local ok, err = pcall(load)
  local after = snapshot(model, opt)
  local finding
  if not ok then
    if not clean(err) then finding = "unclean error: " .. tostring(err)
    elseif before ~= after then finding = "a failed load changed the model/optimizer/quantizers/RNG: " .. tostring(err) end
  else
    -- a load that succeeded leaves a model that runs (or fails cleanly)
    local fok, ferr = pcall(function()
      local y = model:forward(input())
      return tostring(y)
    end)
    if not fok and not clean(ferr) then finding = "forward after a successful load: " .. tostring(ferr) end
  end
  serialize.warn = saved_warn
  return finding
end

-- Replays one file; its target is the name's prefix (config-..., qparams-..., ...).
function M.replay(path)
  local name = path:match("([^/]*)$")
  local target = name:match("^(%a+)%-")
  return M.check(target, path), target
end

-- opts: iterations (per target), seed, targets, dir (a scratch folder), on_case(target, path)
-- (called before each case runs: run.lua saves the input there). Returns the findings:
-- {{target=, iteration=, message=, input=bytes}, ...} and the number of cases run.
function M.run(opts)
  local dir = opts.dir
  local seeds = M.makeSeeds(dir)
  local findings, n = {}, 0
  for _, target in ipairs(opts.targets or M.TARGETS) do
    for it = 1, opts.iterations do
      local r = prng((opts.seed or 1) * 1000003 + it * 7 + #target)
      local out = dir .. "/case-" .. target .. M.EXT[target]
      M.mutate(target, r.pick(seeds[target]), r, out)
      if opts.on_case then opts.on_case(target, out, it) end
      local finding = M.check(target, out)
      n = n + 1
      if finding then
        findings[#findings + 1] = { target = target, iteration = it, message = finding, input = read(out) }
      end
    end
  end
  return findings, n
end

return M
