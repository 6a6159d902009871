-- quant/calibrate.lua: calibration of a prepared model (QUANT_SPEC.md section 5): weights per
-- channel from their values, then the activation quantizers from statistics that the forwards
-- observe (pass 1 on the float recurrence, later passes on the quantized one). The statistics
-- live on the model's device; only the (e, z) search reads them on the host.
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local GRUQuant = require("qgru.quant.gru_state")

local ffi, lib = clib.ffi, clib.lib

local M = {}

-- Iterates calibration inputs: an array of input tensors, or a Dataset (opts.batches batches
-- of opts.batch_size, in order).
local function inputs_of(data, opts)
  if type(data) == "table" and data.batches then
    local list = {}
    local n = 0
    for x in data:batches(opts.batch_size or 256) do
      n = n + 1
      list[n] = x:clone()
      if n >= (opts.batches or 8) then break end
    end
    return list
  end
  if type(data) ~= "table" or #data == 0 then
    error("qgru: quant.calibrate: expected a Dataset or a non-empty array of input tensors", 4)
  end
  return data
end

local CALIB_OPTS = { method = true, passes = true, weight_method = true, percentile = true, batches = true, batch_size = true,
                     verbose = true, progress = true }

-- Calibration (QUANT_SPEC.md section 5). opts: method ("histogram" | "minmax" | "mse" |
-- "percentile", default histogram), passes (default 2), weight_method (default "minmax"),
-- percentile (99.99), batches / batch_size (for a Dataset), progress (a function(done, total)
-- called after every forward of the calibration sweeps). Returns a report:
-- {{name=, method=, e=, z=, lo=, hi=, pass=}, ...}.
-- model: the model; list: its GRUs ({gru =, prefix =}, from quant.grus, at least one).
function M.run(model, list, data, opts)
  opts = opts or {}
  for k in pairs(opts) do
    if not CALIB_OPTS[k] then error("qgru: quant.calibrate: unknown option '" .. tostring(k) .. "'", 3) end
  end
  local method = opts.method or "histogram"
  local wmethod = opts.weight_method or "minmax"
  for _, m in ipairs({ method, wmethod }) do
    if not GRUQuant.METHODS[m] then error("qgru: quant.calibrate: unknown method '" .. tostring(m) .. "' (minmax, histogram, mse, percentile)", 3) end
  end
  local passes = opts.passes or 2
  if type(passes) ~= "number" or passes < 1 or passes % 1 ~= 0 then error("qgru: quant.calibrate: passes must be a positive integer", 3) end
  local pct = opts.percentile or 99.99
  if opts.progress ~= nil and type(opts.progress) ~= "function" then
    error("qgru: quant.calibrate: progress must be a function(done, total), got " .. type(opts.progress), 3)
  end
  for _, g in ipairs(list) do
    if not g.gru.qstate then error("qgru: quant.calibrate: call quant.prepare(model, cfg) first", 3) end
  end
  local inputs = inputs_of(data, opts)
  local was_training = model.train
  model:evaluate()
  local report = {}
  -- weights first: per channel, from their values
  for _, g in ipairs(list) do
    local st = g.gru.qstate
    st.weight_method = wmethod
    for lq in st:each() do
      for _, q in ipairs(lq.w) do if q:calibratable() then q.calibrated = false; q.method = wmethod end end
      lq:calibrateWeights(wmethod, pct)
    end
  end
  local needs_hist = method ~= "minmax"
  local total, done = passes * (needs_hist and 2 or 1) * #inputs, 0
  -- calibration inputs may come from the host (a Dataset's batches): each moves to the model's
  -- device through one staging buffer
  local device, staging = model:device(), {}
  local function forward(x)
    if getmetatable(x) == Tensor and x:device() ~= device then
      x = require("qgru.train").toDevice(staging, "x", x, device)
    end
    model:forward(x)
    done = done + 1
    if opts.progress then opts.progress(done, total) end
  end
  for pass = 1, passes do
    for _, g in ipairs(list) do
      g.gru.qstate.mode = pass == 1 and "calib_float" or "calib_quant"
      for lq in g.gru.qstate:each() do
        local ctx = clib.context(lq.device)
        lq.gru:ccall(ctx, lib.qg_stats_reset(ctx, lq.stats))
      end
    end
    local ok, err = pcall(function()
      for _, x in ipairs(inputs) do forward(x) end
      if needs_hist then
        for _, g in ipairs(list) do
          for lq in g.gru.qstate:each() do
            local ctx = clib.context(lq.device)
            lq.gru:ccall(ctx, lib.qg_stats_begin_histogram(ctx, lq.stats))
          end
        end
        for _, x in ipairs(inputs) do forward(x) end
      end
    end)
    if not ok then
      for _, g in ipairs(list) do g.gru.qstate.mode = "qat" end
      if was_training then model:training() end
      error(err, 0)
    end
    local e32, z32, cost = ffi.new("int32_t[1]"), ffi.new("int32_t[1]"), ffi.new("double[1]")
    for _, g in ipairs(list) do
      for lq in g.gru.qstate:each() do
        local ctx = clib.context(lq.device)
        local range = lq.range:device() == "cpu" and lq.range or lq.range:to("cpu")
        local sp = range:ptr()
        for i, q in ipairs(lq.act) do
          if q:calibratable() then
            lq.gru:ccall(ctx, lib.qg_calibrate_row(ctx, e32, z32, cost, lq.stats, i - 1, q.bitwidth, q.is_symmetric and 1 or 0,
                                                   q.is_unsigned and 1 or 0, GRUQuant.METHODS[method], pct))
            local lo, hi = Tensor.readF64(sp, (i - 1) * 4), Tensor.readF64(sp, (i - 1) * 4 + 1)
            q:set(e32[0], z32[0], { method = method, range = { lo, hi } })
            q.passes = pass
            if pass == passes then
              report[#report + 1] = { name = g.prefix .. q.name, method = method, e = e32[0], z = z32[0], lo = lo, hi = hi, pass = pass }
            end
          end
        end
        Tensor.keepAlive(range)   -- a host copy read through sp: alive until here
      end
    end
  end
  for _, g in ipairs(list) do g.gru.qstate.mode = "qat"; g.gru:clearState() end
  if was_training then model:training() end
  return report
end

return M
