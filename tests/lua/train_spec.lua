-- train_spec.lua: reproducibility and resume. Same seed -> the same loss trajectory, bit for
-- bit; stopping, saving, loading into fresh objects and resuming gives the same losses as an
-- uninterrupted run; learning works (the adding problem's loss falls, a Fashion-MNIST subset is
-- learned well above chance).
local qgru = require("qgru")
local U = require("testutil")
local nn, optim, data, train = qgru.nn, qgru.optim, qgru.data, qgru.train

local function quiet() end

local function setup(seed, opt_kind)
  qgru.seed(seed)
  local model = nn.Sequential():add(nn.GRU(2, 8, { layers = 2, bidirectional = true })):add(nn.Last()):add(nn.Linear(16, 1))
  local opt = opt_kind == "sgd" and optim.SGD(model, { lr = 0.05, momentum = 0.9, clip = 1.0 })
    or optim.Adam(model, { lr = 1e-2, clip = 1.0 })
  return model, train.Engine{ model = model, criterion = nn.MSE(), optimizer = opt, log = quiet }
end

local ds = data.adding(96, 10, 5)

describe("training reproducibility", function()
  for _, kind in ipairs({ "adam", "sgd" }) do
    it("same seed gives an identical loss trajectory (" .. kind .. ")", function()
      local _, e1 = setup(7, kind)
      local s1 = e1:train{ data = ds, batch_size = 16, epochs = 2, seed = 3 }
      local _, e2 = setup(7, kind)
      local s2 = e2:train{ data = ds, batch_size = 16, epochs = 2, seed = 3 }
      assert.are.equal(12, #s1.losses)
      assert.are.same(s1.losses, s2.losses)          -- bit-identical doubles
      local _, e3 = setup(8, kind)
      local s3 = e3:train{ data = ds, batch_size = 16, epochs = 2, seed = 3 }
      assert.are_not.same(s1.losses, s3.losses)
    end)

    it("save -> load -> resume gives the losses of an uninterrupted run (" .. kind .. ")", function()
      local ckpt = U.tmpname(".safetensors")
      local _, full = setup(9, kind)
      local sf = full:train{ data = ds, batch_size = 16, epochs = 3, seed = 4 }
      -- stop in the middle of epoch 2 (step 8 of 18), with a checkpoint
      local _, part = setup(9, kind)
      local sp = part:train{ data = ds, batch_size = 16, epochs = 3, seed = 4, checkpoint = ckpt, max_steps = 8 }
      assert.are.equal(8, #sp.losses)
      -- fresh model and optimizer from another seed: everything must come from the checkpoint
      local _, resumed = setup(1234, kind)
      local sr = resumed:train{ data = ds, batch_size = 16, epochs = 3, seed = 4, resume = ckpt }
      assert.are.equal(18, #sr.losses)
      assert.are.same(sf.losses, sr.losses)
      os.remove(ckpt)
    end)
  end

  it("learns: the adding problem's MSE falls well below the mean predictor's (~0.167)", function()
    local _, e = setup(2, "adam")
    local st = e:train{ data = data.adding(512, 10, 9), batch_size = 32, epochs = 12, seed = 1 }
    local tail = 0
    for i = #st.losses - 9, #st.losses do tail = tail + st.losses[i] end
    assert.is_true(tail / 10 < 0.05, "final MSE " .. tail / 10)
  end)

  it("learns Fashion-MNIST from 2000 images well above chance", function()
    qgru.seed(1)
    local model = nn.Sequential():add(nn.GRU(28, 32)):add(nn.Last()):add(nn.Linear(32, 10))
    local e = train.Engine{ model = model, criterion = nn.CrossEntropy(), optimizer = optim.Adam(model, { lr = 3e-3 }), log = quiet }
    e:train{ data = data.fashionMNIST("train", { limit = 2000 }), batch_size = 50, epochs = 2, seed = 1 }
    local _, acc = e:evaluate(data.fashionMNIST("test", { limit = 1000 }), 250)
    assert.is_true(acc > 0.6, "accuracy " .. acc)
  end)

  it("stops on a non-finite loss with a clear message", function()
    local model, e = setup(3, "adam")
    model.modules[3].weight:fill(0 / 0)
    assert.raises_match(function() e:train{ data = ds, batch_size = 16, epochs = 1 } end, "non-finite loss (nan) at epoch 1, batch 1")
  end)

  it("rejects unknown hook names and options", function()
    local _, e = setup(3, "adam")
    assert.raises_match(function() e.hooks.onEpochEnd = function() end end, "unknown hook 'onEpochEnd'")
    e.hooks.onEndEpoch = function() end
    assert.raises_match(function() e:train{ data = ds, epoch = 2 } end, "unknown option 'epoch'")
  end)

  it("calls hooks in order", function()
    local _, e = setup(3, "adam")
    local seen = {}
    for _, h in ipairs({ "onStart", "onStartEpoch", "onUpdate", "onEndEpoch", "onEnd" }) do
      e.hooks[h] = function() if seen[#seen] ~= h then seen[#seen + 1] = h end end
    end
    e:train{ data = ds, batch_size = 48, epochs = 1 }
    assert.are.same({ "onStart", "onStartEpoch", "onUpdate", "onEndEpoch", "onEnd" }, seen)
  end)
end)

describe("QAT checkpoints", function()
  it("hold the quantizer state: resume into an uncalibrated model gives the uninterrupted losses", function()
    local quant = qgru.quant
    local function qsetup(calibrate)
      qgru.seed(5)
      local model = nn.Sequential():add(nn.GRU(2, 6)):add(nn.Last()):add(nn.Linear(6, 1))
      quant.prepare(model, quant.uniform(6))
      if calibrate then quant.calibrate(model, { ds.x:narrow(1, 16):transpose01() }, { method = "minmax", passes = 2 }) end
      local opt = optim.Adam(model, { lr = 1e-2 })
      return train.Engine{ model = model, criterion = nn.MSE(), optimizer = opt, log = quiet }
    end
    local ckpt = U.tmpname(".safetensors")
    local full = qsetup(true):train{ data = ds, batch_size = 16, epochs = 2, seed = 4 }
    qsetup(true):train{ data = ds, batch_size = 16, epochs = 2, seed = 4, checkpoint = ckpt, max_steps = 5 }
    local resumed = qsetup(false):train{ data = ds, batch_size = 16, epochs = 2, seed = 4, resume = ckpt }
    assert.are.equal(12, #resumed.losses)
    assert.are.same(full.losses, resumed.losses)
    os.remove(ckpt)
  end)
end)
