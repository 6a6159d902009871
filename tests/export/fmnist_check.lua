-- tests/export/fmnist_check.lua: the Fashion-MNIST main job's model (recipes/qat.lua) exported in both
-- formats reproduces qgru exactly on all 10,000 test sequences:
--   ./qgru tests/export/fmnist_check.lua OUTDIR [--weights runs/qat/model.safetensors] [--qparams runs/qat/qparams.json]
-- qgru's integer forward gives the reference GRU outputs (every step) and predictions; the C99
-- module (gcc -O2, its .npy driver) and the integer ONNX model (onnxruntime; $QGRU_PYTHON with
-- onnxruntime) must give the same float32 bits at every step of every sequence, hence the same
-- features for the head and the same predictions; the QDQ ONNX approximation is reported.
-- Exits non-zero on any difference.
local root = os.getenv("QGRU_ROOT") or "."
package.path = root .. "/tests/lua/?.lua;" .. package.path
local ffi = require("ffi")
local qgru = require("qgru")
local E = require("export_util")
local deploy = require("qgru.deploy")
local quant, zoo, data = qgru.quant, qgru.zoo, qgru.data

local opt = qgru.cli.main(arg, {
  out = { "", "output folder", { nonempty = true } },
  weights = { "runs/qat/model.safetensors", "model weights (recipes/qat.lua)" },
  qparams = { "runs/qat/qparams.json", "quantization parameters" },
  hidden = { 128, "GRU hidden size", { int = true, min = 1 } },
  limit = { 0, "only the first N test sequences (0: all)", { int = true, min = 0 } },
}, "tests/export/fmnist_check.lua --out DIR", nil)
local out = opt.out
qgru.serialize.mkdir(out)
local t0 = qgru.wallTime()

local model = zoo.fmnistGRU(opt.hidden)
qgru.load(model, opt.weights)
quant.prepare(model, quant.uniform(8))
quant.load(model, opt.qparams)
model:evaluate()
local test = data.fashionMNIST("test", { limit = opt.limit > 0 and opt.limit or nil })
local N, T, C = test.x:size(1), 28, 28
local xall = test.x:transpose01()                -- [T, N, C]
data.saveNpy(out .. "/x.npy", xall)
local labels = test.y:ptr()

-- qgru: y of every step (reference) and predictions, in batches
local H, K = opt.hidden, 10
local yref = qgru.zeros({ T, N, H })
local pred_q, correct_q = {}, 0
local gru, last, lin = model.modules[1], model.modules[2], model.modules[3]
local B = 1000
local yr, yp = yref:ptr(), nil
for n0 = 0, N - 1, B do
  local nb = math.min(B, N - n0)
  local xb = test.x:narrow(n0 + 1, nb):transpose01()
  local y = gru:forward(xb)
  yp = y:ptr()
  for t = 0, T - 1 do ffi.copy(yr + (t * N + n0) * H, yp + t * nb * H, nb * H * 4) end
  local logits = lin:forward(last:forward(y)):totable()
  for i = 1, nb do
    local best = 1
    for k = 2, K do if logits[i][k] > logits[i][best] then best = k end end
    pred_q[n0 + i] = best - 1
    if best - 1 == labels[n0 + i - 1] then correct_q = correct_q + 1 end
  end
end
print(string.format("qgru integer forward: test accuracy %.2f%% (%d / %d)", 100 * correct_q / N, correct_q, N))

local failures = 0
local function compare(name, ypath, lpath)
  local y = data.npy(ypath)
  local a, b = ffi.cast("uint32_t *", y:ptr()), ffi.cast("uint32_t *", yref:ptr())
  local diff = 0
  for i = 0, yref:numel() - 1 do if a[i] ~= b[i] then diff = diff + 1 end end
  local lg = data.npy(lpath):totable()
  local same, correct = 0, 0
  for i = 1, N do
    local best = 1
    for k = 2, K do if lg[i][k] > lg[i][best] then best = k end end
    if best - 1 == pred_q[i] then same = same + 1 end
    if best - 1 == labels[i - 1] then correct = correct + 1 end
  end
  print(string.format("%s: GRU outputs %s (%d of %d values differ, all %d steps of %d sequences); predictions equal to qgru's: %d / %d; test accuracy %.2f%%",
                      name, diff == 0 and "bit-exact" or "DIFFER", diff, yref:numel(), T, N, same, N, 100 * correct / N))
  return diff, same, correct
end

-- C99
local paths, info = deploy.exportC(model, out .. "/c", { name = "fmnist_gru", source_info = opt.weights .. " + " .. opt.qparams })
local ok, o = E.run(string.format("cd '%s/c' && gcc -std=c99 -Wall -Wextra -Werror -pedantic -O2 -o fmnist_main fmnist_gru_main.c fmnist_gru.c", out))
assert(ok, o)
local tc = qgru.wallTime()
ok, o = E.run(string.format("'%s/c/fmnist_main' '%s/x.npy' '%s/c_y.npy' --logits '%s/c_logits.npy'", out, out, out, out))
assert(ok, o)
print(string.format("C99 module: %d sequences in %.1f s (gcc -O2, one core)", N, qgru.wallTime() - tc))
if info.arm then
  print(string.format("C99 module on Cortex-M4 (-Os): text+rodata %d B, data %d B, bss %d B; caller-owned state %d B + scratch %d B",
                      info.arm.text, info.arm.data, info.arm.bss, info.state_bytes, info.scratch_bytes))
end
local d, same = compare("C99", out .. "/c_y.npy", out .. "/c_logits.npy")
if d ~= 0 or same ~= N then failures = failures + 1 end

-- ONNX
local py = os.getenv("QGRU_PYTHON") or "python3"
local res = deploy.exportONNX(model, out .. "/onnx", { python = py, dot = out .. "/onnx/model.dot" })
for _, m in ipairs({ { "model.onnx", "onnx" }, { "model_qdq.onnx", "qdq" } }) do
  ok, o = E.run(string.format("'%s' '%s/tests/export/ort_run.py' '%s/onnx/%s' '%s/x.npy' '%s/%s'", py, root, out, m[1], out, out, m[2]))
  assert(ok, o)
  io.write(o)
end
d, same = compare("ONNX integer (opset " .. tostring(res.opset) .. ")", out .. "/onnx.y.npy", out .. "/onnx.logits.npy")
if d ~= 0 or same ~= N then failures = failures + 1 end
compare("ONNX QDQ approximation", out .. "/qdq.y.npy", out .. "/qdq.logits.npy")
print(string.format("done in %.0f s: %s", qgru.wallTime() - t0, failures == 0 and "both exports reproduce qgru exactly" or "FAILED"))
os.exit(failures == 0 and 0 or 1)
