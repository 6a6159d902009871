-- hostile_input_spec.lua: the Lua layers under hostile or careless input (issue 9): NaN payloads
-- read and printed without crashing, clear errors for directories, malformed parameter files,
-- bad options (at the caller's line; recipes exit 2 with the usage and no traceback, before any
-- data is loaded), and no shell ever sees a user string.
local qgru = require("qgru")
local ffi = require("ffi")
local clib = require("qgru.clib")
local U = require("testutil")
local nn, quant, json, Tensor, cli, serialize = qgru.nn, qgru.quant, qgru.json, qgru.Tensor, qgru.cli, qgru.serialize

local ROOT = clib.root
if ROOT:sub(1, 1) ~= "/" then ROOT = os.getenv("PWD") .. "/" .. ROOT end

-- A one-element .npy of dtype descr ('<f4' / '<f8') holding raw bytes.
local function npy_bytes(descr, raw)
  local hdr = "{'descr': '" .. descr .. "', 'fortran_order': False, 'shape': (" .. (#raw / (descr == "<f4" and 4 or 8)) .. ",), }"
  hdr = hdr .. string.rep(" ", 64 - 10 - #hdr - 1) .. "\n"
  return "\147NUMPY\1\0" .. string.char(#hdr % 256, math.floor(#hdr / 256)) .. hdr .. raw
end
local function le32(u) return string.char(u % 256, math.floor(u / 256) % 256, math.floor(u / 65536) % 256, math.floor(u / 16777216) % 256) end

describe("NaN payloads", function()
  -- float bit patterns and what they are (IEEE 754, independent of the code under test)
  local F32 = { { 0xFFEC0001, "nan" }, { 0x7FC00001, "nan" }, { 0x7F800001, "nan" }, { 0xFFFFFFFF, "nan" }, { 0xFFC00000, "nan" },
                { 0x7F800000, "inf" }, { 0xFF800000, "-inf" }, { 0x3FC00000, 1.5 } }

  it("a .npy float with bits 0xFFEC0001 (and other NaNs) reads, prints and converts without crashing", function()
    local raw = {}
    for _, c in ipairs(F32) do raw[#raw + 1] = le32(c[1]) end
    local p = U.tmpname(".npy")
    U.write_bytes(p, npy_bytes("<f4", table.concat(raw)))
    local warned
    local saved = qgru.data.warn
    qgru.data.warn = function(m) warned = m end
    local t = qgru.data.npy(p)
    qgru.data.warn = saved
    assert.are.equal(p .. ": 7 non-finite values (first at element 1)", warned:match("^qgru: warning: (.*)$"))
    local tbl = t:totable()
    for i, c in ipairs(F32) do
      local v = t:get(i)
      assert.are.equal("number", type(v))
      if c[2] == "nan" then assert.is_true(v ~= v); assert.is_true(tbl[i] ~= tbl[i])
      elseif c[2] == "inf" then assert.are.equal(math.huge, v)
      elseif c[2] == "-inf" then assert.are.equal(-math.huge, v)
      else assert.are.equal(c[2], v); assert.are.equal(c[2], tbl[i]) end
    end
    assert.are.equal("qgru.Tensor [8] f32 cpu\n  nan nan nan nan nan inf -inf 1.5", tostring(t))
    assert.are.equal("qgru.Tensor [1, 8] f32 cpu\n  nan nan nan nan nan inf -inf 1.5", tostring(t:view({ 1, 8 })))
    assert.are.same({ 7, 1 }, { t:countNonFinite() })
    os.remove(p)
  end)

  it("f64 NaN payloads too", function()
    local hi = { 0xFFFD8000, 0x7FF00000, 0xFFFFFFFF, 0x7FF00000, 0x3FF80000 }
    local lo = { 0x20000000, 0x00000001, 0xFFFFFFFF, 0x00000000, 0x00000000 }
    local raw = {}
    for i = 1, #hi do raw[#raw + 1] = le32(lo[i]) .. le32(hi[i]) end
    local p = U.tmpname(".npy")
    U.write_bytes(p, npy_bytes("<f8", table.concat(raw)))
    local saved = qgru.data.warn
    qgru.data.warn = function() end
    local t = qgru.data.npy(p)
    qgru.data.warn = saved
    for i = 1, 3 do local v = t:get(i); assert.is_true(v ~= v) end
    assert.are.equal(math.huge, t:get(4))
    assert.are.equal(1.5, t:get(5))
    assert.are.equal("qgru.Tensor [5] f64 cpu\n  nan nan nan inf 1.5", tostring(t))
    assert.are.same({ 4, 1 }, { t:countNonFinite() })
    os.remove(p)
  end)

  it("a weight holding a NaN payload goes through forward, the loss and printing", function()
    qgru.seed(1)
    local m = nn.Linear(2, 2)
    local w = m.weight or m:namedParameters()[1].param
    ffi.cast("uint32_t*", w:ptr())[0] = 0xFFEC0001
    local out = m:forward(qgru.tensor({ { 1, 1 } }))
    assert.is_truthy(tostring(out):find("nan", 1, true))
    local loss = nn.MSE():forward(out, qgru.tensor({ { 0, 0 } }))
    assert.is_true(loss ~= loss)
    assert.is_true(w:sumsq() ~= w:sumsq())
  end)
end)

describe("unreadable files", function()
  it("a directory given as a file says so", function()
    local m = nn.Sequential():add(nn.GRU(2, 3)):add(nn.Last())
    assert.raises_match(function() json.read("/tmp") end, "qgru: '/tmp': is a directory, not a file")
    assert.raises_match(function() quant.config("/tmp") end, "qgru: '/tmp': is a directory, not a file")
    quant.prepare(m, quant.uniform(8))
    assert.raises_match(function() quant.load(m, "/tmp") end, "qgru: '/tmp': is a directory, not a file")
    assert.raises_match(function() qgru.load(m, "/tmp") end, "qgru: '/tmp': is a directory, not a safetensors file")
    assert.raises_match(function() serialize.loadCheckpoint("/tmp", m) end, "is a directory")
    assert.raises_match(function() json.read("/no/such/file.json") end, "qgru: cannot read '/no/such/file.json': No such file or directory")
  end)
end)

describe("qparams files", function()
  local function model()
    qgru.seed(1)
    return nn.Sequential():add(nn.GRU(4, 5, { bidirectional = true })):add(nn.Last()):add(nn.Linear(10, 3))
  end
  local exported
  local function good_doc()
    if not exported then
      local m = model()
      quant.prepare(m, quant.uniform(8))
      qgru.seed(2)
      quant.calibrate(m, { qgru.zeros({ 6, 3, 4 }):uniform(-1, 1) })
      exported = U.tmpname(".json")
      quant.export(m, exported)
    end
    return json.read(exported)
  end
  -- the quantizer state and weights of a prepared, uncalibrated model, as text
  local function state_of(m) return serialize.encode(quant.state(m)) .. tostring(m:namedParameters()[1].param:sumsq()) end

  local function rejects(edit, pattern)
    local doc = good_doc()
    edit(doc)
    local p = U.tmpname(".json")
    U.write_bytes(p, type(doc) == "string" and doc or json.encode(doc))
    local m = model()
    quant.prepare(m, quant.uniform(8))
    local before = state_of(m)
    assert.raises_match(function() quant.load(m, p) end, pattern)
    assert.are.equal(before, state_of(m))
    os.remove(p)
  end

  it("a good export loads (the cases below differ from it in one place)", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    good_doc()
    quant.load(m, exported)
    assert.is_true(quant.get(m, "1.l0.bwd.op.rRh").frozen)
  end)

  it("refuses garbage, naming the JSON path, and changes nothing", function()
    local L = function(d) return d.modules[1].layers_params end
    rejects(function(d) d.modules[1].layers_params = json.array({}) end, "$.modules[0].layers_params: expected 2 entries (1 layer(s) x 2 direction(s)), got 0")
    rejects(function(d) L(d)[2] = L(d)[1] end, "$.modules[0].layers_params[1]: layer 0 fwd is given twice (also at layers_params[0])")
    rejects(function(d) L(d)[2] = 42 end, "$.modules[0].layers_params[1]: expected an object, got the number 42")
    rejects(function(d) L(d)[1].layer = "0" end, "$.modules[0].layers_params[0].layer: expected an integer >= 0, got a string")
    rejects(function(d) L(d)[1].direction = "up" end, "$.modules[0].layers_params[0].direction: expected \"fwd\" or \"bwd\"")
    rejects(function(d) L(d)[1].operators["op.rRh"].zero_point = 3; L(d)[1].operators["op.rRh"].is_symmetric = true end,
            "operators[\"op.rRh\"].zero_point: a symmetric quantizer has zero_point 0, got 3")
    rejects(function(d) d.rounding = "floor" end, "$.rounding: expected \"half_to_even\"")
    rejects(function(d) d.modules[1].gate_order = "r,z,n" end, "$.modules[0].gate_order: expected \"z,r,g\"")
    rejects(function(d) L(d)[1].operators["op.rRh"].scale = L(d)[1].operators["op.rRh"].scale * 2 end,
            "operators[\"op.rRh\"].scale: ")
    rejects(function(d) L(d)[1].operators["weight.W"].scale[3] = 0.5 end, "operators[\"weight.W\"].scale[2]: 0.5 is not 2^-exp2_inv")
    rejects(function(d) d.modules[1].hidden_size = "5" end, "$.modules[0].hidden_size: expected a number, got a string")
    rejects(function(d) L(d)[1].operators["input.x"].bitwidth = 2.5 end, "operators[\"input.x\"].bitwidth: expected an integer 1..32, got the number 2.5")
    rejects(function(d) L(d)[1].operators["input.x"].is_unsigned = "no" end, "operators[\"input.x\"].is_unsigned: expected true or false, got a string")
    rejects(function(d) L(d)[1].operators["weight.R"].exp2_inv = 3 end, "operators[\"weight.R\"].exp2_inv: expected an array of 15 integers, got the number 3")
    rejects(function(d) L(d)[1].operators["gate.g_out"] = nil end, "operators[\"gate.g_out\"]: missing")
    rejects(function(d) L(d)[1].operators["op.extra"] = L(d)[1].operators["op.rRh"] end, "unknown operator \"op.extra\"")
    rejects(function(d) L(d)[1].operators["op.rRh"].qmax = 255 end, "operators[\"op.rRh\"].qmax: expected 127 for this grid")
    rejects(function(d) L(d)[1].operators["op.rRh"].range = "wide" end, "operators[\"op.rRh\"].range: expected two numbers")
    rejects(function(d) d.modules[1].layers_params = nil end, "$.modules[0].layers_params: missing")
  end)
end)

describe("options", function()
  it("quant.uniform rejects fractional and mistyped bitwidths", function()
    assert.raises_match(function() quant.uniform(8, { weight_bits = 2.5 }) end, "weight_bits must be an integer 1..32, got the number 2.5")
    assert.raises_match(function() quant.uniform(8, { act_bits = "8" }) end, "act_bits must be an integer 1..32, got a string")
    assert.raises_match(function() quant.uniform(8, { disable_quantization = "yes" }) end, "disable_quantization must be true or false")
  end)

  it("constructor errors point at the caller's line, not into lua/qgru", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, err = pcall(function() return nn.GRU(28, 0) end)
    assert.is_false(ok)
    assert.are.equal("hostile_input_spec.lua:" .. line .. ": qgru: nn.GRU: hiddenSize must be a positive integer, got 0", err:match("[^/]*$"))
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() return qgru.optim.Adam(nn.Linear(2, 2), { foo = 1 }) end)
    assert.are.equal("hostile_input_spec.lua:" .. line .. ": qgru: optim.Adam: unknown option 'foo' (allowed: betas, clip, eps, lr, weight_decay)", err:match("[^/]*$"))
    line = debug.getinfo(1, "l").currentline + 1
    ok, err = pcall(function() return qgru.train.Engine{ model = nn.Linear(2, 2) } end)
    assert.are.equal("hostile_input_spec.lua:" .. line .. ": qgru: train.Engine: missing 'criterion'", err:match("[^/]*$"))
    assert.is_nil(err:find("class.lua", 1, true))
  end)

  it("cli rules: --train_limit -5, fractions, non-finite numbers", function()
    local spec = { train_limit = { 0, "limit", { int = true, min = 0 } }, lr = { 1e-3, "lr", { min = 0 } },
                   method = { "minmax", "m", { choices = { "minmax", "mse" } } } }
    assert.raises_match(function() cli.parse({ "--train_limit", "-5" }, spec) end, "option --train_limit must be >= 0, got -5")
    assert.raises_match(function() cli.parse({ "--train_limit", "2.5" }, spec) end, "option --train_limit expects an integer, got 2.5")
    assert.raises_match(function() cli.parse({ "--lr", "nan" }, spec) end, "option --lr expects")
    assert.raises_match(function() cli.parse({ "--lr", "1e999" }, spec) end, "option --lr expects a finite number")
    assert.raises_match(function() cli.parse({ "--method", "floor" }, spec) end, "option --method must be one of minmax, mse, got 'floor'")
    assert.are.equal(7, cli.parse({ "--train_limit", "7" }, spec).train_limit)
  end)

  it("data options are checked", function()
    assert.raises_match(function() qgru.data.fashionMNIST("train", { limit = -5 }) end, "limit must be a positive integer, got -5")
    assert.raises_match(function() qgru.data.fashionMNIST("train", { limt = 5 }) end, "unknown option 'limt'")
    local ds = qgru.data.adding(4, 3, 1)
    assert.raises_match(function() ds:batches(2, { shufle = true }) end, "batches: unknown option 'shufle'")
  end)
end)

-- Runs a recipe with luajit from directory dir; returns its output and exit status.
local function run_recipe(dir, recipe, args)
  local cmd = string.format("cd '%s' && QGRU_ROOT='%s' QGRU_LIB='%s' LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' luajit '%s/recipes/%s' %s 2>&1; echo \"rc=$?\"",
                            dir, ROOT, os.getenv("QGRU_LIB") or (ROOT .. "/build/libqgru.so"), ROOT, ROOT, ROOT, recipe, args)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

describe("recipes", function()
  local dir
  setup(function()
    dir = U.tmpname("_recipes")
    qgru.mkdir(dir)
  end)

  it("a bad flag prints the message and the usage, exits 2, no traceback, loads no data", function()
    for _, c in ipairs({ { "train_float.lua", "--train_limit -5", "option --train_limit must be >= 0, got -5" },
                         { "train_float.lua", "--epochs many", "option --epochs expects a number, got 'many'" },
                         { "qat.lua", "--config /tmp", "'/tmp': is a directory, not a file" },
                         { "qat.lua", "--method floor", "option --method must be one of" },
                         { "calibrate.lua", "--weights /no/such.safetensors", "no float weights at /no/such.safetensors" },
                         { "bench.lua", "--repeats 2.5", "option --repeats expects an integer, got 2.5" },
                         { "bench.lua", "--shapes seed-small,100x4x128", "'100x4x128' is neither a shape name" },
                         { "bench.lua", "--shapes 100x4x0x256", "nor TxNxCxH with four positive integers" },
                         { "train_float.lua", "--bogus 1", "unknown option --bogus" } }) do
      local out, rc = run_recipe(dir, c[1], c[2] .. (c[1] == "train_float.lua" and " --data_dir /no/such/data" or ""))
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find(c[3], 1, true), out)
      assert.is_truthy(out:find("recipes/" .. c[1] .. ":", 1, true), out)   -- the usage title
      assert.is_nil(out:find("traceback", 1, true), out)
      assert.is_nil(out:find("data:", 1, true), out)
    end
  end)

  it("resuming with other options stops before the data is loaded, naming them", function()
    qgru.seed(1)
    local m = qgru.zoo.fmnistGRU(8)
    local ck = dir .. "/resume.safetensors"
    local opts = { name = "r", epochs = 2, batch_size = 32, hidden = 8, layers = 1, lr = 0.002, clip = 1, seed = 1, threads = 0,
                   train_limit = 256, resume = "", data_dir = "/no/such/data" }
    serialize.saveCheckpoint(ck, m, qgru.optim.Adam(m), { epoch = 2, batch = 0, step = 8, batch_size = 32, seed = 1, options = opts })
    local out, rc = run_recipe(dir, "train_float.lua", "--hidden 8 --train_limit 256 --batch_size 64 --lr 0.01 --name r --resume " .. ck ..
                                                       " --data_dir /no/such/data")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("the run differs from the checkpoint's (nothing was loaded):\n  batch_size: checkpoint 32, now 64", 1, true), out)
    assert.is_truthy(out:find("option lr: checkpoint 0.002, now 0.01", 1, true), out)
    assert.is_nil(out:find("option batch_size", 1, true), out)
    assert.is_nil(out:find("traceback", 1, true), out)
    assert.is_nil(out:find("/no/such/data/", 1, true), out)   -- the data was not touched
  end)

  it("--name with shell syntax creates nothing else: the name is a literal folder name", function()
    local marker = dir .. "/INJECTED"
    local name = "x'; touch " .. marker .. "; echo '$(touch " .. marker .. "2)"
    -- the data folder does not exist: the recipe stops after creating its run folder
    local out, rc = run_recipe(dir, "train_float.lua", "--name \"" .. name:gsub("%$", "\\$") .. "\" --data_dir /no/such/data --epochs 1")
    assert.are_not.equal(0, rc, out)
    assert.is_nil(io.open(marker, "rb"))
    assert.is_nil(io.open(marker .. "2", "rb"))
    local log = io.open(dir .. "/runs/" .. name .. "/log.txt", "rb")
    assert.is_truthy(log, out)
    log:close()
  end)

  it("qgru.mkdir creates parents literally and names the component that failed", function()
    local d = dir .. "/a b/'q'/$(x)/c"
    qgru.mkdir(d)
    qgru.mkdir(d)   -- existing: fine
    local f = assert(io.open(d .. "/f", "wb")); f:close()
    assert.raises_match(function() qgru.mkdir(d .. "/f/g") end, "cannot create directory '" .. d .. "/f/g': '" .. d .. "/f' exists and is not a directory")
    assert.raises_match(function() qgru.mkdir("") end, "mkdir: expected a non-empty path")
    assert.raises_match(function() qgru.mkdir("/proc/qgru_no/x") end, "'/proc/qgru_no'")
  end)

  it("no library file or recipe runs a shell (os.execute / io.popen)", function()
    local f = io.popen("cd '" .. ROOT .. "' && ls lua/qgru/*.lua lua/qgru/*/*.lua recipes/*.lua")
    local n = 0
    for path in f:lines() do
      local src = U.read_bytes(ROOT .. "/" .. path)
      n = n + 1
      assert.is_nil(src:find("os%.execute"), path)
      assert.is_nil(src:find("io%.popen"), path)
      assert.is_nil(src:find("loadstring", 1, true) and path ~= "lua/qgru/repl.lua" and path or nil, path)
    end
    f:close()
    assert.is_true(n > 20)
  end)
end)

describe("json", function()
  it("refuses to write tables that would lose keys, cycles, and reads only bounded files", function()
    assert.raises_match(function() json.encode({ 1, 2, x = 3 }) end, "mixed or sparse keys as JSON at $")
    assert.raises_match(function() json.encode({ [1] = 1, [3] = 3 }) end, "mixed or sparse keys")
    local cyc = {}
    cyc.self = cyc
    assert.raises_match(function() json.encode(cyc) end, "nested deeper than 500 levels")
    assert.raises_match(function() json.decode(nil) end, "expected JSON text, got nil")
    local p = U.tmpname(".json")
    U.write_bytes(p, '{"a": "' .. string.rep("x", 2000) .. '"}')
    local saved = json.MAX_FILE_BYTES
    json.MAX_FILE_BYTES = 1000
    local ok, err = pcall(json.read, p)
    json.MAX_FILE_BYTES = saved
    assert.is_false(ok)
    assert.is_truthy(err:find("2009 bytes, more than the 1000", 1, true), err)
    assert.are.equal(2000, #json.read(p).a)
    os.remove(p)
  end)
end)
