-- cuda_ops_spec.lua: the CUDA backends of the small operations against the CPU backends (the
-- reference), on odd sizes: tensor ops (axpy, scale, sum of squares, argmax, index_select,
-- transpose, fill, dtype conversion, non-finite count), Linear (strict fp32 and TF32), losses,
-- optimizers (per tensor and fused over an arena), fake quantization; the same call twice gives
-- the same bits; a Linear + CrossEntropy + Adam run through the training engine on the GPU against
-- the same run on the CPU; and the default device (QGRU_DEVICE, the recipes' --device).
-- Expected agreement: bit-identical where the GPU does the CPU's float operations (elementwise
-- ops, the optimizers' updates, argmax, conversions, fake quantization); double sums (sum of
-- squares, losses, the arena's gradient norm) to 1e-12 relative (only the order of the sum
-- differs); GEMMs to 1e-5 relative in strict fp32 (another summation order) and 5e-3 in TF32.
-- Relative errors are max |gpu - cpu| / max |cpu| over a tensor. The GPU part is tagged gpu and
-- skipped with a clear line where there is no CUDA device; the device-default part runs everywhere.
local qgru = require("qgru")
local clib = require("qgru.clib")
local skip_without_cuda = require("gpuskip")
local serialize = require("qgru.serialize")
local U = require("testutil")
local nn, optim, train, data = qgru.nn, qgru.optim, qgru.train, qgru.data
local ffi, lib = clib.ffi, clib.lib

local SIZES = { 1, 3, 17, 130, 300, 4099 }
local NAN = 0 / 0

local function host(t) return t:device() == "cpu" and t or t:to("cpu") end
local function flat(t) return U.flatten(host(t):totable()) end
local function rel(a, b) return (U.rel_err(flat(a), flat(b))) end

-- a and b (any devices) hold the same bytes; the message names the first differing element.
local function same_bits(a, b, what)
  local x, y = host(a), host(b)
  local nb = x:numel() * lib.qg_dtype_size(clib.dtypes[x:dtype()])
  assert(x:dtype() == y:dtype() and x:numel() == y:numel(), what .. ": dtype or size differs")
  if ffi.string(x:ptr(), nb) == ffi.string(y:ptr(), nb) then return end
  local fa, fb = flat(x), flat(y)
  for i = 1, #fa do
    if not (fa[i] == fb[i] or (fa[i] ~= fa[i] and fb[i] ~= fb[i])) then
      error(string.format("%s: element %d differs: %.17g vs %.17g", what, i, fa[i], fb[i]), 2)
    end
  end
  error(what .. ": the bytes differ (a zero's sign or a NaN payload)", 2)
end

local function randn(shape, seed, dtype)
  qgru.seed(seed)
  return qgru.randn(shape, dtype or "f32", "cpu")
end

-- In-range values for a dtype (integers: within its range; floats: normal).
local function values(shape, seed, dt)
  if dt == "f32" or dt == "f64" then return randn(shape, seed, dt) end
  qgru.seed(seed)
  local u = qgru.rand(shape, "f64", "cpu")
  return u:mul(dt == "u8" and 250 or 100):add(dt == "u8" and 0 or -50, qgru.zeros(shape, "f64", "cpu"):fill(1)):to(dt)
end

local function ctx_of(dev) return clib.context(dev) end

describe("CUDA tensor ops vs the CPU #gpu", function()
  if skip_without_cuda(pending) then return end

  it("axpy and scale: bit-identical, f32 and f64", function()
    for _, n in ipairs(SIZES) do
      for _, dt in ipairs({ "f32", "f64" }) do
        local y, x = randn({ n }, 1, dt), randn({ n }, 2, dt)
        local gy, gx = y:to("cuda"), x:to("cuda")
        y:add(0.37, x):mul(-1.7)
        gy:add(0.37, gx):mul(-1.7)
        same_bits(gy, y, dt .. " axpy/scale n=" .. n)
      end
    end
  end)

  it("sum of squares: the CPU's double sum to 1e-12, the same bits twice", function()
    for _, n in ipairs({ 1, 3, 17, 130, 300, 4099, 300001 }) do
      for _, dt in ipairs({ "f32", "f64" }) do
        local c = randn({ n }, 3, dt)
        local g = c:to("cuda")
        local a, b = c:sumsq(), g:sumsq()
        assert.is_true(math.abs(a - b) <= 1e-12 * a, string.format("%s n=%d: cpu %.17g gpu %.17g", dt, n, a, b))
        assert.are.equal(b, g:sumsq())
      end
    end
    assert.are.equal(0, qgru.zeros({ 0 }, "f32", "cuda"):sumsq())
  end)

  it("argmax of rows and count_correct: the CPU's indices (first on ties; NaN rows), every K", function()
    local crit = nn.CrossEntropy()
    for _, K in ipairs({ 1, 3, 10, 17, 130, 300 }) do
      for _, N in ipairs({ 1, 3, 17, 1000 }) do
        local x = randn({ N, K }, 4 + K)
        local p = x:ptr()
        if N >= 5 then
          p[K - 1] = 5; p[math.floor(K / 2)] = 5                  -- row 0: a tie at the maximum
          p[K] = NAN                                              -- row 1: NaN first (answer 0)
          p[2 * K + math.floor(K / 2)] = NAN; p[3 * K - 1] = 9    -- row 2: NaN inside, the maximum after it
          p[3 * K] = -0.0; for k = 1, K - 1 do p[3 * K + k] = -1 / 0 end; p[4 * K - 1] = 0.0   -- row 3: -0 then +0
          for k = 0, K - 1 do p[4 * K + k] = -1 / 0 end           -- row 4: all -inf
        end
        local want = x:argmax()
        same_bits(x:to("cuda"):argmax(), want, string.format("argmax N=%d K=%d", N, K))
        local tgt = qgru.zeros({ N }, "i64", "cpu")
        local tp, wp = tgt:ptr(), want:ptr()
        for n = 0, N - 1 do tp[n] = n % 3 == 0 and (wp[n] + 1) % K or wp[n] end   -- two rows in three right
        assert.are.equal(crit:countCorrect(x, tgt), crit:countCorrect(x:to("cuda"), tgt:to("cuda")))
      end
    end
  end)

  it("index_select: the CPU's rows for every element width; a bad index is an error that leaves out as it was", function()
    for _, dt in ipairs({ "u8", "i16", "f32", "f64", "i64" }) do
      for _, shape in ipairs({ { 17 }, { 130, 3 }, { 300, 5, 7 }, { 3, 1, 2, 3 } }) do
        local src = values(shape, 5, dt)
        local idx = {}
        for i = 1, 41 do idx[i] = (i * 7) % shape[1] end
        local it_ = qgru.tensor(idx, "i64", "cpu")
        same_bits(src:to("cuda"):index(it_:to("cuda")), src:index(it_), dt .. " index_select " .. table.concat(shape, "x"))
      end
    end
    local src = randn({ 5, 3 }, 6):to("cuda")
    local out = qgru.zeros({ 3, 3 }, "f32", "cuda"):fill(7)
    local bad = qgru.tensor({ 0, 5, -1 }, "i64", "cuda")
    assert.raises_match(function() src:index(bad, out) end, "qg_index_select: index[1] = 5 is outside [0, 5)")
    same_bits(out, qgru.zeros({ 3, 3 }, "f32", "cpu"):fill(7), "out untouched")
  end)

  it("transpose01: the CPU's result for every element width and inner size", function()
    for _, dt in ipairs({ "u8", "i16", "f32", "f64" }) do
      for _, shape in ipairs({ { 3, 17 }, { 1, 130, 1 }, { 17, 3, 5 }, { 2, 3, 5, 7 }, { 130, 17, 3 } }) do
        local src = values(shape, 7, dt)
        same_bits(src:to("cuda"):transpose01(), src:transpose01(), dt .. " transpose01 " .. table.concat(shape, "x"))
      end
    end
  end)

  it("fill and dtype conversion: the CPU's C casts, on the device", function()
    local dts = { "f32", "f64", "i8", "u8", "i16", "i32", "i64" }
    for _, dt in ipairs(dts) do
      for _, v in ipairs({ 0, -0.0, 2.5, 100.75, -3.75, 1 / 3 }) do
        if not (dt == "u8" and v < 0) then
          same_bits(qgru.zeros({ 17, 3 }, dt, "cuda"):fill(v), qgru.zeros({ 17, 3 }, dt, "cpu"):fill(v), dt .. " fill " .. v)
        end
      end
    end
    qgru.seed(11)
    local base = qgru.rand({ 301 }, "f64", "cpu"):mul(100)          -- in range for every dtype
    for _, a in ipairs(dts) do
      local src = base:to(a)
      for _, b in ipairs(dts) do
        same_bits(src:to("cuda"):to(b), src:to(b), a .. " -> " .. b)
        assert.are.equal("cuda", src:to("cuda"):to(b):device())
      end
    end
    assert.raises_match(function() qgru.zeros({ 3 }, "f64", "cpu"):copy(qgru.zeros({ 3 }, "f32", "cuda")) end,
                        "a dtype conversion (f32 -> f64) runs on one device, got cuda -> cpu")
  end)

  it("non-finite values are counted on the device, the first one found", function()
    for _, dt in ipairs({ "f32", "f64" }) do
      for _, n in ipairs({ 1, 3, 300, 5000, 300001 }) do
        local t = randn({ n }, 8, dt)
        assert.are.same({ 0 }, { t:to("cuda"):countNonFinite() })
        local p = t:ptr()
        p[n - 1] = NAN; p[math.floor(n / 2)] = 1 / 0; p[math.floor(2 * n / 3)] = -1 / 0
        local want = { t:countNonFinite() }
        assert.are.same(want, { t:to("cuda"):countNonFinite() }, dt .. " n=" .. n)
        assert.are.equal(math.floor(n / 2) + 1, want[2])
      end
    end
    assert.are.same({ 0 }, { qgru.zeros({ 5 }, "i32", "cuda"):countNonFinite() })
  end)

  it("a cuda tensor prints its values with one copy of the rows shown", function()
    local c = randn({ 40, 9 }, 9)
    assert.are.equal(tostring(c), (tostring(c:to("cuda")):gsub(" cuda\n", " cpu\n", 1)))
  end)

  it("CUDA tensors through the CPU context are a clear error, not a launch", function()
    local g = qgru.zeros({ 3 }, "f32", "cuda")
    local ctx = ctx_of("cpu")
    assert.are.equal(lib.QG_ERR_DEVICE, tonumber(lib.qg_scale(ctx, g.t, 2)))
    assert.is_truthy(ffi.string(lib.qg_last_error(ctx)):find("qg_scale: the tensors are on cuda but the context is a cpu context", 1, true))
  end)
end)

-- y, dx, dW, db of one Linear forward and backward on dev (dx overwritten from garbage; dW and db
-- accumulated onto dW0, db0).
local function linear_run(dev, x, W, b, dy, dW0, db0)
  local ctx = ctx_of(dev)
  local X, Wd, B, DY = x:to(dev), W:to(dev), b and b:to(dev), dy:to(dev)
  local N, O, In = x:size(1), W:size(1), W:size(2)
  local y = qgru.zeros({ N, O }, "f32", dev):fill(-5)
  clib.check(ctx, lib.qg_linear_forward(ctx, y.t, X.t, Wd.t, B and B.t or nil))
  local dx = qgru.zeros({ N, In }, "f32", dev):fill(3)
  local dW, db = dW0:to(dev):clone(), b and db0:to(dev):clone() or nil
  clib.check(ctx, lib.qg_linear_backward(ctx, dx.t, dW.t, db and db.t or nil, DY.t, X.t, Wd.t))
  return { y = y, dx = dx, dW = dW, db = db }
end

local function linear_case(N, In, O, bias, seed)
  return randn({ N, In }, seed), randn({ O, In }, seed + 1), bias and randn({ O }, seed + 2) or nil, randn({ N, O }, seed + 3),
         randn({ O, In }, seed + 4), randn({ O }, seed + 5)
end

describe("CUDA Linear vs the CPU #gpu", function()
  if skip_without_cuda(pending) then return end

  it("forward and backward in strict fp32 to 1e-5, on odd sizes (dx overwritten, dW and db accumulated)", function()
    local k = 0
    for _, N in ipairs({ 1, 3, 17, 130, 1300 }) do
      for _, In in ipairs({ 1, 5, 300 }) do
        for _, O in ipairs({ 1, 7, 130 }) do
          if N < 1300 or (In == 5 and O ~= 7) then
            k = k + 1
            local x, W, b, dy, dW0, db0 = linear_case(N, In, O, k % 2 == 1, 100 + k)
            local c, g = linear_run("cpu", x, W, b, dy, dW0, db0), linear_run("cuda", x, W, b, dy, dW0, db0)
            for _, f in ipairs({ "y", "dx", "dW", "db" }) do
              if c[f] then
                local e = rel(g[f], c[f])
                assert.is_true(e < 1e-5, string.format("%s N=%d In=%d O=%d: rel err %.3g", f, N, In, O, e))
              end
            end
          end
        end
      end
    end
  end)

  it("empty sizes: In = 0 gives y = b (or 0), N = 0 touches nothing", function()
    for _, s in ipairs({ { 3, 0, 4 }, { 0, 5, 4 } }) do
      for _, bias in ipairs({ true, false }) do
        local x, W, b, dy, dW0, db0 = linear_case(s[1], s[2], s[3], bias, 7)
        local c, g = linear_run("cpu", x, W, b, dy, dW0, db0), linear_run("cuda", x, W, b, dy, dW0, db0)
        for _, f in ipairs({ "y", "dx", "dW" }) do same_bits(g[f], c[f], f .. " " .. table.concat(s, "x")) end
        -- db: the GPU adds the rows in double and rounds once, the CPU adds in float
        if bias then assert.is_true(rel(g.db, c.db) < 1e-6, "db " .. table.concat(s, "x")) end
        if bias and s[1] == 0 then same_bits(g.db, db0, "db untouched") end
      end
    end
  end)

  it("the same bits twice (cuBLAS and the chunked bias reduction)", function()
    local x, W, b, dy, dW0, db0 = linear_case(1300, 5, 130, true, 50)
    local a, c = linear_run("cuda", x, W, b, dy, dW0, db0), linear_run("cuda", x, W, b, dy, dW0, db0)
    for _, f in ipairs({ "y", "dx", "dW", "db" }) do same_bits(a[f], c[f], f) end
  end)

  it("TF32 mode: within 5e-3 of the CPU, and different from strict fp32 on a large product", function()
    local ok, err = pcall(function()
      qgru.setMath("tf32")
      for _, s in ipairs({ { 17, 300, 7 }, { 130, 5, 130 }, { 256, 512, 256 } }) do
        local x, W, b, dy, dW0, db0 = linear_case(s[1], s[2], s[3], true, 60)
        local c, g = linear_run("cpu", x, W, b, dy, dW0, db0), linear_run("cuda", x, W, b, dy, dW0, db0)
        for _, f in ipairs({ "y", "dx", "dW", "db" }) do
          local e = rel(g[f], c[f])
          assert.is_true(e < 5e-3, string.format("tf32 %s %s: rel err %.3g", f, table.concat(s, "x"), e))
        end
      end
      local x, W, b, dy, dW0, db0 = linear_case(256, 512, 256, true, 61)
      local t32 = linear_run("cuda", x, W, b, dy, dW0, db0)
      qgru.setMath("strict")
      local f32 = linear_run("cuda", x, W, b, dy, dW0, db0)
      local x1, x2 = flat(t32.y), flat(f32.y)
      local differ = false
      for i = 1, #x1 do if x1[i] ~= x2[i] then differ = true; break end end
      assert.is_true(differ, "tf32 gave the strict result bit for bit: TF32 was not applied")
    end)
    qgru.setMath("strict")
    assert(ok, err)
  end)
end)

describe("CUDA losses vs the CPU #gpu", function()
  if skip_without_cuda(pending) then return end
  local loss = ffi.new("double[1]")

  local function ce(dev, logits, target, scale)
    local ctx = ctx_of(dev)
    local d = qgru.zeros(logits:shape(), "f32", dev):fill(7)
    clib.check(ctx, lib.qg_cross_entropy(ctx, loss, d.t, logits:to(dev).t, target:to(dev).t, scale))
    return loss[0], d
  end

  it("cross-entropy: the loss to 1e-12 and dlogits to 1e-6 of the CPU's; the same bits twice", function()
    for _, N in ipairs({ 1, 3, 17, 130, 300 }) do
      for _, K in ipairs({ 1, 3, 10, 17, 130 }) do
        local logits = randn({ N, K }, N + K):mul(3)
        local t = {}
        for n = 1, N do t[n] = (n * 7 + 3) % K end
        local target = qgru.tensor(t, "i64", "cpu")
        local lc, dc = ce("cpu", logits, target, 0.5)
        local lg, dg = ce("cuda", logits, target, 0.5)
        assert.is_true(math.abs(lc - lg) <= 1e-12 * math.max(math.abs(lc), 1e-300), string.format("N=%d K=%d: %.17g vs %.17g", N, K, lc, lg))
        if K > 1 then assert.is_true(rel(dg, dc) < 1e-6, string.format("dlogits N=%d K=%d: %.3g", N, K, rel(dg, dc))) end
        local lg2, dg2 = ce("cuda", logits, target, 0.5)
        assert.are.equal(lg, lg2)
        same_bits(dg2, dg, "dlogits twice")
      end
    end
  end)

  it("cross-entropy: a bad class index is the CPU's error, and dlogits stays as it was", function()
    local logits = randn({ 4, 3 }, 1)
    local target = qgru.tensor({ 0, 2, 5, -1 }, "i64", "cpu")
    local msgs = {}
    for _, dev in ipairs({ "cpu", "cuda" }) do
      local ctx = ctx_of(dev)
      local d = qgru.zeros({ 4, 3 }, "f32", dev):fill(7)
      assert.are.equal(lib.QG_ERR_ARG, tonumber(lib.qg_cross_entropy(ctx, loss, d.t, logits:to(dev).t, target:to(dev).t, 1)))
      msgs[dev] = ffi.string(lib.qg_last_error(ctx))
      same_bits(d, qgru.zeros({ 4, 3 }, "f32", "cpu"):fill(7), dev .. " dlogits untouched")
    end
    assert.are.equal(msgs.cpu, msgs.cuda)
    assert.is_truthy(msgs.cuda:find("target[2] = 5 is not a class index in [0, 3)", 1, true))
  end)

  it("MSE: the loss to 1e-12, dpred bit-identical", function()
    for _, shape in ipairs({ { 1 }, { 3, 17 }, { 130, 3 }, { 300 }, { 4099 }, { 300001 } }) do
      local pred, target = randn(shape, 21), randn(shape, 22)
      local out = {}
      for _, dev in ipairs({ "cpu", "cuda" }) do
        local ctx = ctx_of(dev)
        local d = qgru.zeros(shape, "f32", dev)
        clib.check(ctx, lib.qg_mse(ctx, loss, d.t, pred:to(dev).t, target:to(dev).t, 0.25))
        out[dev] = { loss[0], d }
      end
      assert.is_true(math.abs(out.cpu[1] - out.cuda[1]) <= 1e-12 * out.cpu[1], table.concat(shape, "x"))
      same_bits(out.cuda[2], out.cpu[2], "dpred " .. table.concat(shape, "x"))
    end
  end)
end)

-- Optimizer hyperparameter sets (PyTorch semantics; see core/qgru.h).
local SGDS = { { lr = 0.1, momentum = 0, dampening = 0, wd = 0, nesterov = 0 },
               { lr = 0.05, momentum = 0.9, dampening = 0, wd = 1e-3, nesterov = 1 },
               { lr = 0.1, momentum = 0.5, dampening = 0.25, wd = 0, nesterov = 0 } }
local ADAMS = { { lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0, decoupled = 0, gs = 1 },
                { lr = 3e-3, b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.1, decoupled = 0, gs = 0.37 },
                { lr = 3e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.2, decoupled = 1, gs = 1 } }

-- Runs `steps` per-tensor steps of one optimizer on dev from the same start; returns {p, s1, s2}.
local function per_tensor(dev, kind, h, n, steps)
  local ctx = ctx_of(dev)
  local p = randn({ n }, 31):to(dev)
  local s1, s2 = qgru.zeros({ n }, "f32", dev), qgru.zeros({ n }, "f32", dev)
  for t = 1, steps do
    local g = randn({ n }, 40 + t):to(dev)
    if kind == "sgd" then
      clib.check(ctx, lib.qg_sgd_step(ctx, p.t, s1.t, g.t, h.lr, h.momentum, h.dampening, h.wd, h.nesterov, t == 1 and 1 or 0))
    else
      clib.check(ctx, lib.qg_adam_step(ctx, p.t, s1.t, s2.t, g.t, h.lr, h.b1, h.b2, h.eps, h.wd, h.decoupled, t, h.gs))
    end
  end
  return { p, s1, s2 }
end

-- An arena of the parameter sizes SIZES: offsets (cpu), params, state and per-step gradients.
local ARENA_SIZES = SIZES
local function arena_offsets()
  local o, P = { 0 }, 0
  for _, s in ipairs(ARENA_SIZES) do P = P + s; o[#o + 1] = P end
  return qgru.tensor(o, "i64", "cpu"), P
end

-- `steps` fused steps on dev; returns {params, s1, s2}, the norms, and the per-step gradients.
local function arena_run(dev, kind, h, max_norm, steps, mag)
  local ctx = ctx_of(dev)
  local offsets, P = arena_offsets()
  local p = randn({ P }, 32):to(dev)
  local s1, s2 = qgru.zeros({ P }, "f32", dev), qgru.zeros({ P }, "f32", dev)
  local gn = qgru.zeros({ 1 }, "f64", dev)
  local norms, grads = {}, {}
  for t = 1, steps do
    local g = randn({ P }, 50 + t):mul(mag):to(dev)
    grads[t] = g
    if kind == "sgd" then
      clib.check(ctx, lib.qg_sgd_arena_step(ctx, gn.t, p.t, s1.t, g.t, offsets.t, h.lr, h.momentum, h.dampening, h.wd,
                                            h.nesterov, t == 1 and 1 or 0, max_norm))
    else
      clib.check(ctx, lib.qg_adam_arena_step(ctx, gn.t, p.t, s1.t, s2.t, g.t, offsets.t, h.lr, h.b1, h.b2, h.eps, h.wd,
                                             h.decoupled, t, max_norm))
    end
    norms[t] = gn:get(1)
  end
  return { p, s1, s2 }, norms, grads
end

describe("CUDA optimizers vs the CPU #gpu", function()
  if skip_without_cuda(pending) then return end

  it("sgd_step and adam_step: bit-identical with the CPU over 4 steps, odd sizes", function()
    for _, n in ipairs(SIZES) do
      for i, h in ipairs(SGDS) do
        local c, g = per_tensor("cpu", "sgd", h, n, 4), per_tensor("cuda", "sgd", h, n, 4)
        same_bits(g[1], c[1], "sgd " .. i .. " param n=" .. n)
        same_bits(g[2], c[2], "sgd " .. i .. " momentum n=" .. n)
      end
      for i, h in ipairs(ADAMS) do
        local c, g = per_tensor("cpu", "adam", h, n, 4), per_tensor("cuda", "adam", h, n, 4)
        for k, what in ipairs({ "param", "exp_avg", "exp_avg_sq" }) do same_bits(g[k], c[k], "adam " .. i .. " " .. what .. " n=" .. n) end
      end
    end
  end)

  it("arena steps: the CPU's norm to 1e-12 and parameters to 1e-6 with clipping, bit-identical without; the same bits twice", function()
    for _, case in ipairs({ { "sgd", SGDS[2] }, { "sgd", SGDS[3] }, { "adam", ADAMS[1] }, { "adam", ADAMS[3] } }) do
      for _, max_norm in ipairs({ 1.0, -1 }) do
        local what = case[1] .. " max_norm " .. max_norm
        local c, cn = arena_run("cpu", case[1], case[2], max_norm, 4, 1.0)
        local g, gn = arena_run("cuda", case[1], case[2], max_norm, 4, 1.0)
        for t = 1, 4 do assert.is_true(math.abs(cn[t] - gn[t]) <= 1e-12 * cn[t], what .. " norm") end
        assert.is_true(gn[1] > 1.0)                               -- clipping is active when on
        for k = 1, case[1] == "sgd" and 2 or 3 do
          if max_norm < 0 then same_bits(g[k], c[k], what .. " state " .. k)
          else assert.is_true(rel(g[k], c[k]) < 1e-6, string.format("%s state %d: %.3g", what, k, rel(g[k], c[k]))) end
        end
        local g2, gn2 = arena_run("cuda", case[1], case[2], max_norm, 4, 1.0)
        for k = 1, 3 do same_bits(g2[k], g[k], what .. " twice " .. k) end
        assert.are.same(gn, gn2)
      end
    end
  end)

  it("arena steps equal per-tensor GPU steps with the arena's clip factor, bit for bit", function()
    local offsets, P = arena_offsets()
    local op = offsets:ptr()
    for _, case in ipairs({ { "sgd", SGDS[2] }, { "adam", ADAMS[1] }, { "adam", ADAMS[3] } }) do
      local kind, h, max_norm = case[1], case[2], 1.0
      local fused, norms, grads = arena_run("cuda", kind, h, max_norm, 3, 1.0)
      local ctx = ctx_of("cuda")
      local p = randn({ P }, 32):to("cuda")
      local s1, s2 = qgru.zeros({ P }, "f32", "cuda"), qgru.zeros({ P }, "f32", "cuda")
      for t = 1, 3 do
        local clip = norms[t] > max_norm and max_norm / (norms[t] + 1e-6) or 1
        for k = 0, #ARENA_SIZES - 1 do
          local off, n = tonumber(op[k]), tonumber(op[k + 1] - op[k])
          local pv, v1, v2, gv = p:view({ n }, off), s1:view({ n }, off), s2:view({ n }, off), grads[t]:view({ n }, off)
          if kind == "sgd" then
            local gs = gv:clone():mul(clip)                     -- the float product g * (float)clip
            clib.check(ctx, lib.qg_sgd_step(ctx, pv.t, v1.t, gs.t, h.lr, h.momentum, h.dampening, h.wd, h.nesterov, t == 1 and 1 or 0))
          else
            clib.check(ctx, lib.qg_adam_step(ctx, pv.t, v1.t, v2.t, gv.t, h.lr, h.b1, h.b2, h.eps, h.wd, h.decoupled, t, clip))
          end
        end
      end
      same_bits(p, fused[1], kind .. " params")
      same_bits(s1, fused[2], kind .. " state 1")
      if kind == "adam" then same_bits(s2, fused[3], kind .. " state 2") end
    end
  end)
end)

describe("CUDA fake quantization vs the CPU #gpu", function()
  if skip_without_cuda(pending) then return end

  it("codes, masks and values bit-identical, per tensor and per channel, bitwidths 2..16, signed and unsigned", function()
    local n_cases = 0
    for _, shape in ipairs({ { 1 }, { 3 }, { 17, 5 }, { 130, 3 }, { 300 } }) do
      local x = randn(shape, 70 + #shape):mul(6)
      local p, n = x:ptr(), x:numel()
      local specials = { NAN, 1 / 0, -1 / 0, 1e30, -1e30, 0.5, 1.5, -2.5, 0.125 * 3, -0.0 }
      for i, v in ipairs(specials) do if i <= n then p[(i * 37) % n] = v end end
      local rows = shape[1]
      for _, bits in ipairs({ 2, 3, 4, 5, 8, 11, 16 }) do
        for _, uns in ipairs({ 0, 1 }) do
          local lo, hi = require("qgru.quant.quantizer").grid(bits, uns == 1)
          for _, per_channel in ipairs({ false, true }) do
            local ne = per_channel and rows or 1
            local e, z = {}, {}
            for r = 1, ne do
              e[r] = (r + bits) % 9 - 2
              z[r] = uns == 1 and math.floor((lo + hi + r) / 2) % (hi + 1) or (r % 3 == 0 and lo + 1 or 0)
            end
            local exps, zps = qgru.tensor(e, "i32", "cpu"), qgru.tensor(z, "i32", "cpu")
            local out = {}
            for _, dev in ipairs({ "cpu", "cuda" }) do
              local ctx = ctx_of(dev)
              local fq, codes, mask = qgru.zeros(shape, "f32", dev), qgru.zeros(shape, "i32", dev), qgru.zeros(shape, "u8", dev)
              clib.check(ctx, lib.qg_fake_quant(ctx, fq.t, codes.t, mask.t, x:to(dev).t, exps.t, zps.t, bits, uns))
              out[dev] = { fq, codes, mask }
            end
            local what = string.format("%s b=%d uns=%d per_channel=%s", table.concat(shape, "x"), bits, uns, tostring(per_channel))
            same_bits(out.cuda[1], out.cpu[1], what .. " fq")
            same_bits(out.cuda[2], out.cpu[2], what .. " codes")
            same_bits(out.cuda[3], out.cpu[3], what .. " mask")
            n_cases = n_cases + 1
          end
        end
      end
    end
    assert.are.equal(5 * 7 * 2 * 2, n_cases)
  end)
end)

-- A small classification task: x [n, T, C] (the class is the sign pattern of the last step's
-- first features), y [n].
local function toy_data(n, T, C, K)
  qgru.seed(77)
  local x = qgru.randn({ n, T, C }, "f32", "cpu")
  local y = qgru.zeros({ n }, "i64", "cpu")
  local xp, yp = x:ptr(), y:ptr()
  for i = 0, n - 1 do
    local last = (i * T + T - 1) * C
    yp[i] = (xp[last] > 0 and 1 or 0) + (xp[last + 1] > 0 and 2 or 0)
    if yp[i] >= K then yp[i] = K - 1 end
  end
  return data.Dataset(x, y, "toy")
end

local function toy_run(dev, ckpt)
  qgru.seed(5)
  local model = nn.Sequential():add(nn.Last()):add(nn.Linear(6, 16, { device = dev })):add(nn.Linear(16, 4, { device = dev }))
  local opt = optim.Adam(model, { lr = 1e-2, clip = 1.0 })
  local engine = train.Engine{ model = model, criterion = nn.CrossEntropy(), optimizer = opt, log = function() end }
  local ds = toy_data(200, 5, 6, 4)
  local state = engine:train{ data = ds, batch_size = 32, epochs = 2, seed = 1, eval = ds, checkpoint = ckpt }
  return model, opt, state
end

describe("training on the GPU #gpu", function()
  if skip_without_cuda(pending) then return end

  it("Linear + CrossEntropy + Adam through the engine: the CPU's losses to 1e-5, the same bits twice, checkpoints readable on the CPU", function()
    local ck = U.tmpname(".safetensors")
    local mc, _, sc = toy_run("cpu")
    local mg, og, sg = toy_run("cuda", ck)
    assert.are.equal("cuda", mg:device())
    assert.are.equal(#sc.losses, #sg.losses)
    assert.are.equal(14, #sg.losses)
    for i = 1, #sc.losses do
      assert.is_true(math.abs(sc.losses[i] - sg.losses[i]) <= 1e-5 * sc.losses[i], string.format("step %d: %.9g vs %.9g", i, sc.losses[i], sg.losses[i]))
    end
    assert.is_true(sg.losses[#sg.losses] < sg.losses[1])        -- it learns
    for i, h in ipairs(sc.history) do
      assert.is_true(math.abs(h.eval_acc - sg.history[i].eval_acc) <= 1 / 200, "eval accuracy, epoch " .. i)
      assert.is_true(math.abs(h.train_acc - sg.history[i].train_acc) <= 1 / 200, "train accuracy, epoch " .. i)
    end
    for i, e in ipairs(mc:namedParameters()) do
      local ge = mg:namedParameters()[i]
      assert.are.equal("cuda", ge.param:device())
      assert.is_true(rel(ge.param, e.param) < 1e-5, e.name)
    end
    -- the same run again: the same bits
    local mg2, _, sg2 = toy_run("cuda")
    assert.are.same(sg.losses, sg2.losses)
    for i, e in ipairs(mg:namedParameters()) do same_bits(mg2:namedParameters()[i].param, e.param, "twice " .. e.name) end
    -- the GPU's checkpoint restores a CPU model and optimizer exactly
    qgru.seed(9)
    local mcpu = nn.Sequential():add(nn.Last()):add(nn.Linear(6, 16, { device = "cpu" })):add(nn.Linear(16, 4, { device = "cpu" }))
    local ocpu = optim.Adam(mcpu, { lr = 1e-2, clip = 1.0 })
    serialize.loadCheckpoint(ck, mcpu, ocpu)
    for i, e in ipairs(mg:namedParameters()) do same_bits(mcpu:namedParameters()[i].param, e.param, "checkpoint " .. e.name) end
    local gst, cst = og:state().tensors, ocpu:state().tensors
    for name, t in pairs(gst) do same_bits(cst[name], t, "checkpoint " .. name) end
    os.remove(ck)
  end)
end)

-- ---- the default device (runs everywhere) ----------------------------------------------------

local ROOT = clib.root
if ROOT:sub(1, 1) ~= "/" then ROOT = os.getenv("PWD") .. "/" .. ROOT end
local LIB = os.getenv("QGRU_LIB") or (ROOT .. "/build/libqgru.so")

local function sh(env, args)
  local cmd = string.format("cd '%s' && %s QGRU_ROOT='%s' QGRU_LIB='%s' LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' luajit %s 2>&1; echo \"rc=$?\"",
                            ROOT, env, ROOT, LIB, ROOT, ROOT, args)
  local f = io.popen(cmd)
  local out = f:read("*a")
  f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

local function default_device(env)
  return (sh(env, "-e 'local ok, q = pcall(require, \"qgru\"); io.write(ok and (\"device=\" .. q.device()) or tostring(q))'"))
end

describe("the default device", function()
  local gpu = qgru.cudaAvailable()

  it("is cuda when a GPU is present, else cpu; QGRU_DEVICE overrides; a bad value is an error", function()
    assert.is_truthy(default_device("env -u QGRU_DEVICE"):find(gpu and "device=cuda" or "device=cpu", 1, true))
    assert.is_truthy(default_device("QGRU_DEVICE=cpu"):find("device=cpu", 1, true))
    local out = default_device("QGRU_DEVICE=cuda")
    if gpu then assert.is_truthy(out:find("device=cuda", 1, true), out)
    else assert.is_truthy(out:find("qgru: QGRU_DEVICE=cuda: no CUDA device", 1, true), out) end
    assert.is_truthy(default_device("QGRU_DEVICE=tpu"):find("qgru: QGRU_DEVICE must be 'cpu' or 'cuda', got 'tpu'", 1, true))
  end)

  it("recipes take --device and print the device they use", function()
    local dir = U.tmpname("_device")
    qgru.mkdir(dir)
    local function recipe(args)
      return sh("cd '" .. dir .. "' && env -u QGRU_DEVICE", "'" .. ROOT .. "/recipes/train_float.lua' --data_dir /no/such/data --epochs 1 " .. args)
    end
    local out = recipe("--device cpu --name dev_cpu")
    assert.is_truthy(out:find("\ndevice: cpu\n", 1, true), out)
    out = recipe("--name dev_default")
    assert.is_truthy(out:find(gpu and "\ndevice: cuda  (math strict)\n" or "\ndevice: cpu\n", 1, true), out)
    local rc
    out, rc = recipe("--device cuda --name dev_cuda")
    if gpu then assert.is_truthy(out:find("\ndevice: cuda  (math strict)\n", 1, true), out)
    else
      assert.are.equal(2, rc, out)
      assert.is_truthy(out:find("qgru.setDevice: no CUDA device", 1, true), out)
    end
    out, rc = recipe("--device tpu --name dev_tpu")
    assert.are.equal(2, rc, out)
    assert.is_truthy(out:find("option --device must be one of cpu, cuda, got 'tpu'", 1, true), out)
  end)
end)
