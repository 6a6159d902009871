-- bench/bidir_qat.lua: a quantized bidirectional GRU layer on the GPU with its two directions in
-- one call (qg_int_gru_forward_bidir / backward_bidir: at the same time, direction 1 on the
-- context's peer) against the same layer with the directions one after the other (the module's
-- path before that call existed, forced here by overriding the state's bidirectional methods),
-- and the float bidirectional layer, in one run. Medians of CUDA-event times after warm-up, ms.
--   luajit bench/bidir_qat.lua [repeats] [TxNxCxH ...]
-- Shapes default to user-like bidirectional ones (keyword spotting, speech, the issue's medium and
-- large). bench/cudnn_shapes.py --bidir times cuDNN's bidirectional GRU on the same tokens.
local qgru = require("qgru")
local nn, quant = qgru.nn, qgru.quant

local REPS = tonumber(arg[1]) or 20
local SHAPES = {}
for i = 2, #arg do SHAPES[#SHAPES + 1] = arg[i] end
if #SHAPES == 0 then
  SHAPES = { "100x32x40x64", "100x128x40x128", "100x64x80x256", "50x32x64x128", "100x4x128x256", "200x64x80x384",
             "100x64x256x512", "100x256x512x1024" }
end
if not qgru.cudaAvailable() then error("bench/bidir_qat.lua: no CUDA device", 0) end

local function median(f)
  for _ = 1, 3 do f() end
  local t = {}
  for i = 1, REPS do t[i] = qgru.deviceTime(f, "cuda") end
  table.sort(t)
  return t[math.floor(#t / 2) + 1]
end

-- The directions one after the other: the per-direction calls the module made before.
local function one_by_one(q)
  q.forwardBidir = function(self, ctx, l, y, inp, h0, lengths, hn, training)
    for d = 0, 1 do
      self:forwardLayer(ctx, l, d, y, inp, h0 and h0:select(l * 2 + d + 1) or nil, lengths, hn:select(l * 2 + d + 1), training)
    end
  end
  q.backwardBidir = function(self, ctx, l, dx, dy, dh0)
    for d = 0, 1 do self:backwardLayer(ctx, l, d, dx, dy, dh0 and dh0:select(l * 2 + d + 1) or nil) end
  end
end

print(string.format("one bidirectional GRU layer, strict math, medians of %d after 3 warm-up (ms, CUDA events)", REPS))
print("| T N C H | float train | float infer | QAT train, one by one | QAT train, at once | ratio | int8 infer, one by one | at once | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for _, tok in ipairs(SHAPES) do
  local T, N, C, H = tok:match("^(%d+)x(%d+)x(%d+)x(%d+)$")
  assert(T, "bench/bidir_qat.lua: shape '" .. tok .. "' is not TxNxCxH")
  T, N, C, H = tonumber(T), tonumber(N), tonumber(C), tonumber(H)
  qgru.seed(1)
  local x = qgru.zeros({ T, N, C }, "f32", "cpu"):normal(0, 1):to("cuda")
  local gout = qgru.zeros({ T, N, 2 * H }, "f32", "cpu"):normal(0, 1 / (T * N * H)):to("cuda")
  local model = nn.GRU(C, H, { bidirectional = true, device = "cuda" })
  model:training()
  local ft = median(function() model:forward(x); model:backward(x, gout) end)
  model:evaluate()
  local fi = median(function() model:forward(x) end)
  local r = {}
  for _, mode in ipairs({ "one", "once" }) do
    qgru.seed(1)
    local mq = nn.GRU(C, H, { bidirectional = true, device = "cuda" })
    quant.prepare(mq, quant.uniform(8))
    quant.calibrate(mq, { x }, { method = "minmax", passes = 1 })
    if mode == "one" then one_by_one(mq.qstate) end
    mq:training()
    local tr = median(function() mq:forward(x); mq:backward(x, gout) end)
    mq:evaluate()
    r[mode] = { train = tr, infer = median(function() mq:forward(x) end) }
    mq.qstate:free()
  end
  print(string.format("| %d %d %d %d | %.3f | %.3f | %.3f | %.3f | %.2fx | %.3f | %.3f | %.2fx |", T, N, C, H, ft, fi, r.one.train,
                      r.once.train, r.one.train / r.once.train, r.one.infer, r.once.infer, r.one.infer / r.once.infer))
  io.stdout:flush()
end
