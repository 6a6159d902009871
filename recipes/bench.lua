-- recipes/bench.lua: step times of the float GRU and of QAT, median of repeats after warm-up, in
-- one run so that ratios compare like with like. Writes runs/<name>/bench.json and bench.md.
--   ./qgru recipes/bench.lua [--device auto|cpu|cuda] [--repeats N] [--warmup N] ...
-- GPU (--device cuda, the default where a GPU is visible): the five shapes of
-- /work/shared/tools/bench_cudnn.py (seed-small T100 N4 C128 H256, seed-qat T50 N32 C64 H128,
-- medium T100 N64 C256 H512, large T100 N256 C512 H1024, long-kws T1000 N16 C40 H64), one GRU
-- layer as its nn.GRU(C, H); rows: float train step (forward in training mode + backward with a
-- fixed gradOutput, as its out.square().mean().backward()), float inference (forward), QAT train
-- step (int8, every operator) and integer inference (weight quantizers tracking the weights, as
-- in QAT, and frozen, as a finished model runs); in the strict (fp32) and tf32 math modes
-- (qgru.setMath); the float rows also with each recurrence forced (--paths). --shapes takes those
-- names and shapes of your own as TxNxCxH (e.g. 100x128x40x128: T steps, N batch rows, C inputs,
-- H units; bench/cudnn_shapes.py times cuDNN on the same tokens). Each sample is
-- timed by CUDA events around the work it enqueues (qgru.deviceTime), as bench_cudnn.py times
-- cuDNN (torch.cuda.Event); until run 6 (bench/gpu.md) the host clock between synchronisations.
-- Run it in the same device command as bench_cudnn.py and compare the ratios.
-- CPU (--device cpu): the float and QAT steps on the default recipe's shape (T = 28, C = 28,
-- H = --hidden, batch --batch), compared with /work/shared/tools/bench_torch_cpu.py.
local qgru = require("qgru")
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local quant, cli, zoo, optim, json, nn = qgru.quant, qgru.cli, qgru.zoo, qgru.optim, qgru.json, qgru.nn

local function split(s)
  local out = {}
  for w in s:gmatch("[^,%s]+") do out[#out + 1] = w end
  return out
end

-- GPU shapes {T, N, C, H}: bench_cudnn.py's five by name, and the caller's as TxNxCxH
local SHAPES = {
  ["seed-small"] = { 100, 4, 128, 256 }, ["seed-qat"] = { 50, 32, 64, 128 }, medium = { 100, 64, 256, 512 },
  large = { 100, 256, 512, 1024 }, ["long-kws"] = { 1000, 16, 40, 64 },
}
local function parse_shape(s)
  local dims = {}
  for d in (s .. "x"):gmatch("([^x]*)x") do dims[#dims + 1] = d end
  if #dims ~= 4 then return nil end
  for k = 1, 4 do
    local v = dims[k]:match("^%d+$") and tonumber(dims[k])
    if not v or v < 1 or v > 2 ^ 31 - 1 then return nil end
    dims[k] = v
  end
  return dims
end

local opt = cli.main(arg, {
  name = { "bench", "run name", { nonempty = true } },
  device = { "auto", "cpu, cuda, or auto (cuda when a GPU is visible)", { choices = { "auto", "cpu", "cuda" } } },
  repeats = { 30, "timed repeats (after the warm-up)", { int = true, min = 1 } },
  -- 50: LuaJIT compiles a new step's traces over its first ~40 calls, which run slower meanwhile
  -- (up to 35% at the small GPU shapes; bench/gpu.md, run 51); a training run is in the steady state
  warmup = { 50, "untimed warm-up steps (past LuaJIT's trace compilation)", { int = true, min = 0 } },
  hidden = { 128, "CPU: GRU hidden size", { int = true, min = 1 } },
  batch = { 128, "CPU: batch size", { int = true, min = 1 } },
  threads = { 0, "CPU: BLAS threads (0 = default)", { int = true, min = 0 } },
  float_only = { false, "measure the float model only" },
  shapes = { "seed-small,seed-qat,medium,large,long-kws", "GPU: comma-separated shape names or TxNxCxH", { nonempty = true } },
  modes = { "strict,tf32", "GPU: comma-separated math modes", { nonempty = true } },
  paths = { true, "GPU: also time the float rows with the persistent and the fallback recurrence forced" },
  sweep = { false, "GPU: instead, time the raw forward and backward calls over forced persistent kernel shapes" },
}, "recipes/bench.lua: float vs QAT step time (GPU: the five bench_cudnn shapes or yours; CPU: the recipe shape)", function(o)
  -- the shapes and modes are checked before any device work, so that a typo stops the run at once
  for _, s in ipairs(split(o.shapes)) do
    if not SHAPES[s] and not parse_shape(s) then
      error("qgru: option --shapes: '" .. s .. "' is neither a shape name (seed-small, seed-qat, medium, large, long-kws) "
            .. "nor TxNxCxH with four positive integers (e.g. 100x128x40x128)", 0)
    end
  end
  for _, m in ipairs(split(o.modes)) do
    if m ~= "strict" and m ~= "tf32" then error("qgru: option --modes: unknown math mode '" .. m .. "' (strict, tf32)", 0) end
  end
end)
local shapes, modes = split(opt.shapes), split(opt.modes)
for _, s in ipairs(shapes) do SHAPES[s] = SHAPES[s] or parse_shape(s) end

local device = opt.device
if device == "auto" then device = qgru.cudaAvailable() and "cuda" or "cpu" end
if device == "cuda" and not qgru.cudaAvailable() then
  io.stderr:write("recipes/bench.lua: --device cuda but no CUDA device is visible\n")
  os.exit(2)
end

local dir, log = zoo.run(opt.name)
if opt.threads > 0 then qgru.setNumThreads(opt.threads) end
log("qgru " .. qgru.VERSION .. "  recipes/bench.lua  device " .. device .. "\n" .. cli.describe(opt))

local function write(md, rows)
  local f = assert(io.open(dir .. "/bench.md", "w")); f:write(table.concat(md, "\n"), "\n"); f:close()
  json.write(dir .. "/bench.json", json.array(rows))
  log(table.concat(md, "\n"))
end

-- ---- CPU: the recipe shape ------------------------------------------------------------------------
if device == "cpu" then
  qgru.seed(1)
  local T, C, H, N = 28, 28, opt.hidden, opt.batch
  local x = qgru.zeros({ T, N, C }):normal(0, 1)
  local y = qgru.zeros({ N }, "i64")
  for i = 1, N do y:set(i, (i - 1) % 10) end
  local crit = qgru.nn.CrossEntropy()

  local function median(f)
    for _ = 1, opt.warmup do f() end
    local t = {}
    for i = 1, opt.repeats do
      local t0 = qgru.wallTime()
      f()
      t[i] = 1000 * (qgru.wallTime() - t0)
    end
    table.sort(t)
    return t[math.floor(#t / 2) + 1]
  end

  local function measure(cfg)
    qgru.seed(1)
    local m = zoo.fmnistGRU(H)
    if cfg then
      quant.prepare(m, cfg)
      quant.calibrate(m, { x }, { method = "minmax", passes = 1 })
    end
    local o = optim.Adam(m, { lr = 0 })
    m:training()
    local train_ms = median(function()
      local out = m:forward(x)
      crit:forward(out, y)
      m:zeroGrad()
      m:backward(x, crit:backward(out, y))
      o:step()
    end)
    m:evaluate()
    local infer_ms = median(function() m:forward(x) end)
    return train_ms, infer_ms
  end

  local rows = {}
  local ft, fi = measure(nil)
  rows[1] = { name = "float", train = ft, infer = fi }
  for _, c in ipairs(opt.float_only and {} or
                     { { "int8", quant.uniform(8) }, { "W4A8", quant.uniform(8, { weight_bits = 4 }) }, { "int16", quant.uniform(16) } }) do
    local t, i = measure(c[2])
    rows[#rows + 1] = { name = c[1], train = t, infer = i }
  end
  local md = { string.format("CPU, T=%d C=%d H=%d batch=%d, median of %d (ms)", T, C, H, N, opt.repeats), "",
               "| model | train step | vs float | inference forward | vs float |", "|---|---|---|---|---|" }
  for _, r in ipairs(rows) do
    md[#md + 1] = string.format("| %s | %.1f | %.2fx | %.1f | %.2fx |", r.name, r.train, r.train / ft, r.infer, r.infer / fi)
  end
  write(md, rows)
  return
end

-- ---- GPU: the five bench_cudnn shapes, or the caller's ------------------------------------------------

local lib = clib.lib
local ctx = clib.context("cuda")
local function sync() clib.check(ctx, lib.qg_ctx_synchronize(ctx)) end

-- median of opt.repeats samples in ms, each timed by CUDA events on the context's stream around
-- the work f enqueues (qgru.deviceTime), the method bench_cudnn.py uses (torch.cuda.Event)
local function median_ms(f)
  for _ = 1, opt.warmup do f() end
  sync()
  local t = {}
  for i = 1, opt.repeats do t[i] = qgru.deviceTime(f, "cuda") end
  table.sort(t)
  return t[math.floor(#t / 2) + 1]
end

-- the time of f, or a short reason it could not run
local function timed(f)
  local ok, v = pcall(median_ms, f)
  if ok then return v end
  local msg = tostring(v)
  if msg:find("not in this build", 1, true) or msg:find("unsupported", 1, true) and msg:find("CUDA kernels", 1, true) then
    return "n/a (not in this build)"
  end
  if msg:find("cannot hold", 1, true) then return "n/a (shape too large for it)" end
  return "error: " .. msg:gsub("\n.*", ""):sub(1, 160)
end

local function fmt(v) return type(v) == "number" and string.format("%.3f", v) or v end

-- ---- GPU sweep: the raw C calls (no module) over forced persistent shapes ------------------------------
if opt.sweep then
  local ffi = clib.ffi
  local md = { string.format("Raw qg_gru_forward (inference) and qg_gru_backward, ms, median of %d; K blocks per cluster, "
                             .. "NB rows per cluster, S threads per unit (0 = chosen)", opt.repeats), "" }
  local rows = {}
  for _, name in ipairs(shapes) do
    local sh = SHAPES[name]
    local T, N, C, H = sh[1], sh[2], sh[3], sh[4]
    qgru.seed(1)
    local k = 1 / math.sqrt(H)
    local function dev(shape, lo) return Tensor.new(shape, "f32"):uniform(-lo, lo):to("cuda") end
    local x, W, R, bx, br = dev({ T, N, C }, 1), dev({ 3 * H, C }, k), dev({ 3 * H, H }, k), dev({ 3 * H }, k), dev({ 3 * H }, k)
    local y, hs, gates = Tensor.new({ T, N, H }, "f32", "cuda"), Tensor.new({ T + 1, N, H }, "f32", "cuda"),
                         Tensor.new({ T, N, 4 * H }, "f32", "cuda")
    local dy = dev({ T, N, H }, 1e-3)
    local dx, dW, dR, dbx, dbr = Tensor.new({ T, N, C }, "f32", "cuda"), Tensor.new({ 3 * H, C }, "f32", "cuda"),
                                 Tensor.new({ 3 * H, H }, "f32", "cuda"), Tensor.new({ 3 * H }, "f32", "cuda"),
                                 Tensor.new({ 3 * H }, "f32", "cuda")
    local function fwd(g) return lib.qg_gru_forward(ctx, y.t, 0, hs.t, g and gates.t or nil, nil, x.t, W.t, R.t, bx.t, br.t, nil, nil, 0) end
    local function bwd() return lib.qg_gru_backward(ctx, dx.t, dW.t, dR.t, dbx.t, dbr.t, nil, dy.t, 0, nil, x.t, W.t, R.t, hs.t, gates.t, nil, 0) end
    local function run(f) local st = f(); if st ~= lib.QG_OK then error(ffi.string(lib.qg_last_error(ctx)), 0) end end
    local function measure(label, K, NB, S, path, storage)
      qgru.setKernelPath(path)
      clib.check(ctx, lib.qg_ctx_set_persist_shape(ctx, K, NB, S, storage or 0))
      local f = timed(function() run(function() return fwd(false) end) end)
      local okf = pcall(run, function() return fwd(true) end)
      local b = okf and timed(function() run(bwd) end) or "n/a"
      clib.check(ctx, lib.qg_ctx_set_persist_shape(ctx, 0, 0, 0, 0))
      if type(f) == "number" or type(b) == "number" then
        rows[#rows + 1] = { shape = name, label = label, K = K, NB = NB, S = S, storage = storage or 0, fwd_ms = f, bwd_ms = b }
      end
      return f, b
    end
    local fa, ba = measure("auto", 0, 0, 0, "auto")
    local ff, bf = measure("fallback", 0, 0, 0, "fallback")
    local fs, bs = measure("auto-smem", 0, 0, 0, "persistent", 1)
    local fr, br_ = measure("auto-regs", 0, 0, 0, "persistent", 2)
    md[#md + 1] = string.format("%s (T%d N%d C%d H%d): auto fwd %s bwd %s; fallback fwd %s bwd %s; best-estimate R in shared "
                                .. "memory fwd %s bwd %s, in registers fwd %s bwd %s", name, T, N, C, H, fmt(fa), fmt(ba),
                                fmt(ff), fmt(bf), fmt(fs), fmt(bs), fmt(fr), fmt(br_))
    log(md[#md])
    local res = {}
    for _, K in ipairs({ 1, 2, 4, 8, 16 }) do
      for _, NB in ipairs({ 1, 2, 4, 8 }) do
        if NB <= 2 * N then
          for _, st in ipairs({ { 1, { 0, 8, 32 } }, { 2, { 4, 8, 16, 32 } } }) do
            for _, S in ipairs(st[2]) do
              local f, b = measure("forced", K, NB, S, "persistent", st[1])
              if type(f) == "number" then res[#res + 1] = { K = K, NB = NB, S = S, st = st[1], f = f, b = b } end
            end
          end
        end
      end
    end
    for _, key in ipairs({ "f", "b" }) do
      table.sort(res, function(p, q)
        local a, c = type(p[key]) == "number" and p[key] or 1e9, type(q[key]) == "number" and q[key] or 1e9
        return a < c
      end)
      local line = {}
      for i = 1, math.min(10, #res) do
        local r = res[i]
        line[#line + 1] = string.format("%s K%d NB%d S%d: %s", r.st == 2 and "reg" or "smem", r.K, r.NB, r.S, fmt(r[key]))
      end
      md[#md + 1] = string.format("  best %s: %s", key == "f" and "fwd" or "bwd", table.concat(line, " | "))
      log(md[#md])
    end
  end
  qgru.setKernelPath("auto")
  local f = assert(io.open(dir .. "/sweep.md", "w")); f:write(table.concat(md, "\n"), "\n"); f:close()
  json.write(dir .. "/sweep.json", json.array(rows))
  return
end

local rows = {}
for _, name in ipairs(shapes) do
  local sh = SHAPES[name]
  local T, N, C, H = sh[1], sh[2], sh[3], sh[4]
  qgru.seed(1)
  local model = nn.GRU(C, H, { device = "cuda" })
  local x = Tensor.new({ T, N, C }, "f32"):normal(0, 1):to("cuda")
  local gout = Tensor.new({ T, N, H }, "f32"):normal(0, 1 / (T * N * H)):to("cuda")
  for _, mode in ipairs(modes) do
    qgru.setMath(mode)
    for _, path in ipairs(opt.paths and { "auto", "persistent", "fallback" } or { "auto" }) do
      qgru.setKernelPath(path)
      model:training()
      local train = timed(function() model:forward(x); model:backward(x, gout) end)
      model:evaluate()
      local infer = timed(function() model:forward(x) end)
      local row = { shape = name, T = T, N = N, C = C, H = H, math = mode, path = path, kind = "float",
                    train_ms = train, infer_ms = infer }
      rows[#rows + 1] = row
      log(string.format("%-10s %-6s %-10s float  train %s  infer %s", name, mode, path, fmt(train), fmt(infer)))
    end
    qgru.setKernelPath("auto")
    if not opt.float_only then
      local train, infer, frozen
      local ok, err = pcall(function()
        qgru.seed(1)
        local mq = nn.GRU(C, H, { device = "cuda" })
        quant.prepare(mq, quant.uniform(8))
        quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
        mq:training()
        train = timed(function() mq:forward(x); mq:backward(x, gout) end)
        mq:evaluate()
        infer = timed(function() mq:forward(x) end)
        -- a finished model (quantizers fixed, as after quant.load of exported parameters): the
        -- weight quantizers no longer follow the weights, so no per-channel re-derivation
        quant.freeze(mq)
        frozen = timed(function() mq:forward(x) end)
      end)
      if not ok then
        local msg = tostring(err)
        local na = (msg:find("not in this build", 1, true) or msg:find("unsupported", 1, true)) and "n/a (not in this build)"
                   or ("error: " .. msg:gsub("\n.*", ""):sub(1, 160))
        train, infer, frozen = na, na, na
      end
      rows[#rows + 1] = { shape = name, T = T, N = N, C = C, H = H, math = mode, path = "auto", kind = "qat-int8",
                          train_ms = train, infer_ms = infer, frozen_infer_ms = frozen }
      log(string.format("%-10s %-6s %-10s int8   train %s  infer %s  frozen %s", name, mode, "auto", fmt(train), fmt(infer),
                        fmt(frozen)))
    end
  end
  qgru.setMath("strict")
end

local md = { string.format("GPU, one GRU layer (nn.GRU(C, H)), median of %d after %d warm-up (ms, CUDA events); train = forward + backward",
                           opt.repeats, opt.warmup), "",
             "| shape | T N C H | math | recurrence | float train | float infer | QAT int8 train | int8 infer | int8 infer frozen |",
             "|---|---|---|---|---|---|---|---|---|" }
for _, name in ipairs(shapes) do
  for _, mode in ipairs(modes) do
    local q
    for _, r in ipairs(rows) do if r.shape == name and r.math == mode and r.kind == "qat-int8" then q = r end end
    for _, r in ipairs(rows) do
      if r.shape == name and r.math == mode and r.kind == "float" then
        local qt, qi, qf = "", "", ""
        if q and r.path == "auto" then qt, qi, qf = fmt(q.train_ms), fmt(q.infer_ms), fmt(q.frozen_infer_ms) end
        md[#md + 1] = string.format("| %s | %d %d %d %d | %s | %s | %s | %s | %s | %s | %s |", name, r.T, r.N, r.C, r.H, mode,
                                    r.path, fmt(r.train_ms), fmt(r.infer_ms), qt, qi, qf)
      end
    end
  end
end
write(md, rows)
