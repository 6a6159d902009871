-- quant_config_spec.lua: bitwidth configs (the seed's three examples as written, the presets,
-- aliases, disable_quantization), bad configs (clear error naming file and JSON path; the model
-- unchanged), setBitwidth, printing, export -> import -> bit-identical outputs, and the AIMET
-- encodings file.
local qgru = require("qgru")
local U = require("testutil")
local nn, quant, json = qgru.nn, qgru.quant, qgru.json

local function model(seed)
  qgru.seed(seed or 1)
  return nn.Sequential():add(nn.GRU(4, 5, { bidirectional = true })):add(nn.Last()):add(nn.Linear(10, 3))
end

local function calib_data(seed)
  qgru.seed(seed or 2)
  return { qgru.zeros({ 6, 3, 4 }):uniform(-1, 1), qgru.zeros({ 6, 3, 4 }):uniform(-1, 1) }
end

describe("bitwidth configs", function()
  it("loads the seed's three examples as written", function()
    local full = quant.config("config/seed_example1_full.json")
    assert.are.same({ 8, false, true }, { full.ops["gate.z_out"].bitwidth, full.ops["gate.z_out"].is_symmetric, full.ops["gate.z_out"].is_unsigned })
    assert.is_false(full.disable_quantization)
    local minimal = quant.config("config/seed_example2_minimal.json")
    assert.are.same({ 8, false, false }, { minimal.ops["input.x"].bitwidth, minimal.ops["input.x"].is_symmetric, minimal.ops["input.x"].is_unsigned })
    assert.are.same({ 8, true }, { minimal.ops["weight.W"].bitwidth, minimal.ops["weight.W"].is_symmetric })
    local mixed = quant.config("config/seed_example3_mixed.json")
    assert.are.same({ 16, 16, 8, 8 }, { mixed.ops["weight.W"].bitwidth, mixed.ops["matmul.Rh"].bitwidth, mixed.ops["gate.z_pre"].bitwidth, mixed.ops["gate.r_out"].bitwidth })
    assert.are.equal("W16 A8 (mixed)", quant.describeConfig(mixed))
  end)
  it("loads the presets", function()
    assert.are.equal("W8 A8", quant.describeConfig(quant.config("config/int8.json")))
    assert.are.equal("W16 A16", quant.describeConfig(quant.config("config/int16.json")))
    assert.are.equal("W4 A8", quant.describeConfig(quant.config("config/w4a8.json")))
    assert.are.equal("W4 A8", quant.describeConfig(quant.uniform(8, { weight_bits = 4 })))
  end)
  it("accepts the aliases weight.bx and input.h, and disable_quantization", function()
    local cfg = quant.fromTable(json.decode([[{"GRU_config": {"default_config": {"disable_quantization": true},
      "operator_config": {"weight.bx": {"bitwidth": 6, "is_symmetric": true}, "input.h": {"bitwidth": 12, "is_symmetric": false}}}}]]), "t.json")
    assert.are.equal(6, cfg.ops["weight.bw"].bitwidth)
    assert.are.equal(12, cfg.ops["output.h"].bitwidth)
    assert.is_true(cfg.disable_quantization)
    -- disabled: the model runs the float GRU
    local m = model()
    local x = calib_data()[1]
    local float = m:forward(x):totable()
    quant.prepare(m, cfg)
    assert.are.same(float, m:forward(x):totable())
  end)
  it("pins a quantizer with exp2_inv / zero_point", function()
    local cfg = quant.fromTable(json.decode([[{"GRU_config": {"operator_config": {"op.rRh": {"bitwidth": 8, "is_symmetric": false, "exp2_inv": 5, "zero_point": -3}}}}]]), "p.json")
    local m = model()
    quant.prepare(m, cfg)
    quant.calibrate(m, calib_data())
    local q = quant.get(m, "1.l0.bwd.op.rRh")
    assert.are.same({ 5, -3, true }, { q.e, q.z, q.pinned })
  end)
end)

describe("bad configs: clear errors naming file and JSON path; the model is unchanged", function()
  local function write(text)
    local p = U.tmpname(".json")
    U.write_bytes(p, text)
    return p
  end
  local cases = {
    { [[{"GRU_config": {"operator_config": {"gate.zz_out": {"bitwidth": 8}}}}]], "GRU_config.operator_config[\"gate.zz_out\"]: unknown operator \"gate.zz_out\"" },
    { [[{"GRU_config": {"operator_config": {"gate.z_out": {"bitwidth": 0}}}}]], "GRU_config.operator_config[\"gate.z_out\"].bitwidth: must be 1..32, got 0" },
    { [[{"GRU_config": {"operator_config": {"input.x": {"bitwidth": 33}}}}]], ".bitwidth: must be 1..32, got 33" },
    { [[{"GRU_config": {"operator_config": {"input.x": {"bitwidth": "8"}}}}]], ".bitwidth: expected an integer, got a string" },
    { [[{"GRU_config": {"operator_config": {"input.x": {"bitwidth": 8, "is_symmetric": 1}}}}]], ".is_symmetric: expected true or false, got the number 1" },
    { [[{"GRU_config": {"operator_config": {"input.x": {"bitwidth": 8, "exp2_inv": 40, "zero_point": 0}}}}]], ".exp2_inv: exponent out of range: must be -31..31, got 40" },
    { [[{"GRU_config": {"default_config": {"disable_quantization": "no"}}}]], "GRU_config.default_config.disable_quantization: expected true or false" },
    { [[{"GRU_config": {"operator_config": [1, 2]}}]], "GRU_config.operator_config: expected an object, got an array" },
    { [[{"GRU": {}}]], "unknown key \"GRU\"" },
    { "{\n  \"GRU_config\": {\n    \"operator_config\": {\n      \"input.x\": {\"bitwidth\": 8,}\n    }\n  }\n}", "malformed JSON at line 4, column" },
  }
  for _, c in ipairs(cases) do
    it(c[2], function()
      local p = write(c[1])
      local m = model()
      quant.prepare(m, quant.uniform(8))
      quant.calibrate(m, calib_data(), { method = "minmax", passes = 1 })
      local x = calib_data(5)[1]
      local before = m:forward(x):totable()
      local ok, err = pcall(function() quant.prepare(m, quant.config(p)) end)
      assert.is_false(ok)
      assert.is_truthy(tostring(err):find(p, 1, true), "message names the file: " .. tostring(err))
      assert.is_truthy(tostring(err):find(c[2], 1, true), "expected '" .. c[2] .. "' in: " .. tostring(err))
      assert.are.same(before, m:forward(x):totable())
      os.remove(p)
    end)
  end
  it("an unreadable file", function()
    assert.raises_match(function() quant.config("/no/such/config.json") end, "cannot read '/no/such/config.json'")
  end)
  it("a zero point outside the grid", function()
    local p = write([[{"GRU_config": {"operator_config": {"op.rRh": {"bitwidth": 4, "is_symmetric": false, "exp2_inv": 2, "zero_point": 9}}}}]])
    assert.raises_match(function() quant.config(p) end, "zero_point: 9 is outside the 4-bit grid [-8, 7]")
    os.remove(p)
  end)
end)

describe("quantizers", function()
  it("are listed and read by name, and print each layer's state", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    local names = {}
    for _, e in ipairs(quant.quantizers(m)) do names[#names + 1] = e.name end
    assert.are.equal(34, #names)   -- 17 operators x 2 directions
    assert.are.equal("1.l0.fwd.input.x", names[1])
    assert.are.equal("1.l0.bwd.op.new_contrib", names[34])
    assert.is_truthy(tostring(m):find("l0.bwd: W8 A8, needs calibration", 1, true))
    quant.calibrate(m, calib_data())
    assert.is_truthy(tostring(m):find("l0.fwd: W8 A8, ready (10 calibrated, 3 fixed of 13 activation quantizers)", 1, true))
    assert.raises_match(function() quant.get(m, "1.l0.fwd.gate.q_out") end, "no quantizer named '1.l0.fwd.gate.q_out'")
  end)
  it("an uncalibrated model refuses to run quantized", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    assert.raises_match(function() m:forward(calib_data()[1]) end, "is not calibrated: run quant.calibrate")
  end)
  it("setBitwidth keeps the real range: e grows by n - b, z scales", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    quant.calibrate(m, calib_data())
    local q = quant.get(m, "1.l0.fwd.matmul.Wx")
    q:set(5, -20)
    q:setBitwidth(10)
    assert.are.same({ 10, 7, -80 }, { q.bitwidth, q.e, q.z })
    q:setBitwidth(6)
    assert.are.same({ 6, 3, -5 }, { q.bitwidth, q.e, q.z })   -- -80 / 16 = -5
    local w = quant.get(m, "1.l0.fwd.weight.W")
    local e0 = w:get()
    w:setBitwidth(4)
    local e1 = w:get()
    for i = 1, #e0 do assert.are.equal(e0[i] - 4, e1[i]) end
    -- the export reflects the change
    local p = U.tmpname(".json")
    quant.export(m, p)
    local doc = json.read(p)
    local ops = doc.modules[1].layers_params[1].operators
    assert.are.same({ 6, 3, -5 }, { ops["matmul.Wx"].bitwidth, ops["matmul.Wx"].exp2_inv, ops["matmul.Wx"].zero_point })
    os.remove(p)
  end)
end)

describe("export and import", function()
  it("export -> import in a fresh model -> bit-identical outputs", function()
    local m = model(7)
    quant.prepare(m, quant.uniform(8, { weight_bits = 4 }))
    quant.calibrate(m, calib_data(), { method = "histogram", passes = 2 })
    local wp, qp = U.tmpname(".safetensors"), U.tmpname(".json")
    qgru.save(m, wp)
    quant.export(m, qp)
    local fresh = model(99)
    qgru.load(fresh, wp)
    quant.prepare(fresh, quant.uniform(8))      -- other bitwidths: the file must restore them
    quant.load(fresh, qp)
    m:evaluate(); fresh:evaluate()
    local x = calib_data(11)[1]
    assert.are.same(m:forward(x):totable(), fresh:forward(x):totable())
    assert.are.equal(4, quant.get(fresh, "1.l0.fwd.weight.R").bitwidth)
    -- and the restored file is identical
    local qp2 = U.tmpname(".json")
    quant.export(fresh, qp2)
    local a, b = json.read(qp), json.read(qp2)
    for _, d in ipairs({ a, b }) do d.modules[1].config_source = nil end
    for _, d in ipairs({ a, b }) do
      for _, l in ipairs(d.modules[1].layers_params) do for _, o in pairs(l.operators) do o.method = nil; o.range = nil end end
    end
    assert.are.same(a, b)
    os.remove(wp); os.remove(qp); os.remove(qp2)
  end)
  it("writes the documented qgru-qparams fields", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    quant.calibrate(m, calib_data())
    local p = U.tmpname(".json")
    quant.export(m, p)
    local d = json.read(p)
    assert.are.same({ "qgru-qparams", 1, "half_to_even" }, { d.format, d.version, d.rounding })
    local mod = d.modules[1]
    assert.are.same({ 4, 5, 1, 2 }, { mod.input_size, mod.hidden_size, mod.layers, mod.directions })
    local x = mod.layers_params[1].operators["input.x"]
    assert.are.equal(2 ^ -x.exp2_inv, x.scale)
    assert.are.equal("histogram", x.method)
    assert.are.equal(15, #mod.layers_params[1].operators["weight.W"].exp2_inv)
    os.remove(p)
  end)
  it("AIMET encodings 1.0.0: fields and offset sign", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    quant.calibrate(m, calib_data())
    local q = quant.get(m, "1.l0.fwd.matmul.Wx")
    q:set(4, -7)
    local p = U.tmpname(".json")
    quant.export(m, p, { format = "aimet" })
    local d = json.read(p)
    assert.are.equal("1.0.0", d.version)
    assert.are.equal(26, #d.activation_encodings)
    assert.are.equal(8, #d.param_encodings)
    local wx, zout, w
    for _, e in ipairs(d.activation_encodings) do
      if e.name == "1.l0.fwd.matmul.Wx" then wx = e end
      if e.name == "1.l0.fwd.gate.z_out" then zout = e end
    end
    for _, e in ipairs(d.param_encodings) do if e.name == "1.l0.fwd.weight.W" then w = e end end
    assert.are.same({ "PER_TENSOR", "INT", 8, false }, { wx.enc_type, wx.dtype, wx.bw, wx.is_sym })
    assert.are.same({ 2 ^ -4 }, wx.scale)
    assert.are.same({ -(-7 + 128) }, wx.offset)       -- signed grid: offset = -(z + 2^(b-1))
    assert.are.same({ 0 }, zout.offset)               -- unsigned grid: offset = -z
    assert.are.same({ "PER_CHANNEL", true }, { w.enc_type, w.is_sym })
    assert.are.equal(15, #w.scale)
    assert.are.equal(-128, w.offset[1])               -- symmetric signed: -(0 + 128)
    os.remove(p)
  end)
  it("integer weight codes as safetensors", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    quant.calibrate(m, calib_data())
    local p = U.tmpname(".safetensors")
    quant.exportWeights(m, p)
    local t = qgru.serialize.load(p)
    local W = t["1.l0.fwd.W"]
    assert.are.equal("i8", W:dtype())
    local e = t["1.l0.fwd.W.exp2_inv"]:totable()
    local w = m.modules[1].weights[0][0].W:totable()
    -- code = rne(w * 2^e) (symmetric: z = 0), checked on a few entries
    for j = 1, 3 do
      for k = 1, 4 do
        local v = w[j][k] * 2 ^ e[j]
        assert.is_true(math.abs(W:get(j, k) - v) <= 0.5)
      end
    end
    os.remove(p)
  end)
  it("import rejects a file of another model shape, leaving the model unchanged", function()
    local m = model()
    quant.prepare(m, quant.uniform(8))
    quant.calibrate(m, calib_data())
    local p = U.tmpname(".json")
    quant.export(m, p)
    qgru.seed(1)
    local other = nn.Sequential():add(nn.GRU(4, 6, { bidirectional = true })):add(nn.Last()):add(nn.Linear(12, 3))
    quant.prepare(other, quant.uniform(8))
    assert.raises_match(function() quant.load(other, p) end, "hidden_size: the file has 5, the model has 6")
    assert.is_false(quant.get(other, "1.l0.fwd.input.x").calibrated)
    local doc = json.read(p)
    doc.modules[1].layers_params[2].operators["op.rRh"].exp2_inv = 99
    json.write(p, doc)
    local m2 = model()
    quant.prepare(m2, quant.uniform(8))
    assert.raises_match(function() quant.load(m2, p) end, "exponent out of range")
    assert.is_false(quant.get(m2, "1.l0.fwd.input.x").calibrated)   -- layer 1 was valid, but nothing was applied
    os.remove(p)
  end)
end)
