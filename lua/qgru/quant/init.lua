-- quant: quantization-aware training of GRUs (../shared/QUANT_SPEC.md).
--   local cfg = quant.config("config/int8.json")      -- or quant.uniform(8, {weight_bits = 4})
--   quant.prepare(model, cfg)                           -- attaches quantizers to every nn.GRU
--   quant.calibrate(model, dataset, {method = "histogram", passes = 2})
--   ... training now runs the integer forward and the straight-through backward (QAT)
--   quant.export(model, "qparams.json")                 -- {format = "qgru" | "aimet"}
--   quant.exportWeights(model, "codes.safetensors")     -- integer weight codes
--   quant.load(fresh_model, "qparams.json")             -- exact restore, no recalibration
--   for _, e in ipairs(quant.quantizers(model)) do print(e.name, e.quantizer) end
--   quant.get(model, "1.l0.fwd.gate.z_out"):setBitwidth(10)
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local nn = require("qgru.nn")
local config = require("qgru.quant.config")
local GRUQuant = require("qgru.quant.gru_state")

local ffi, lib = clib.ffi, clib.lib

local quant = {}

quant.OPS = config.OPS
quant.config = config.load
quant.fromTable = config.fromTable
quant.uniform = function(bits, opts) return config.uniform(bits, opts) end
quant.describeConfig = config.describe

-- The GRUs of a model with their parameter-name prefixes ("1." inside a Sequential, "" alone).
local function grus(model)
  if model:isInstanceOf(nn.GRU) then return { { gru = model, prefix = "" } } end
  local out = {}
  for _, e in ipairs(model:namedParameters()) do
    if e.module and e.module:isInstanceOf(nn.GRU) then
      local prefix = e.name:sub(1, #e.name - #e.local_name)
      if not out[#out] or out[#out].gru ~= e.module then out[#out + 1] = { gru = e.module, prefix = prefix } end
    end
  end
  return out
end
quant.grus = grus

local function need_grus(model, fn)
  local g = grus(model)
  if #g == 0 then error("qgru: quant." .. fn .. ": the model has no nn.GRU", 3) end
  return g
end

-- Attaches fresh quantizers (from cfg) to every GRU of the model. Nothing changes on error.
function quant.prepare(model, cfg)
  if type(cfg) == "string" then cfg = config.load(cfg) end
  if type(cfg) ~= "table" or not cfg.ops then error("qgru: quant.prepare: expected a config (quant.config or quant.uniform)", 2) end
  local states = {}
  for i, g in ipairs(need_grus(model, "prepare")) do
    states[i] = { gru = g.gru, state = GRUQuant.new(g.gru, cfg) }
  end
  for _, s in ipairs(states) do
    if s.gru.qstate then s.gru.qstate:free() end
    s.gru.qstate = s.state
    s.gru:clearState()
  end
  return model
end

-- Every quantizer: {{name = "1.l0.fwd.gate.z_out", quantizer = q, layer = lq, gru = gru}, ...}
function quant.quantizers(model)
  local out = {}
  for _, g in ipairs(grus(model)) do
    if g.gru.qstate then
      for lq in g.gru.qstate:each() do
        for _, op in ipairs(config.OPS) do
          out[#out + 1] = { name = g.prefix .. lq.name .. "." .. op, quantizer = lq:quantizers()[op], layer = lq, gru = g.gru }
        end
      end
    end
  end
  return out
end

-- One quantizer by name; a model with one GRU also answers "gru.<name>" and "<name>"
-- ("gru.l0.fwd.gate.z_out", "l0.fwd.gate.z_out").
function quant.get(model, name)
  local list = quant.quantizers(model)
  if #list == 0 then error("qgru: quant.get: the model has no quantizers (call quant.prepare first)", 2) end
  local gs = grus(model)
  local alias = #gs == 1 and (gs[1].prefix .. (name:gsub("^gru%.", ""))) or nil
  for _, e in ipairs(list) do
    if e.name == name or e.name == alias then return e.quantizer end
  end
  error("qgru: quant.get: no quantizer named '" .. name .. "' (names look like " .. list[1].name .. ")", 2)
end

-- Turns quantization on (QAT / integer inference) or off (float) for every GRU.
function quant.enable(model, on)
  for _, g in ipairs(need_grus(model, "enable")) do
    if not g.gru.qstate then error("qgru: quant.enable: call quant.prepare first", 2) end
    g.gru.qstate.enabled = on ~= false and not g.gru.qstate.cfg.disable_quantization
    g.gru:clearState()
  end
end

-- Freezes (or unfreezes) every quantizer: calibration and weight tracking leave them alone.
-- Per-channel parameters the C layer derived on a GPU are pulled once here, so the frozen
-- values are on the host (and the layer's host-side decisions no longer wait on them).
function quant.freeze(model, on)
  for _, e in ipairs(quant.quantizers(model)) do
    if on ~= false and e.quantizer.per_channel then e.quantizer:sync() end
    e.quantizer.frozen = on ~= false
  end
end

-- Calibration (quant/calibrate.lua): opts method, passes, weight_method, percentile, batches,
-- batch_size, progress (function(done, total)); returns a report {{name=, method=, e=, z=, lo=, hi=, pass=}, ...}.
function quant.calibrate(model, data, opts)
  return require("qgru.quant.calibrate").run(model, need_grus(model, "calibrate"), data, opts)
end

-- The complete quantizer state of a model as plain Lua values (for checkpoints), and back.
-- setState checks everything against the model before it changes anything.
function quant.state(model)
  local out = {}
  for i, g in ipairs(grus(model)) do
    local st = g.gru.qstate
    if st then
      local m = { enabled = st.enabled, track_weights = st.track_weights, weight_method = st.weight_method, layers = {} }
      for lq in st:each() do
        local ops = {}
        for op, q in pairs(lq:quantizers()) do
          local e, z = q:get()
          ops[op] = { bitwidth = q.bitwidth, is_symmetric = q.is_symmetric, is_unsigned = q.is_unsigned, e = e, z = z,
                      calibrated = q.calibrated, frozen = q.frozen, pinned = q.pinned, method = q.method, range = q.range }
        end
        m.layers[lq.key + 1] = ops
      end
      out[i] = m
    end
  end
  return out
end

-- Checks a quant.state() table (from a checkpoint) completely against the model: structure,
-- every quantizer field with the rules of quant.config (bitwidth, flags, exponents, zero points
-- on their grids, per-channel counts). Errors say where; nothing is changed.
function quant.checkState(model, state)
  local list = grus(model)
  local function bad(msg) error("qgru: quantizer state does not match the model (nothing was loaded): " .. msg, 0) end
  local function tn(v) return config.typename(v) end
  if type(state) ~= "table" then bad("expected a table of GRU states, got " .. tn(state)) end
  for i, m in pairs(state) do
    if type(i) ~= "number" then bad("unexpected key " .. tostring(i)) end
    local g = list[i]
    if not g or not g.gru.qstate then bad("GRU " .. tostring(i) .. " has no quantizers (call quant.prepare first)") end
    if type(m) ~= "table" or type(m.layers) ~= "table" then bad("GRU " .. i .. ": expected {layers = ...}, got " .. tn(m)) end
    for _, k in ipairs({ "enabled", "track_weights" }) do
      if m[k] ~= nil and type(m[k]) ~= "boolean" then bad("GRU " .. i .. "." .. k .. ": expected true or false, got " .. tn(m[k])) end
    end
    if m.weight_method ~= nil and not GRUQuant.METHODS[m.weight_method] then
      bad("GRU " .. i .. ".weight_method: expected minmax, histogram, mse or percentile, got " .. tn(m.weight_method))
    end
    local nlayers = 0
    for _ in g.gru.qstate:each() do nlayers = nlayers + 1 end
    local seen = 0
    for key, ops in pairs(m.layers) do
      local lq = type(key) == "number" and g.gru.qstate.layers[key - 1]
      if not lq then bad("GRU " .. i .. " has no layer/direction " .. tostring(key)) end
      seen = seen + 1
      if type(ops) ~= "table" then bad(lq.name .. ": expected a table of operators, got " .. tn(ops)) end
      local qs = lq:quantizers()
      for op in pairs(ops) do if not qs[op] then bad("unknown operator " .. tostring(op)) end end
      for _, op in ipairs(config.OPS) do
        local e, q = ops[op], qs[op]
        if type(e) ~= "table" then bad(q.name .. ": missing") end
        for _, k in ipairs({ "calibrated", "frozen", "pinned" }) do
          if type(e[k]) ~= "boolean" then bad(q.name .. "." .. k .. ": expected true or false, got " .. tn(e[k])) end
        end
        if e.method ~= nil and type(e.method) ~= "string" then bad(q.name .. ".method: expected a string, got " .. tn(e.method)) end
        if e.range ~= nil and (type(e.range) ~= "table" or type(e.range[1]) ~= "number" or type(e.range[2]) ~= "number") then
          bad(q.name .. ".range: expected two numbers, got " .. tn(e.range))
        end
        local field, problem
        if e.calibrated then
          local n = q.per_channel and q.channels or 1
          local es = q.per_channel and e.e or { e.e }
          local zs = q.per_channel and e.z or { e.z }
          field, problem = config.checkQuantizerParams(op, e.bitwidth, e.is_symmetric, e.is_unsigned, es, zs, n, q.fixed)
        else
          field, problem = config.checkQuantizerKind(e.bitwidth, e.is_symmetric, e.is_unsigned)
        end
        if field then bad(q.name .. "." .. field .. ": " .. problem) end
      end
    end
    if seen ~= nlayers then bad("GRU " .. i .. " has " .. nlayers .. " layer/direction(s), the state " .. seen) end
  end
end

function quant.setState(model, state)
  quant.checkState(model, state)
  local list = grus(model)
  for i, m in pairs(state) do
    local st = list[i].gru.qstate
    st.enabled, st.track_weights, st.weight_method = m.enabled, m.track_weights, m.weight_method
    for key, ops in pairs(m.layers) do
      local qs = st.layers[key - 1]:quantizers()
      for op, e in pairs(ops) do
        local q = qs[op]
        q.bitwidth, q.is_symmetric, q.is_unsigned = e.bitwidth, e.is_symmetric, e.is_unsigned
        if e.calibrated then q:set(e.e, e.z, { method = e.method, range = e.range }) else q.calibrated = false end
        q.frozen, q.pinned = e.frozen, e.pinned
      end
    end
    list[i].gru:clearState()
  end
end

local export = require("qgru.quant.export")
quant.export = export.export
quant.load = export.load
quant.exportWeights = export.exportWeights

return quant
