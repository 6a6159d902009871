-- cuda_qat_spec.lua: quantization-aware training through the modules on the GPU against the same
-- work on the CPU (the reference): a 2-layer bidirectional quantized GRU + Last + Linear with 6-bit
-- weights and 8-bit operators, built from the same seed on both devices.
--  * calibration on the GPU gives the CPU's quantization parameters (the exported qparams files
--    are equal, every exponent and zero point);
--  * the quantized forward is bit-identical (the GRU's outputs are dequantized integer codes, so
--    equal bits); the Linear head agrees to 1e-5 (fp32 GEMMs, another summation order);
--  * a few Adam steps of QAT give the CPU's losses within 1e-4 relative, and the same run twice on
--    the GPU gives the same bits;
--  * the qparams exported from the GPU-trained model, loaded into a CPU model with the GPU-trained
--    weights, give the GPU's integer outputs bit for bit.
-- Tagged gpu; skipped with a clear line where there is no CUDA device.
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local U = require("testutil")
local nn, optim, quant = qgru.nn, qgru.optim, qgru.quant
local ffi, lib = clib.ffi, clib.lib

local T, N, C, H = 9, 5, 6, 7

local function host(t) return t:device() == "cpu" and t or t:to("cpu") end
local function bytes(t)
  local x = host(t)
  return ffi.string(x:ptr(), x:numel() * lib.qg_dtype_size(clib.dtypes[x:dtype()]))
end
local function read(path)
  local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s
end

-- The model on device dev, calibrated on the same data; x, target and calibration data are made
-- on the cpu from a fixed seed and moved.
local function build(dev)
  qgru.seed(11)
  local model = nn.Sequential()
    :add(nn.GRU(C, H, { layers = 2, bidirectional = true, device = "cpu" }))
    :add(nn.Last())
    :add(nn.Linear(2 * H, 3, { device = "cpu" }))
  quant.prepare(model, quant.uniform(8, { weight_bits = 6 }))
  model:to(dev)
  qgru.seed(12)
  local calib = {}
  -- host inputs for a model on either device (quant.calibrate moves each batch)
  for i = 1, 2 do calib[i] = qgru.zeros({ T, N, C }, "f32", "cpu"):uniform(-1, 1) end
  quant.calibrate(model, calib, { method = "histogram", passes = 2 })
  return model
end

local function data(dev)
  qgru.seed(13)
  local x = qgru.zeros({ T, N, C }, "f32", "cpu"):uniform(-1.2, 1.2)
  local target = qgru.tensor({ 0, 2, 1, 1, 0 }, "i64", "cpu")
  return x:to(dev), target:to(dev)
end

-- Losses of `steps` Adam steps of QAT, and the model.
local function train_steps(dev, steps)
  local model = build(dev)
  local crit = nn.CrossEntropy()
  local opt = optim.Adam(model, { lr = 5e-3, clip = 1.0 })
  local x, target = data(dev)
  local losses = {}
  model:training()
  for s = 1, steps do
    model:zeroGrad()
    local out = model:forward(x)
    losses[s] = crit:forward(out, target)
    model:backward(x, crit:backward(out, target))
    opt:step()
  end
  return losses, model
end

-- Trains on dev, exports qparams and weights right after an optimizer step (the tracked weight
-- quantizers must describe the current weights, not those of the last forward), loads both into
-- a fresh CPU model and compares the integer GRU outputs bit for bit.
local function exported_replay(dev)
  local dir = U.tmpname("_qat_export_" .. dev)
  qgru.mkdir(dir)
  local _, trained = train_steps(dev, 3)
  quant.export(trained, dir .. "/qparams.json")
  qgru.save(trained, dir .. "/model.safetensors")
  qgru.seed(99)
  local cpu = nn.Sequential()
    :add(nn.GRU(C, H, { layers = 2, bidirectional = true, device = "cpu" }))
    :add(nn.Last())
    :add(nn.Linear(2 * H, 3, { device = "cpu" }))
  qgru.load(cpu, dir .. "/model.safetensors")
  quant.prepare(cpu, quant.uniform(8))
  quant.load(cpu, dir .. "/qparams.json")
  trained:evaluate(); cpu:evaluate()
  trained:forward((data(dev)))
  cpu:forward((data("cpu")))
  assert.are.equal(bytes(trained.modules[1].output), bytes(cpu.modules[1].output))
end

describe("QAT export after an optimizer step (cpu)", function()
  it("describes the current weights: a fresh model loading it gives the trained model's integer outputs", function()
    exported_replay("cpu")
  end)
end)

describe("QAT through the modules on CUDA vs the CPU #gpu", function()
  if skip_without_cuda(pending) then return end

  it("calibration gives the CPU's exponents and zero points", function()
    local dir = U.tmpname("_cuda_qat")
    qgru.mkdir(dir)
    local cpu, gpu = build("cpu"), build("cuda")
    quant.export(cpu, dir .. "/cpu.json")
    quant.export(gpu, dir .. "/gpu.json")
    assert.are.equal(read(dir .. "/cpu.json"), read(dir .. "/gpu.json"))
  end)

  it("the quantized forward is bit-identical in the GRU and within 1e-5 after the Linear", function()
    local cpu, gpu = build("cpu"), build("cuda")
    cpu:evaluate(); gpu:evaluate()
    local xc = data("cpu")
    local xg = data("cuda")
    local oc, og = cpu:forward(xc), gpu:forward(xg)
    assert.are.equal(bytes(cpu.modules[1].output), bytes(gpu.modules[1].output))
    local err = U.rel_err(U.flatten(oc:totable()), U.flatten(host(og):totable()))
    assert.is_true(err < 1e-5, "logits rel err " .. err)
  end)

  it("QAT steps follow the CPU's losses and repeat bit for bit", function()
    local lc = train_steps("cpu", 4)
    local lg1, g1 = train_steps("cuda", 4)
    local lg2, g2 = train_steps("cuda", 4)
    for s = 1, #lc do
      assert.is_true(math.abs(lg1[s] - lc[s]) <= 1e-4 * math.abs(lc[s]), string.format("step %d: gpu %.9g cpu %.9g", s, lg1[s], lc[s]))
      assert.are.equal(lg1[s], lg2[s], "step " .. s .. " differs between two GPU runs")
    end
    for i, e in ipairs(g1:namedParameters()) do
      assert.are.equal(bytes(e.param), bytes(g2:namedParameters()[i].param), e.name)
    end
  end)

  it("qparams exported from a GPU-trained model give the GPU's integer outputs on the CPU", function()
    exported_replay("cuda")
  end)
end)

-- Tracked weight quantizers on the GPU: qg_int_gru_calibrate_weight derives symmetric minmax
-- (e, z) on the device (no host synchronisation) and the host tensors are pulled when read.
-- Each value is checked against the CPU's qg_calibrate_channels on the same weights (the host
-- path, computed independently of the device's).
describe("tracked weight quantizers derived on CUDA #gpu", function()
  if skip_without_cuda(pending) then return end
  local cpu_ctx = clib.context("cpu")
  local FIELD = { "W", "R", "bx", "br" }

  -- (e, z) lists of the CPU's per-channel minmax on weight w (any device), for quantizer q's kind.
  local function cpu_minmax(w, bits, sym, uns)
    local h = host(w)
    local rows = h:size(1)
    local e, z = qgru.zeros({ rows }, "i32", "cpu"), qgru.zeros({ rows }, "i32", "cpu")
    clib.check(cpu_ctx, lib.qg_calibrate_channels(cpu_ctx, e.t, z.t, h.t, bits, sym and 1 or 0, uns and 1 or 0,
                                                  lib.QG_CALIB_MINMAX, 99.99))
    return e:totable(), z:totable()
  end

  -- Every weight quantizer of every GRU layer of model equals the CPU's from the current weights.
  local function check_all(model, what)
    local gru = model.modules[1]
    local n = 0
    for lq in gru.qstate:each() do
      for i, q in ipairs(lq.w) do
        local es, zs = q:get()
        local we, wz = cpu_minmax(gru.weights[lq.l][lq.d][FIELD[i]], q.bitwidth, q.is_symmetric, q.is_unsigned)
        assert.are.same(we, es, what .. ": " .. q.name .. " exponents")
        assert.are.same(wz, zs, what .. ": " .. q.name .. " zero points")
        n = n + 1
      end
    end
    assert.are.equal(16, n)
  end

  it("a CUDA layer's exponents and zero points equal the CPU's: special rows, bitwidths 1..32, signed and unsigned", function()
    local C, H = 5, 4
    local out = ffi.new("qg_int_gru*[1]")
    local gctx = clib.context("cuda")
    clib.check(gctx, lib.qg_int_gru_create(gctx, out, C, H))
    local g = ffi.gc(out[0], lib.qg_int_gru_free)
    qgru.seed(21)
    local W = qgru.zeros({ 3 * H, C }, "f32", "cpu"):uniform(-3, 3)
    for c = 1, C do W:set(1, c, 0) end                                  -- all zeros: degenerate
    for c = 1, C do W:set(2, c, 0 / 0) end                              -- all NaN: degenerate
    W:set(3, 2, 0 / 0)                                                  -- NaN ignored
    W:set(4, 3, 1 / 0)                                                  -- +inf: e = -31
    for c = 1, C do W:set(5, c, 1e-40) end; W:set(5, 1, -1.4e-45)      -- denormals: e = 31
    for c = 1, C do W:set(6, c, 0.001) end                              -- small
    for c = 1, C do W:set(7, c, 4e5) end                                -- large
    local bx = qgru.zeros({ 3 * H }, "f32", "cpu"):uniform(-1, 1)
    bx:set(1, 0); bx:set(2, 1e-30); bx:set(3, -2e9)
    local e, z = qgru.zeros({ 3 * H }, "i32", "cpu"), qgru.zeros({ 3 * H }, "i32", "cpu")
    for _, bits in ipairs({ 1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 31, 32 }) do
      for _, uns in ipairs({ false, true }) do
        local Wb = W:clone()
        -- a row whose max is exactly qmax 2^-k: the ratio is a power of two (log2 exact)
        local _, hi = require("qgru.quant.quantizer").grid(bits, uns)
        for c = 1, C do Wb:set(8, c, (hi > 0 and hi or 1) * 2 ^ -(c + 3)) end
        local Wg, bg = Wb:to("cuda"), bx:to("cuda")
        clib.check(gctx, lib.qg_int_gru_calibrate_weight(gctx, g, lib.QG_W_W, Wg.t, bits, 1, uns and 1 or 0, lib.QG_CALIB_MINMAX, 99.99))
        clib.check(gctx, lib.qg_int_gru_calibrate_weight(gctx, g, lib.QG_W_BX, bg.t, bits, 1, uns and 1 or 0, lib.QG_CALIB_MINMAX, 99.99))
        local tag = string.format("%s%d", uns and "u" or "i", bits)
        local we, wz = cpu_minmax(Wb, bits, true, uns)
        clib.check(gctx, lib.qg_int_gru_weight_quant(gctx, g, lib.QG_W_W, e.t, z.t))
        assert.are.same(we, e:totable(), tag .. " W exponents")
        assert.are.same(wz, z:totable(), tag .. " W zero points")
        local be, bz = cpu_minmax(bx, bits, true, uns)
        clib.check(gctx, lib.qg_int_gru_weight_quant(gctx, g, lib.QG_W_BX, e.t, z.t))
        assert.are.same(be, e:totable(), tag .. " bx exponents")
        assert.are.same(bz, z:totable(), tag .. " bx zero points")
      end
    end
    -- asymmetric and the other methods go through the host: the same answers
    local Wg = W:to("cuda")
    for _, m in ipairs({ lib.QG_CALIB_MINMAX, lib.QG_CALIB_HISTOGRAM, lib.QG_CALIB_PERCENTILE }) do
      clib.check(gctx, lib.qg_int_gru_calibrate_weight(gctx, g, lib.QG_W_W, Wg.t, 8, 0, 0, m, 99.9))
      local we, wz = qgru.zeros({ 3 * H }, "i32", "cpu"), qgru.zeros({ 3 * H }, "i32", "cpu")
      clib.check(cpu_ctx, lib.qg_calibrate_channels(cpu_ctx, we.t, wz.t, W.t, 8, 0, 0, m, 99.9))
      clib.check(gctx, lib.qg_int_gru_weight_quant(gctx, g, lib.QG_W_W, e.t, z.t))
      assert.are.same(we:totable(), e:totable(), "asymmetric method " .. m)
      assert.are.same(wz:totable(), z:totable(), "asymmetric method " .. m)
    end
  end)

  it("after QAT steps every weight quantizer equals the CPU's from the same weights, and reads follow the last forward", function()
    local _, m = train_steps("cuda", 3)
    local x = data("cuda")
    m:forward(x)   -- the optimizer moved the weights: this forward derives them again
    check_all(m, "after 3 QAT steps and a forward")
    -- a weight grows 8x on the device: the next forward's exponents drop by 3, and reading shows it
    local q = quant.get(m, "l0.fwd.weight.W")
    local before = q:get()
    m.modules[1].weights[0][0].W:mul(8)
    m:evaluate()
    m:forward(x)
    local after = q:get()
    for j = 1, #before do assert.are.equal(before[j] - 3, after[j], "channel " .. j) end
    check_all(m, "after an inference forward")
    -- q.exps after q:sync() (what the library's readers do) is the same
    q:sync()
    assert.are.same(after, q.exps:totable())
  end)

  it("a GPU-trained model exports what it exports after moving to the CPU", function()
    local dir = U.tmpname("_cuda_wq")
    qgru.mkdir(dir)
    local _, m = train_steps("cuda", 3)
    quant.export(m, dir .. "/gpu.json")
    quant.exportWeights(m, dir .. "/gpu.safetensors")
    m:to("cpu")
    quant.export(m, dir .. "/cpu.json")
    quant.exportWeights(m, dir .. "/cpu.safetensors")
    assert.are.equal(read(dir .. "/gpu.json"), read(dir .. "/cpu.json"))
    assert.are.equal(read(dir .. "/gpu.safetensors"), read(dir .. "/cpu.safetensors"))
  end)

  it("a tiny bias (a unit outside the 32-bit cell) with device-derived exponents: the CPU's outputs, tracked and frozen", function()
    local cpu, gpu = build("cpu"), build("cuda")
    for _, model in ipairs({ cpu, gpu }) do
      local bx = model.modules[1].weights[0][0].bx
      local h = bx:to("cpu")
      h:set(2, 1e-9); h:set(5, -3e-10)
      bx:copy(h)
      model:evaluate()
    end
    local xc, xg = data("cpu"), data("cuda")
    cpu:forward(xc); gpu:forward(xg)
    assert.are.equal(bytes(cpu.modules[1].output), bytes(gpu.modules[1].output))
    check_all(gpu, "tiny bias")
    quant.freeze(gpu); quant.freeze(cpu)
    cpu:forward(xc); gpu:forward(xg)
    assert.are.equal(bytes(cpu.modules[1].output), bytes(gpu.modules[1].output))
  end)
end)
