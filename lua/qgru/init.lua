-- qgru: quantization-aware training of GRU networks, driven from LuaJIT.
--   local qgru = require("qgru")
--   local nn, optim, data, train = qgru.nn, qgru.optim, qgru.data, qgru.train
-- The package sets no globals.
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local serialize = require("qgru.serialize")

local qgru = {
  VERSION = "0.1.0",
  Tensor = Tensor,
  nn = require("qgru.nn"),
  optim = require("qgru.optim"),
  data = require("qgru.data"),
  train = require("qgru.train"),
  serialize = serialize,
  cli = require("qgru.cli"),
  json = require("qgru.json"),
}
qgru.quant = require("qgru.quant")
qgru.zoo = require("qgru.zoo")
qgru.rundir = require("qgru.rundir")       -- run directories of the recipes (runs/<name>/)
qgru.progress = require("qgru.progress")   -- progress bars on a terminal

local device = "cpu"

-- "cpu" | "cuda": where new models (nn constructors without a device option) and new tensors
-- (qgru.zeros, qgru.tensor, qgru.rand, qgru.randn) go by default. Existing objects stay where they
-- are: move a model with model:to(device). The default at load: the environment variable
-- QGRU_DEVICE (cpu | cuda) when set, else cuda when a CUDA device is present, else cpu.
function qgru.setDevice(d)
  if d ~= "cpu" and d ~= "cuda" then error("qgru.setDevice: expected 'cpu' or 'cuda', got " .. tostring(d), 2) end
  if d == "cuda" and not clib.cuda_available() then
    error("qgru.setDevice: no CUDA device (" .. (clib.lib.qgru_has_cuda() == 0 and "libqgru was built without CUDA" or "none visible") .. ")", 2)
  end
  device = d
  qgru.nn.Module.setDefaultDevice(d)
end
function qgru.device() return device end

do
  local env = os.getenv("QGRU_DEVICE")
  if env ~= nil and env ~= "" then
    if env ~= "cpu" and env ~= "cuda" then error("qgru: QGRU_DEVICE must be 'cpu' or 'cuda', got '" .. env .. "'", 0) end
    local ok, err = pcall(qgru.setDevice, env)
    if not ok then error("qgru: QGRU_DEVICE=" .. env .. ": " .. tostring(err):gsub("^qgru%.setDevice: ", ""), 0) end
  elseif clib.cuda_available() then
    qgru.setDevice("cuda")
  end
end
function qgru.cudaAvailable() return clib.cuda_available() end

-- "strict" | "tf32": the float GEMMs on the GPU (float GRU, Linear, the STE backward) in strict
-- fp32 (the default; the large STE-backward GEMMs as exact int8 split products, at least as
-- accurate: core/qgru.h, qg_exact_split) or with TF32 tensor cores. The integer forward is exact
-- in both; the CPU ignores it.
function qgru.setMath(mode) clib.set_math(mode) end
function qgru.math() return clib.math() end
-- "auto" | "persistent" | "fallback": the GPU recurrence of the GRUs (auto picks by shape).
function qgru.setKernelPath(path) clib.set_kernel_path(path) end
function qgru.kernelPath() return clib.kernel_path() end

-- Milliseconds that f() takes on a device ("cpu" or "cuda"; default the current one), as the
-- device sees it: on a GPU, CUDA events on the device's stream around the work f enqueues (the
-- method of torch.cuda.Event, so the figures compare with PyTorch's), on the CPU the wall clock.
-- Waits for the device before returning. Returns ms, then f's first result.
function qgru.deviceTime(f, dev)
  local ctx = clib.context(dev or device)
  clib.check(ctx, clib.lib.qg_ctx_timer_start(ctx), 2)
  local r = f()
  local ms = clib.ffi.new("double[1]")
  clib.check(ctx, clib.lib.qg_ctx_timer_stop(ctx, ms), 2)
  return ms[0], r
end

-- Seeds the RNG used for initialisation (and everything else drawn from the contexts).
function qgru.seed(s) clib.seed(s) end

function qgru.zeros(shape, dtype, dev) return Tensor.new(shape, dtype, dev or device) end
function qgru.tensor(tbl, dtype, dev) return Tensor.from(tbl, dtype, dev or device) end
function qgru.randn(shape, dtype, dev) return Tensor.new(shape, dtype, dev or device):normal(0, 1) end
function qgru.rand(shape, dtype, dev) return Tensor.new(shape, dtype, dev or device):uniform(0, 1) end

-- BLAS threads for the CPU backend.
function qgru.setNumThreads(n) clib.check(clib.context("cpu"), clib.lib.qg_set_num_threads(clib.context("cpu"), n)) end

qgru.save = serialize.saveModel             -- qgru.save(model, path)
qgru.load = serialize.loadModel             -- qgru.load(model, path)
qgru.importTorchGRU = serialize.importTorchGRU
qgru.mkdir = serialize.mkdir               -- qgru.mkdir(path): mkdir -p without a shell
qgru.wallTime = clib.wall_time

return qgru
