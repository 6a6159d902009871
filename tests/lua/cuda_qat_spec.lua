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
  if not qgru.cudaAvailable() then
    it("skipped: no CUDA device (libqgru " .. (lib.qgru_has_cuda() == 1 and "has CUDA, no GPU visible" or "built without CUDA") .. ")", function()
      pending("no CUDA device")
    end)
    return
  end

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
