-- recipes/bench.lua: CPU step times of the float GRU and of QAT (integer forward + STE backward)
-- on the default recipe's shape (T = 28, C = 28, H = 128, batch 128), median of repeats, in one
-- run so the ratios compare like with like. Writes runs/<name>/bench.json and bench.md.
--   ./qgru recipes/bench.lua [--repeats 30] [--hidden 128] [--batch 128] [--threads 2] [--float_only]
-- The float rows compare with PyTorch's nn.GRU in /work/shared/tools/bench_torch_cpu.py (same
-- shape, same step: forward, cross-entropy, zero grads, backward, Adam; inference: forward only).
local qgru = require("qgru")
local quant, cli, zoo, optim, json = qgru.quant, qgru.cli, qgru.zoo, qgru.optim, qgru.json

local opt = cli.main(arg, {
  name = { "bench", "run name", { nonempty = true } },
  repeats = { 30, "timed repeats (after 3 warm-up steps)", { int = true, min = 1 } },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  batch = { 128, "batch size", { int = true, min = 1 } },
  threads = { 0, "BLAS threads (0 = default)", { int = true, min = 0 } },
  float_only = { false, "measure the float model only" },
}, "recipes/bench.lua: float vs QAT step time on the CPU")

local dir, log = zoo.run(opt.name)
if opt.threads > 0 then qgru.setNumThreads(opt.threads) end
log("qgru " .. qgru.VERSION .. "  recipes/bench.lua\n" .. cli.describe(opt))
qgru.seed(1)
local T, C, H, N = 28, 28, opt.hidden, opt.batch
local x = qgru.zeros({ T, N, C }):normal(0, 1)
local y = qgru.zeros({ N }, "i64")
for i = 1, N do y:set(i, (i - 1) % 10) end
local crit = qgru.nn.CrossEntropy()

local function median(f)
  for _ = 1, 3 do f() end
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
local f = assert(io.open(dir .. "/bench.md", "w")); f:write(table.concat(md, "\n"), "\n"); f:close()
json.write(dir .. "/bench.json", json.array(rows))
log(table.concat(md, "\n"))
