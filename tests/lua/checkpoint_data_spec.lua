-- checkpoint_data_spec.lua: checkpoints are data (JSON metadata, never Lua source) and loads are
-- all or nothing: each hostile or mismatched checkpoint below fails with a clear message, and the
-- model, the optimizer (moments, step, lr), the quantizers and the RNG are bit-identical after
-- the failed load (compared byte by byte).
local qgru = require("qgru")
local ffi = require("ffi")
local clib = require("qgru.clib")
local json = require("qgru.json")
local serialize = qgru.serialize
local nn, optim, train, quant, Tensor = qgru.nn, qgru.optim, qgru.train, qgru.quant, qgru.Tensor
local U = require("testutil")

local quiet = function() end
local ds = qgru.data.adding(64, 5, 3)

local function tensor_bytes(t)
  local c = t:device() == "cpu" and t or t:to("cpu")
  return ffi.string(c:ptr(), c:numel() * clib.lib.qg_dtype_size(clib.dtypes[c:dtype()]))
end

local function rng_bytes()
  local s = ffi.new("uint64_t[4]")
  local ctx = clib.context("cpu")
  clib.check(ctx, clib.lib.qg_rng_get_state(ctx, s))
  return ffi.string(s, 32)
end

-- Everything a load could change, as strings and numbers.
local function snapshot(model, opt)
  local s = { params = {}, optim = {}, rng = rng_bytes() }
  for _, p in ipairs(model:namedParameters()) do s.params[p.name] = tensor_bytes(p.param) end
  if opt then
    for n, t in pairs(opt:state().tensors) do s.optim[n] = tensor_bytes(t) end
    s.t, s.lr = opt.t, opt.lr
  end
  if #quant.quantizers(model) > 0 then s.quant = serialize.encode(quant.state(model)) end
  return s
end

local function setup(seed, quantized)
  qgru.seed(seed)
  local model = nn.Sequential():add(nn.GRU(2, 6)):add(nn.Last()):add(nn.Linear(6, 1))
  if quantized then
    quant.prepare(model, quant.uniform(6))
    quant.calibrate(model, { ds.x:narrow(1, 16):transpose01() }, { method = "minmax", passes = 1 })
  end
  local opt = optim.Adam(model, { lr = 1e-2 })
  return model, opt, train.Engine{ model = model, criterion = nn.MSE(), optimizer = opt, log = quiet }
end

-- A checkpoint after 5 steps (batch_size 16, seed 4, options {lr = 0.01, tag = "a"}).
local function make_checkpoint(quantized)
  local _, _, engine = setup(11, quantized)
  local p = U.tmpname(".safetensors")
  engine:train{ data = ds, batch_size = 16, epochs = 2, seed = 4, checkpoint = p, max_steps = 5, options = { lr = 0.01, tag = "a" } }
  return p
end

-- Rewrites checkpoint src into a new file after fn(tensors, metadata) changed them.
local function rewrite(src, fn)
  local t, meta = serialize.load(src)
  fn(t, meta)
  local dst = U.tmpname(".safetensors")
  serialize.save(dst, t, meta)
  return dst
end

-- Loads ckpt into a fresh model (trained a step, so its optimizer state is not zero) and checks
-- the error and that nothing changed.
local function refuses(ckpt, pattern, quantized, how)
  local model, opt, engine = setup(77, quantized)
  engine:train{ data = ds, batch_size = 16, epochs = 1, seed = 9, max_steps = 1 }
  local before = snapshot(model, opt)
  local fn = how == "resume" and function()
    engine:train{ data = ds, batch_size = 16, epochs = 2, seed = 4, resume = ckpt, options = { lr = 0.01, tag = "a" } }
  end or function() serialize.loadCheckpoint(ckpt, model, opt) end
  assert.raises_match(fn, pattern)
  assert.are.same(before, snapshot(model, opt))
  return model, opt
end

describe("checkpoints are data", function()
  local ckpt
  setup(1)
  before_each(function() ckpt = ckpt or make_checkpoint(false) end)

  it("hold JSON metadata (qgru.format 2), no Lua source", function()
    local f = serialize.open(ckpt)
    assert.are.equal("2", f.metadata["qgru.format"])
    local st = json.decode(f.metadata["qgru.state"])
    assert.are.equal(16, st.batch_size)
    assert.are.equal(5, st.step)
    assert.are.equal("a", st.options.tag)
    local oi = json.decode(f.metadata["qgru.optim"])
    assert.are.equal("Adam", oi.kind)
    assert.are.equal(5, oi.scalars.t)
    assert.is_nil(f.metadata["qgru.state"]:find("[\"", 1, true))
    f:close()
  end)

  it("non-finite numbers in the state survive the round trip", function()
    local v = serialize.decode(serialize.encode({ losses = { 1.5, 0 / 0, math.huge, -math.huge } }))
    assert.are.equal(1.5, v.losses[1])
    assert.is_true(v.losses[2] ~= v.losses[2])
    assert.are.equal(math.huge, v.losses[3])
    assert.are.equal(-math.huge, v.losses[4])
  end)

  it("an old checkpoint with Lua-source metadata is refused, never run", function()
    local evil = rewrite(ckpt, function(_, meta)
      meta["qgru.format"] = nil
      meta["qgru.state"] = "(function() rawset(_G, 'QGRU_PWNED', true) while true do end end)()"
    end)
    refuses(evil, "older qgru, whose checkpoint metadata is Lua source; it is not run")
    assert.is_nil(rawget(_G, "QGRU_PWNED"))
    -- the same Lua source in a current-format checkpoint is a JSON error, not code
    local evil2 = rewrite(ckpt, function(_, meta) meta["qgru.state"] = "{[\"epoch\"]=(function() while true do end end)()}" end)
    refuses(evil2, "metadata qgru.state")
    os.remove(evil); os.remove(evil2)
  end)

  it("metadata larger than the limit is refused before parsing", function()
    local big = rewrite(ckpt, function(_, meta)
      meta["qgru.state"] = '{"history": [], "pad": "' .. string.rep("x", 200000) .. '"}'
    end)
    local saved = serialize.MAX_STATE_BYTES
    serialize.MAX_STATE_BYTES = 100000
    local ok, err = pcall(refuses, big, "more than the 100000 this qgru reads")
    serialize.MAX_STATE_BYTES = saved
    assert(ok, err)
    os.remove(big)
  end)

  it("an rng entry that is not i64 [4] is refused before qg_rng_set_state sees it", function()
    for _, bad in ipairs({ { { 2 }, "i64" }, { { 4 }, "f32" }, { { 4, 1 }, "i64" }, { { 8 }, "i32" }, { { 1 }, "u8" } }) do
      local p = rewrite(ckpt, function(t) t.rng = Tensor.new(bad[1], bad[2]):fill(7) end)
      refuses(p, "rng: expected i64 [4], got " .. bad[2] .. " " .. Tensor.shape_str(bad[1]))
      os.remove(p)
    end
    local p = rewrite(ckpt, function(t) t.rng = nil end)
    refuses(p, "has no rng entry")
    os.remove(p)
  end)

  it("an all-zero RNG state is refused (on resume too)", function()
    local p = rewrite(ckpt, function(t) t.rng = Tensor.new({ 4 }, "i64") end)
    refuses(p, "rng: the state is all zero")
    refuses(p, "rng: the state is all zero", false, "resume")
    os.remove(p)
  end)

  it("resuming with another batch size changes nothing and says so", function()
    local model, opt, engine = setup(77)
    engine:train{ data = ds, batch_size = 16, epochs = 1, seed = 9, max_steps = 1 }
    local before = snapshot(model, opt)
    assert.raises_match(function()
      engine:train{ data = ds, batch_size = 8, epochs = 2, seed = 4, resume = ckpt, options = { lr = 0.01, tag = "a" } }
    end, "batch_size: checkpoint 16, now 8")
    assert.are.same(before, snapshot(model, opt))
  end)

  it("resuming with other options names the options that differ and changes nothing", function()
    local model, opt, engine = setup(77)
    local before = snapshot(model, opt)
    local ok, err = pcall(function()
      engine:train{ data = ds, batch_size = 16, epochs = 2, seed = 4, resume = ckpt, options = { lr = 0.02, tag = "a", extra = true } }
    end)
    assert.is_false(ok)
    assert.is_truthy(err:find("option lr: checkpoint 0.01, now 0.02", 1, true))
    assert.is_truthy(err:find("option extra: checkpoint nil, now true", 1, true))
    assert.is_nil(err:find("option tag", 1, true))
    assert.are.same(before, snapshot(model, opt))
    -- checkResume answers the same question without training
    assert.raises_match(function() engine:checkResume{ resume = ckpt, batch_size = 16, seed = 5, options = { lr = 0.01, tag = "a" } } end,
                        "seed: checkpoint 4, now 5")
    assert.is_true(engine:checkResume{ resume = ckpt, batch_size = 16, seed = 4, options = { lr = 0.01, tag = "a", epochs = 9 } })
    assert.are.same(before, snapshot(model, opt))
  end)

  it("optimizer metadata without scalars, or with bad ones, is refused", function()
    local cases = {
      { '{"kind": "Adam"}', "qgru.optim.scalars: missing" },
      { '{"kind": "Adam", "scalars": {"t": -1, "lr": 0.01}}', "qgru.optim.scalars.t: expected an integer >= 0" },
      { '{"kind": "Adam", "scalars": {"t": 3, "lr": "fast"}}', "qgru.optim.scalars.lr: expected a finite number >= 0, got a string" },
      { '{"kind": 5, "scalars": {"t": 3, "lr": 0.1}}', "qgru.optim.kind: expected a string" },
      { '[1, 2]', "qgru.optim" },
      { 'null', "holds no optimizer state" },
    }
    for _, c in ipairs(cases) do
      local p = rewrite(ckpt, function(_, meta) meta["qgru.optim"] = c[1] end)
      refuses(p, c[2])
      os.remove(p)
    end
  end)

  it("optimizer tensors of the wrong dtype or shape, missing ones and unknown entries are refused", function()
    local name = "optim.exp_avg.1.W_l0"
    local t0 = serialize.load(ckpt)
    if not t0[name] then for n in pairs(t0) do if n:match("^optim%.exp_avg%.") then name = n; break end end end
    local shape = t0[name]:shape()
    local p = rewrite(ckpt, function(t) t[name] = Tensor.new(shape, "f64") end)
    refuses(p, "optimizer tensor " .. name .. ": file has f64")
    os.remove(p)
    p = rewrite(ckpt, function(t) t[name] = nil end)
    refuses(p, "optimizer tensor " .. name .. " is missing")
    os.remove(p)
    p = rewrite(ckpt, function(t) t["model.stowaway"] = Tensor.new({ 3 }) end)
    refuses(p, "unexpected entry 'model.stowaway'")
    os.remove(p)
  end)

  it("a state with wrong types is refused", function()
    for _, c in ipairs({ { '{"epoch": "2"}', "qgru.state.epoch: expected a positive integer, got a string" },
                         { '{"batch_size": 0}', "qgru.state.batch_size: expected a positive integer" },
                         { '{"losses": [1, "x"]}', "qgru.state.losses[2]: expected a number" },
                         { '"just a string"', "qgru.state: expected an object" } }) do
      local p = rewrite(ckpt, function(_, meta) meta["qgru.state"] = c[1] end)
      refuses(p, c[2])
      os.remove(p)
    end
  end)

  it("NaN and Inf weights are reported by parameter name when loaded", function()
    local p = rewrite(ckpt, function(t)
      for n, x in pairs(t) do
        if n:match("^model%..*bias") or n == "model.3.bias" then x:ptr()[0] = 0 / 0 end
      end
      local w = t["model.3.weight"]
      w:ptr()[1] = math.huge
      w:ptr()[2] = -math.huge
    end)
    local warned = {}
    local saved = serialize.warn
    serialize.warn = function(m) warned[#warned + 1] = m end
    local model, opt = setup(77)
    local ok, err = pcall(serialize.loadCheckpoint, p, model, opt)
    serialize.warn = saved
    assert(ok, err)
    local all = table.concat(warned, "\n")
    assert.is_truthy(all:find("3.weight has 2 non-finite values (first at element 2)", 1, true))
    assert.is_truthy(all:find("3.bias has 1 non-finite value (first at element 1)", 1, true))
    -- the same through qgru.load of a weights file
    local wp = U.tmpname(".safetensors")
    qgru.save(model, wp)
    warned = {}
    serialize.warn = function(m) warned[#warned + 1] = m end
    local _, list = qgru.load(setup(5), wp)
    serialize.warn = saved
    assert.are.equal(2, #list)
    assert.is_truthy(table.concat(warned, "\n"):find(wp .. ": 3.weight has 2 non-finite values", 1, true))
    os.remove(p); os.remove(wp)
  end)

  it("the training NaN guard names the loss and the parameters holding NaN", function()
    local model, _, engine = setup(3)
    model:namedParameters()[1].param:ptr()[0] = 0 / 0
    local ok, err = pcall(function() engine:train{ data = ds, batch_size = 16, epochs = 1, seed = 1 } end)
    assert.is_false(ok)
    assert.is_truthy(err:find("non-finite loss (", 1, true))
    assert.is_truthy(err:find("parameters with non-finite values: " .. model:namedParameters()[1].name .. " (1)", 1, true))
  end)
end)

describe("quantized checkpoints", function()
  local ckpt
  before_each(function() ckpt = ckpt or make_checkpoint(true) end)

  it("resume restores weights, optimizer and quantizers together", function()
    local model, opt = setup(77, true)
    quant.get(model, "1.l0.fwd.input.x"):set(3, 1)
    serialize.loadCheckpoint(ckpt, model, opt)
    local ref = setup(11, true)
    assert.are.equal(quant.get(ref, "1.l0.fwd.input.x"):get(), quant.get(model, "1.l0.fwd.input.x"):get())
    assert.are.equal(5, opt.t)
  end)

  -- A bad quantizer entry: the load fails before weights, moments or quantizers are replaced.
  local function bad_quant(edit, pattern)
    local p = rewrite(ckpt, function(_, meta)
      local st = json.decode(meta["qgru.state"])
      edit(st.quant[1].layers[1])
      meta["qgru.state"] = json.encode(st)
    end)
    refuses(p, pattern, true)
    refuses(p, pattern, true, "resume")
    os.remove(p)
  end

  it("a bad quantizer entry changes nothing (weights, moments, quantizers)", function()
    bad_quant(function(l) l["op.rRh"].bitwidth = "8" end, "l0.fwd.op.rRh.bitwidth: expected an integer 1..32, got a string")
    bad_quant(function(l) l["op.rRh"].bitwidth = 2.5 end, "l0.fwd.op.rRh.bitwidth: expected an integer 1..32, got the number 2.5")
    bad_quant(function(l) l["op.rRh"].z = 1000 end, "l0.fwd.op.rRh.zero_point: 1000 is outside the 6-bit grid [-32, 31]")
    bad_quant(function(l) l["op.rRh"].e = 40 end, "l0.fwd.op.rRh.exp2_inv: exponent out of range")
    bad_quant(function(l) l["weight.W"].z[1] = 3 end, "l0.fwd.weight.W.zero_point[0]: a symmetric quantizer has zero_point 0, got 3")
    bad_quant(function(l) table.remove(l["weight.R"].e) end, "l0.fwd.weight.R.exp2_inv: expected 18 value(s), got 17")
    bad_quant(function(l) l["gate.z_out"] = nil end, "l0.fwd.gate.z_out: missing")
    bad_quant(function(l) l["op.bogus"] = l["op.rRh"] end, "unknown operator op.bogus")
    bad_quant(function(l) l["op.rRh"].frozen = "yes" end, "l0.fwd.op.rRh.frozen: expected true or false")
  end)
end)
