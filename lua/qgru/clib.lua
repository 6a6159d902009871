-- clib.lua: loads libqgru through the LuaJIT FFI. The declarations come from core/qgru.h (the
-- region between the QGRU_CDEF markers), never from a hand-copied cdef; the library's ABI
-- version is checked against the header's. Also: check(), which turns a failing qg_status into
-- a Lua error carrying the C message, and the per-device contexts.
local ffi = require("ffi")

local M = {}

-- The project root, from this file's own path (lua/qgru/clib.lua).
local function project_root()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  if src:sub(1, 1) ~= "/" then src = "./" .. src end
  return src:match("^(.*)/lua/qgru/clib%.lua$") or "."
end
M.root = os.getenv("QGRU_ROOT") or project_root()

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local header_path = os.getenv("QGRU_HEADER") or (M.root .. "/core/qgru.h")
local header = read_file(header_path)
if not header then error("qgru: cannot read the C API header " .. header_path .. " (set QGRU_HEADER)", 0) end
local cdef = header:match("/%* QGRU_CDEF_BEGIN %*/(.-)/%* QGRU_CDEF_END %*/")
if not cdef then error("qgru: " .. header_path .. " has no QGRU_CDEF_BEGIN/END region", 0) end
ffi.cdef(cdef)

local lib_path = os.getenv("QGRU_LIB") or (M.root .. "/build/libqgru.so")
local ok, lib = pcall(ffi.load, lib_path)
if not ok then
  error("qgru: cannot load " .. lib_path .. " (" .. tostring(lib) .. "); build it with ./qgru or set QGRU_LIB", 0)
end
M.lib = lib
M.ffi = ffi

local abi = lib.qgru_abi_version()
if abi ~= lib.QGRU_ABI_VERSION then
  error(string.format("qgru: %s has ABI version %d but %s declares %d; rebuild", lib_path, abi, header_path,
                      lib.QGRU_ABI_VERSION), 0)
end

M.dtypes = { f32 = lib.QG_F32, f64 = lib.QG_F64, i8 = lib.QG_I8, u8 = lib.QG_U8, i16 = lib.QG_I16,
             i32 = lib.QG_I32, i64 = lib.QG_I64 }
M.dtype_names = {}
for k, v in pairs(M.dtypes) do M.dtype_names[tonumber(v)] = k end
M.ctypes = { f32 = "float", f64 = "double", i8 = "int8_t", u8 = "uint8_t", i16 = "int16_t", i32 = "int32_t",
             i64 = "int64_t" }
M.devices = { cpu = lib.QG_CPU, cuda = lib.QG_CUDA }
M.device_names = { [tonumber(lib.QG_CPU)] = "cpu", [tonumber(lib.QG_CUDA)] = "cuda" }

local contexts = {}
local default_seed = 0
local math_mode = "strict"
local math_modes = { strict = lib.QG_MATH_STRICT, tf32 = lib.QG_MATH_TF32 }
local kernel_path = "auto"
local kernel_paths = { auto = lib.QG_PATH_AUTO, persistent = lib.QG_PATH_PERSISTENT, fallback = lib.QG_PATH_FALLBACK }

-- The context for a device, created on first use.
function M.context(device)
  device = device or "cpu"
  local ctx = contexts[device]
  if ctx then return ctx end
  local dev = M.devices[device]
  if not dev then error("qgru: unknown device '" .. tostring(device) .. "' (expected 'cpu' or 'cuda')", 3) end
  local out = ffi.new("qg_ctx*[1]")
  local why = ffi.new("char[1024]")
  local st = lib.qg_ctx_create_why(out, dev, 0, default_seed, why, 1024)
  if st ~= lib.QG_OK then
    local reason = ffi.string(why)
    if reason == "" then reason = ffi.string(lib.qg_status_name(st)) end
    error("qgru: cannot create a " .. device .. " context: " .. reason, 3)
  end
  ctx = ffi.gc(out[0], lib.qg_ctx_destroy)
  M.check(ctx, lib.qg_ctx_set_math(ctx, math_modes[math_mode]), 2)
  M.check(ctx, lib.qg_ctx_set_kernel_path(ctx, kernel_paths[kernel_path]), 2)
  contexts[device] = ctx
  return ctx
end

-- "strict" (fp32, the default) or "tf32": the precision of the float GEMMs on the GPU, for every
-- context, existing or future.
function M.set_math(mode)
  local m = math_modes[mode]
  if not m then error("qgru.setMath: expected 'strict' or 'tf32', got " .. tostring(mode), 3) end
  for _, ctx in pairs(contexts) do M.check(ctx, lib.qg_ctx_set_math(ctx, m), 3) end
  math_mode = mode
end
function M.math() return math_mode end

-- "auto" | "persistent" | "fallback": which GPU recurrence the GRUs run (tests force each).
function M.set_kernel_path(path)
  local p = kernel_paths[path]
  if not p then error("qgru.setKernelPath: expected 'auto', 'persistent' or 'fallback', got " .. tostring(path), 3) end
  for _, ctx in pairs(contexts) do M.check(ctx, lib.qg_ctx_set_kernel_path(ctx, p), 3) end
  kernel_path = path
end
function M.kernel_path() return kernel_path end

function M.cuda_available()
  return lib.qgru_has_cuda() ~= 0 and lib.qg_cuda_device_count() > 0
end

-- Raises a Lua error for a failing status; level 2 points at the caller of the caller.
function M.check(ctx, status, level)
  if status ~= lib.QG_OK then
    error("qgru: " .. ffi.string(lib.qg_last_error(ctx)), (level or 2) + 1)
  end
end

-- Seeds the RNG of every context (existing and future).
function M.seed(seed)
  default_seed = seed
  for _, ctx in pairs(contexts) do lib.qg_rng_seed(ctx, seed) end
end

function M.wall_time() return lib.qg_wall_time() end

return M
