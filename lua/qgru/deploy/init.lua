-- deploy: the trained integer GRU for devices, bit-exact with qgru's integer forward.
--   local deploy = require("qgru.deploy")
--   deploy.exportC(model, "out/c", {name = "fmnist_gru"})      -- C99 module + .npy driver
--   deploy.exportONNX(model, "out/onnx", {python = "python3"})  -- integer ONNX + QDQ ONNX
-- Both refuse, naming the operator, what is not integer-deployable (deploy/model.lua) or what the
-- format cannot hold exactly (deploy/c99.lua: 64-bit integers; deploy/onnx_data.lua: float32's
-- exact integers and 8/16-bit QuantizeLinear outputs).
local model_desc = require("qgru.deploy.model")
local c99 = require("qgru.deploy.c99")
local onnx_data = require("qgru.deploy.onnx_data")
local spawn = require("qgru.deploy.spawn")
local serialize = require("qgru.serialize")

local M = { describe = model_desc.describe, c99 = c99, onnx_data = onnx_data, spawn = spawn }

local function root()
  local here = debug.getinfo(1, "S").source:gsub("^@", "")
  return os.getenv("QGRU_ROOT") or here:match("^(.*)/lua/qgru/deploy/[^/]*$") or "."
end
M.root = root

-- Writes dir/<name>.h, .c and _main.c. opts: name (C prefix), source_info. When
-- arm-none-eabi-gcc is on PATH (or opts.arm_gcc names it), also compiles the module for a
-- Cortex-M4 (-mcpu=cortex-m4 -mthumb -Os) and reads its size: info.arm = {text, data, bss}.
-- Returns paths, info.
function M.exportC(model, dir, opts)
  opts = opts or {}
  serialize.mkdir(dir)
  local desc = model_desc.describe(model, { what = "export c" })
  local paths, info = c99.write(desc, dir, opts)
  local gcc = opts.arm_gcc or spawn.which("arm-none-eabi-gcc")
  if gcc and opts.arm ~= false then
    local obj = dir .. "/" .. info.name .. ".cortex-m4.o"
    local log = dir .. "/" .. info.name .. ".cortex-m4.log"
    local rc = spawn.run({ gcc, "-mcpu=cortex-m4", "-mthumb", "-Os", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c",
                           paths.source, "-o", obj }, { stdout = log, stderr = log })
    if rc ~= 0 then error("qgru: export c: arm-none-eabi-gcc failed on " .. paths.source .. " (see " .. log .. ")", 0) end
    local size = gcc:gsub("gcc$", "size")
    local out = dir .. "/" .. info.name .. ".cortex-m4.size"
    rc = spawn.run({ size, obj }, { stdout = out })
    if rc == 0 then
      local f = io.open(out)
      local text = f:read("*a")
      f:close()
      local t, d, b = text:match("\n%s*(%d+)%s+(%d+)%s+(%d+)")
      info.arm = { text = tonumber(t), data = tonumber(d), bss = tonumber(b), object = obj }
    end
  end
  return paths, info
end

-- Writes the model data (dir/model.json + .npy) and runs tools/onnx_export.py to build
-- dir/model.onnx (integer, bit-exact) and dir/model_qdq.onnx (the QDQ approximation).
-- opts: python (default $QGRU_PYTHON or python3), unroll (a fixed T), dot (also a Graphviz file),
-- source_info, qdq_only (only the QDQ approximation: for models whose integers exceed float32's
-- exact range). Returns {json, onnx (nil with qdq_only), qdq, opset}.
function M.exportONNX(model, dir, opts)
  opts = opts or {}
  serialize.mkdir(dir)
  local desc = model_desc.describe(model, { what = "export onnx" })
  local json_path, opset = onnx_data.write(desc, dir, opts)
  local python = opts.python or os.getenv("QGRU_PYTHON") or "python3"
  local argv = { python, root() .. "/tools/onnx_export.py", dir, "--qdq", dir .. "/model_qdq.onnx" }
  if opts.qdq_only then argv[#argv + 1] = "--qdq_only" else argv[#argv + 1] = "--out"; argv[#argv + 1] = dir .. "/model.onnx" end
  if opts.unroll then argv[#argv + 1] = "--unroll"; argv[#argv + 1] = tostring(opts.unroll) end
  if opts.dot then argv[#argv + 1] = "--dot"; argv[#argv + 1] = opts.dot end
  local rc, err = spawn.run(argv)
  if rc ~= 0 then
    error(string.format("qgru: export onnx: %s failed (%s); the model data is in %s (python3 tools/onnx_export.py %s builds it; it needs pip install onnx numpy)",
                        python, err or ("exit status " .. tostring(rc)), dir, dir), 0)
  end
  return { json = json_path, onnx = not opts.qdq_only and (dir .. "/model.onnx") or nil, qdq = dir .. "/model_qdq.onnx", opset = opset }
end

return M
