-- devices_spec.lua: devices end to end in Lua. Module:to(device) moves every tensor a model holds
-- (the parameter and gradient arenas, buffers and outputs with their views, the quantization
-- state) and back with values unchanged; the optimizer state follows; qgru.setDevice makes the
-- constructors build on that device, with the same values as on the cpu. The CUDA part is tagged
-- gpu and skipped with a clear line where there is no CUDA device; the cpu part runs everywhere.
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local nn, optim = qgru.nn, qgru.optim
local Tensor = qgru.Tensor

-- Every tensor reachable from obj through plain tables, modules and tensors' bases, with a path
-- ({path = tensor}); class instances other than modules and tensors (the quantization state) are
-- walked only when walk_objects is set, and never back into a module.
local function tensors_of(obj, walk_objects)
  local out, seen = {}, {}
  local function walk(v, path)
    if type(v) ~= "table" or seen[v] then return end
    seen[v] = true
    local mt = getmetatable(v)
    if mt == Tensor then
      out[path] = v
      if v._base then walk(v._base, path .. "._base") end
      return
    end
    local is_module = v.isInstanceOf and rawget(mt or {}, "__index") == mt and v:isInstanceOf(nn.Module)
    if mt ~= nil and not is_module and not (walk_objects and rawget(mt, "__index") == mt) then return end
    local keys = {}                                      -- sorted: the same paths before and after a move
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(keys) do
      local x = v[k]
      if type(x) == "table" and not (walk_objects and path ~= "" and getmetatable(x) and x.isInstanceOf
                                     and rawget(getmetatable(x), "__index") == getmetatable(x) and x:isInstanceOf(nn.Module)) then
        walk(x, path .. "." .. tostring(k))
      end
    end
  end
  walk(obj, "")
  return out
end

local function values(ts)
  local out = {}
  for p, t in pairs(ts) do out[p] = t.t ~= nil and t:totable() or "freed" end
  return out
end

-- A model that has run forward and backward (buffers exist) and an optimizer that has stepped.
local function trained_model()
  qgru.seed(21)
  local model = nn.Sequential():add(nn.GRU(3, 4, { layers = 2 })):add(nn.Last()):add(nn.Linear(4, 2))
  local opt = optim.Adam(model, { lr = 1e-2, clip = 1.0 })
  local x = qgru.randn({ 5, 2, 3 })
  local y = qgru.tensor({ 1, 0 }, "i64")
  local crit = nn.CrossEntropy()
  model:zeroGrad()
  local out = model:forward(x)
  crit:forward(out, y)
  model:backward(x, crit:backward(out, y))
  opt:step()
  return model, opt
end

describe("devices (cpu part)", function()
  it("setDevice rejects unknown devices and a missing CUDA device, leaving the default as it was", function()
    assert.raises_match(function() qgru.setDevice("tpu") end, "expected 'cpu' or 'cuda', got tpu")
    if not qgru.cudaAvailable() then
      assert.raises_match(function() qgru.setDevice("cuda") end, "qgru.setDevice: no CUDA device")
    end
    assert.are.equal("cpu", qgru.device())
    assert.are.equal("cpu", nn.Module.defaultDevice())
    assert.are.equal("cpu", nn.Linear(2, 3).weight:device())
    assert.are.equal("cpu", nn.GRU(2, 3).weights[0][0].W:device())
  end)

  it("a model built on the default device equals one built with device = 'cpu'", function()
    qgru.seed(3); local a = nn.GRU(2, 3, { device = "cpu" })
    qgru.seed(3); local b = nn.GRU(2, 3)
    for i, e in ipairs(a:namedParameters()) do
      assert.are.same(e.param:totable(), b:namedParameters()[i].param:totable())
    end
  end)

  it("a failed move changes nothing", function()
    if qgru.cudaAvailable() then return end
    local model, opt = trained_model()
    local before = values(tensors_of(model))
    assert.raises_match(function() model:to("cuda") end, "cannot create a cuda context")
    local after = tensors_of(model)
    for _, t in pairs(after) do assert.are.equal("cpu", t:device()) end
    assert.are.same(before, values(after))
    assert.are.equal("cpu", opt:device())
  end)

  it("qgru.deviceTime: the wall time on the CPU; a timer stop without a start is a clear error", function()
    -- the busy wait starts inside the timed function, so the timer holds all of it (a start taken
    -- before deviceTime let the timer read 19.9998 ms once); the wall time holds the timer
    local t_before = qgru.wallTime()
    local ms, r = qgru.deviceTime(function()
      local t0 = qgru.wallTime()
      while qgru.wallTime() - t0 < 0.02 do end
      return "done"
    end, "cpu")
    local wall = 1000 * (qgru.wallTime() - t_before)
    assert.are.equal("done", r)
    assert.is_true(ms >= 20 and ms <= wall, "timer " .. ms .. " ms, busy wait 20 ms, wall " .. wall .. " ms")
    local ctx = clib.context("cpu")
    local out = clib.ffi.new("double[1]")
    assert.are.equal(clib.lib.QG_ERR_ARG, clib.lib.qg_ctx_timer_stop(ctx, out))
    assert.matches("was not started", clib.ffi.string(clib.lib.qg_last_error(ctx)))
  end)
end)

describe("devices: Module:to and setDevice on CUDA #gpu", function()
  if skip_without_cuda(pending) then return end

  it("qgru.deviceTime on the GPU: event time of the enqueued work, positive and within the wall time", function()
    local a = Tensor.new({ 1024, 1024 }, "f32", "cuda"):uniform(-1, 1)
    local t0 = qgru.wallTime()
    local ms = qgru.deviceTime(function() for _ = 1, 20 do a:mul(1.0001) end end, "cuda")
    local wall = 1000 * (qgru.wallTime() - t0)
    assert.is_true(ms > 0 and ms <= wall, "timer " .. ms .. " ms, wall " .. wall .. " ms")
  end)

  it("Module:to('cuda') moves params, grads, buffers and optimizer state, and back, values equal", function()
    local model, opt = trained_model()
    local ts = tensors_of(model)
    local before = values(ts)
    local ost = {}
    for n, t in pairs(opt:state().tensors) do ost[n] = t:totable() end
    local gru = model.modules[1]
    assert.is_true(rawequal(gru.output, gru._ys[1]))    -- the GRU's output is its last layer's buffer

    for _, dev in ipairs({ "cuda", "cpu" }) do
      model:to(dev)
      local moved = tensors_of(model)
      local n = 0
      for p, t in pairs(moved) do
        n = n + 1
        if p:match("%.offsets$") then assert.are.equal("cpu", t:device(), p)   -- the arena layout stays on the host
        else assert.are.equal(dev, t:device(), p) end
      end
      assert.is_true(n >= 20)
      assert.are.same(before, values(moved))
      -- parameters are views of the arena, on the device
      local a = model:arena()
      assert.are.equal(dev, a.params:device())
      for i, e in ipairs(model:namedParameters()) do
        assert.is_true(rawequal(e.param, a.entries[i].param) and rawequal(e.grad, a.entries[i].grad))
        assert.are.equal(a.params, e.param._base)
      end
      assert.is_true(rawequal(gru.output, gru._ys[1]))  -- views stay views
      -- the optimizer state follows
      local st = opt:state().tensors
      for name, t in pairs(st) do
        assert.are.equal(dev, t:device(), name)
        assert.are.same(ost[name], t:totable(), name)
      end
      assert.are.equal(dev, opt:device())
    end
  end)

  it("setDevice('cuda'): constructors build on the GPU with the values of a cpu build", function()
    qgru.seed(8)
    local cpu = nn.Sequential():add(nn.GRU(3, 4)):add(nn.Last()):add(nn.Linear(4, 2))
    local ok, err = pcall(function()
      qgru.setDevice("cuda")
      qgru.seed(8)
      local gpu = nn.Sequential():add(nn.GRU(3, 4)):add(nn.Last()):add(nn.Linear(4, 2))
      assert.are.equal("cuda", qgru.zeros({ 2 }):device())
      for i, e in ipairs(gpu:namedParameters()) do
        assert.are.equal("cuda", e.param:device(), e.name)
        assert.are.equal("cuda", e.grad:device(), e.name)
        assert.are.same(cpu:namedParameters()[i].param:totable(), e.param:totable(), e.name)
      end
      local opt = optim.Adam(gpu)
      for name, t in pairs(opt:state().tensors) do assert.are.equal("cuda", t:device(), name) end
    end)
    qgru.setDevice("cpu")
    assert(ok, err)
    assert.are.equal("cpu", nn.Linear(2, 2).weight:device())
  end)

  it("moves the quantization state with the model", function()
    local quant = require("qgru.quant")
    qgru.seed(2)
    local model = nn.Sequential():add(nn.GRU(3, 4)):add(nn.Last()):add(nn.Linear(4, 2))
    quant.prepare(model, quant.uniform(8))
    local qs = model.modules[1].qstate
    -- the state's own tensors (not the GRU's, reached through its back-reference, which the
    -- model's part above checks); per-channel exponents and zero points are host mirrors that the
    -- quantizers push to their C layer (which lives on the device); everything else moves
    local function device_tensors(ts)
      for p in pairs(ts) do
        if not p:match("^%.layers") or p:match("%.exps$") or p:match("%.zps$") then ts[p] = nil end
      end
      return ts
    end
    local before = values(device_tensors(tensors_of(qs, true)))
    for _, dev in ipairs({ "cuda", "cpu" }) do
      model:to(dev)
      local moved = device_tensors(tensors_of(qs, true))
      for p, t in pairs(moved) do assert.are.equal(dev, t:device(), p) end
      for lq in qs:each() do assert.are.equal(dev, lq.device); assert.is_not_nil(lq.handle) end
      assert.are.same(before, values(moved))
    end
  end)
end)
