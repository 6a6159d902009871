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
  local json_path = onnx_data.write(desc, dir, opts)
  local python = opts.python or os.getenv("QGRU_PYTHON") or "python3"
  local argv = { python, root() .. "/tools/onnx_export.py", dir, "--qdq", dir .. "/model_qdq.onnx" }
  if opts.qdq_only then argv[#argv + 1] = "--qdq_only" else argv[#argv + 1] = "--out"; argv[#argv + 1] = dir .. "/model.onnx" end
  if opts.unroll then argv[#argv + 1] = "--unroll"; argv[#argv + 1] = tostring(opts.unroll) end
  if opts.dot then argv[#argv + 1] = "--dot"; argv[#argv + 1] = opts.dot end
  local log = dir .. "/onnx_export.log"
  local rc, err = spawn.run(argv, { stdout = log, stderr = log })
  local f = io.open(log)
  local text = f and f:read("*a") or ""
  if f then f:close() end
  if rc ~= 0 then
    local refusal = text:match("(qgru: export onnx: [^\n]*)")
    if refusal then error(refusal, 0) end
    error(string.format("qgru: export onnx: %s failed (%s): %s\nthe model data is in %s (python3 tools/onnx_export.py %s builds it; it needs pip install onnx numpy)",
                        python, err or ("exit status " .. tostring(rc)), text:gsub("%s+$", ""):sub(-2000), dir, dir), 0)
  end
  local opset = tonumber(text:match("model%.onnx %(opset (%d+)")) or tonumber(text:match("QDQ approximation, opset (%d+)"))
  return { json = json_path, onnx = not opts.qdq_only and (dir .. "/model.onnx") or nil, qdq = dir .. "/model_qdq.onnx", opset = opset,
           log = log }
end

-- recipes/export.lua's deployment formats (opt.format "c", "onnx" or "all"; opt.c_name, opt.unroll,
-- opt.qdq_only, opt.python): writes dir/c/ and / or dir/onnx/ and logs what it wrote.
function M.recipe(model, dir, opt, log)
  local src = string.format("%s + %s", opt.weights, opt.qparams)
  if opt.format == "c" or opt.format == "all" then
    local paths, info = M.exportC(model, dir .. "/c", { name = opt.c_name, source_info = src })
    log(string.format("wrote %s, %s, %s (scratch %d B, state %d B)", paths.header, paths.source, paths.driver, info.scratch_bytes,
                      info.state_bytes))
    for _, line in ipairs(info.plan) do log("  " .. line) end
    if info.arm then
      log(string.format("Cortex-M4 (arm-none-eabi-gcc -mcpu=cortex-m4 -mthumb -Os): flash %d B (text + rodata %d, data %d), RAM %d B static + %d B caller-owned (state %d, scratch %d)%s",
                        info.arm.text + info.arm.data, info.arm.text, info.arm.data, info.arm.data + info.arm.bss,
                        info.state_bytes + info.scratch_bytes, info.state_bytes, info.scratch_bytes,
                        info.work_per_step_bytes > 0 and string.format(" + %d B of work per time step for %s_sequence", info.work_per_step_bytes, info.name) or ""))
    else
      log("(no arm-none-eabi-gcc on PATH: no Cortex-M4 size; apt-get install gcc-arm-none-eabi)")
    end
  end
  if opt.format == "onnx" or opt.format == "all" then
    local r = M.exportONNX(model, dir .. "/onnx", { python = opt.python ~= "" and opt.python or nil, unroll = opt.unroll > 0 and opt.unroll or nil,
                                                  qdq_only = opt.qdq_only, source_info = src })
    log(string.format("wrote %s%s (opset %d), %s", r.onnx and (r.onnx .. ", ") or "", r.qdq, r.opset, r.json))
  end
end

return M
