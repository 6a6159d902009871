-- quant/export.lua: quantization parameters out and in (QUANT_SPEC.md section 6).
--   export(model, path, {format = "qgru"})   qgru-qparams v1 JSON: model shape, rounding rule and,
--                                           per GRU, layer, direction and operator: bitwidth,
--                                           is_symmetric, is_unsigned, exp2_inv (arrays per
--                                           channel), zero_point, scale, calibrated range, method
--   export(model, path, {format = "aimet"})  AIMET encodings 1.0.0 (activation_encodings /
--                                           param_encodings; offset = -(z + 2^(b-1)) on signed
--                                           grids, -z on unsigned ones)
--   exportWeights(model, path)              integer weight codes as safetensors
--   load(model, path)                       restores a qgru-qparams file exactly (quantizers are
--                                           frozen: no recalibration), all-or-nothing
local clib = require("qgru.clib")
local json = require("qgru.json")
local Tensor = require("qgru.tensor")
local serialize = require("qgru.serialize")
local config = require("qgru.quant.config")
local Quantizer = require("qgru.quant.quantizer")

local M = {}

local function grus_of(model)
  local gs = require("qgru.quant").grus(model)
  if #gs == 0 then error("qgru: quant.export: the model has no nn.GRU", 3) end
  for _, g in ipairs(gs) do
    if not g.gru.qstate then error("qgru: quant.export: call quant.prepare first", 3) end
  end
  return gs
end

local function module_name(g) return g.prefix == "" and "gru" or g.prefix:gsub("%.$", "") end

local function op_entry(q)
  local e, z = q:get()
  if e == nil then error("qgru: quant.export: " .. q.name .. " is not calibrated", 4) end
  local scale
  if q.per_channel then
    scale = {}
    for i, v in ipairs(e) do scale[i] = 2 ^ -v end
    e, z, scale = json.array(e), json.array(z), json.array(scale)
  else
    scale = 2 ^ -e
  end
  local qmin, qmax = require("qgru.quant.quantizer").grid(q.bitwidth, q.is_unsigned)
  return json.object(
    "bitwidth", q.bitwidth, "is_symmetric", q.is_symmetric, "is_unsigned", q.is_unsigned,
    "granularity", q.per_channel and "channel" or "tensor",
    "exp2_inv", e, "zero_point", z, "scale", scale, "qmin", qmin, "qmax", qmax,
    "range", q.range and json.array({ q.range[1], q.range[2] }) or nil,
    "method", q.method or "unknown", "fixed", q.fixed ~= nil, "pinned", q.pinned,
    "integer_deployable", q.bitwidth <= config.LUT_MAX_BITS)
end

local function qgru_doc(model)
  local modules = {}
  for _, g in ipairs(grus_of(model)) do
    local gru, layers = g.gru, {}
    for lq in gru.qstate:each() do
      local qs = lq:quantizers()
      local order = {}
      for _, op in ipairs(config.OPS) do order[#order + 1] = op; order[#order + 1] = op_entry(qs[op]) end
      layers[#layers + 1] = json.object("layer", lq.l, "direction", lq.d == 0 and "fwd" or "bwd",
                                        "operators", json.object(unpack(order)))
    end
    modules[#modules + 1] = json.object(
      "name", module_name(g), "input_size", gru.inputSize, "hidden_size", gru.hiddenSize, "layers", gru.layers,
      "directions", gru.dirs, "gate_order", "z,r,g",
      "disable_quantization", gru.qstate.cfg.disable_quantization,
      "config_source", gru.qstate.cfg.source,
      "layers_params", json.array(layers))
  end
  return json.object("format", "qgru-qparams", "version", 1, "rounding", "half_to_even",
                     "scale", "2^-exp2_inv", "quantize", "clamp(rne(x * 2^exp2_inv) + zero_point, qmin, qmax)",
                     "modules", json.array(modules))
end

local function aimet_offset(q, z) return q.is_unsigned and -z or -(z + 2 ^ (q.bitwidth - 1)) end

local function aimet_doc(model)
  local acts, params = {}, {}
  for _, g in ipairs(grus_of(model)) do
    for lq in g.gru.qstate:each() do
      local qs = lq:quantizers()
      for _, op in ipairs(config.OPS) do
        local q = qs[op]
        local e, z = q:get()
        if e == nil then error("qgru: quant.export: " .. q.name .. " is not calibrated", 3) end
        local name = module_name(g) .. "." .. lq.name .. "." .. op
        local es = q.per_channel and e or { e }
        local zs = q.per_channel and z or { z }
        local scale, offset = {}, {}
        for i = 1, #es do scale[i] = 2 ^ -es[i]; offset[i] = aimet_offset(q, zs[i]) end
        local entry = json.object("name", name, "enc_type", q.per_channel and "PER_CHANNEL" or "PER_TENSOR", "dtype", "INT",
                                  "bw", q.bitwidth, "is_sym", q.is_symmetric, "scale", json.array(scale),
                                  "offset", json.array(offset), "exp2_inv", json.array({ unpack(es) }),
                                  "zero_point", json.array({ unpack(zs) }), "is_unsigned", q.is_unsigned)
        if config.isWeight(op) then params[#params + 1] = entry else acts[#acts + 1] = entry end
      end
    end
  end
  return json.object("version", "1.0.0", "activation_encodings", json.array(acts), "param_encodings", json.array(params),
                     "quantizer_args", json.object("rounding", "half_to_even", "scale", "power_of_two"))
end

-- Weight quantizers that track their weights describe the weights of the last forward; an
-- optimizer step since then has moved the weights. Exports describe the current weights.
local function refresh_weights(model)
  for _, g in ipairs(grus_of(model)) do
    if g.gru.qstate.track_weights then
      for lq in g.gru.qstate:each() do lq:calibrateWeights() end
    end
  end
end

function M.export(model, path, opts)
  opts = opts or {}
  refresh_weights(model)
  local fmt = opts.format or "qgru"
  local doc
  if fmt == "qgru" then doc = qgru_doc(model)
  elseif fmt == "aimet" then doc = aimet_doc(model)
  else error("qgru: quant.export: format must be 'qgru' or 'aimet', got " .. tostring(fmt), 2) end
  json.write(path, doc)
  return doc
end

-- Integer weight codes (the smallest integer dtype that holds the grid), one entry per weight:
-- "<gru>.l0.fwd.W" etc., plus the per-channel exponents and zero points.
function M.exportWeights(model, path)
  refresh_weights(model)
  local t, meta = {}, { ["qgru.kind"] = "weight-codes", ["qgru.rounding"] = "half_to_even" }
  for _, g in ipairs(grus_of(model)) do
    for lq in g.gru.qstate:each() do
      for i, op in ipairs(config.WEIGHT_OPS) do
        local q = lq.w[i]
        local dt = (q.bitwidth <= 8 and (q.is_unsigned and "u8" or "i8")) or (q.bitwidth <= 16 and not q.is_unsigned and "i16") or "i32"
        local name = module_name(g) .. "." .. lq.name .. "." .. ({ "W", "R", "bx", "br" })[i]
        t[name] = lq:weightCodes(i):to(dt)
        q:sync()
        t[name .. ".exp2_inv"] = q.exps
        t[name .. ".zero_point"] = q.zps
      end
    end
  end
  serialize.save(path, t, meta)
end

local function fail(path, where, fmt, ...)
  error("qgru: " .. path .. ": " .. where .. ": " .. string.format(fmt, ...) .. " (the model was not changed)", 0)
end

-- ---- validation of a qgru-qparams document (everything is checked before anything is set) ----
local typename = config.typename

local function need(path, where, v, kind)
  local ok = (kind == "object" and json.isObject(v)) or (kind == "array" and json.isArray(v)) or (kind == "string" and type(v) == "string")
      or (kind == "boolean" and type(v) == "boolean")
  if not ok then fail(path, where, "expected %s, got %s", (kind == "array" or kind == "object") and ("an " .. kind) or ("a " .. kind), typename(v)) end
end

local function need_int(path, where, v, lo)
  if type(v) ~= "number" or v % 1 ~= 0 or (lo and v < lo) then
    fail(path, where, "expected %s, got %s", lo and ("an integer >= " .. lo) or "an integer", typename(v))
  end
end

-- Checks the document's header: format, version, rounding and the meaning of scale.
local function check_header(path, doc)
  if not json.isObject(doc) or doc.format ~= "qgru-qparams" then fail(path, "$", "not a qgru-qparams document") end
  if doc.version ~= 1 then fail(path, "$.version", "unsupported version %s (this qgru reads 1)", tostring(doc.version)) end
  if doc.rounding ~= nil and doc.rounding ~= "half_to_even" then
    fail(path, "$.rounding", "expected \"half_to_even\" (the one rounding rule of qgru), got %s", typename(doc.rounding))
  end
  if doc.scale ~= nil and doc.scale ~= "2^-exp2_inv" then fail(path, "$.scale", "expected \"2^-exp2_inv\", got %s", typename(doc.scale)) end
end

-- Checks the derived fields of an operator entry against exp2_inv and the grid.
local function check_derived(path, owhere, e, q, es)
  if e.scale ~= nil then
    local ss = q.per_channel and e.scale or { e.scale }
    if (q.per_channel and not json.isArray(e.scale)) or (not q.per_channel and type(e.scale) ~= "number") or #ss ~= #es then
      fail(path, owhere .. ".scale", "expected %s, got %s", q.per_channel and (#es .. " numbers") or "a number", typename(e.scale))
    end
    for c = 1, #es do
      if ss[c] ~= 2 ^ -es[c] then
        fail(path, owhere .. ".scale" .. (q.per_channel and ("[" .. (c - 1) .. "]") or ""), "%s is not 2^-exp2_inv = 2^-%d", tostring(ss[c]), es[c])
      end
    end
  end
  local qmin, qmax = Quantizer.grid(e.bitwidth, e.is_unsigned)
  if e.qmin ~= nil and e.qmin ~= qmin then fail(path, owhere .. ".qmin", "expected %d for this grid, got %s", qmin, typename(e.qmin)) end
  if e.qmax ~= nil and e.qmax ~= qmax then fail(path, owhere .. ".qmax", "expected %d for this grid, got %s", qmax, typename(e.qmax)) end
  local gran = q.per_channel and "channel" or "tensor"
  if e.granularity ~= nil and e.granularity ~= gran then fail(path, owhere .. ".granularity", "expected \"%s\", got %s", gran, typename(e.granularity)) end
  if e.method ~= nil then need(path, owhere .. ".method", e.method, "string") end
  if e.range ~= nil then
    if not json.isArray(e.range) or #e.range ~= 2 or type(e.range[1]) ~= "number" or type(e.range[2]) ~= "number" then
      fail(path, owhere .. ".range", "expected two numbers, got %s", typename(e.range))
    end
  end
  for _, k in ipairs({ "fixed", "pinned", "integer_deployable" }) do
    if e[k] ~= nil then need(path, owhere .. "." .. k, e[k], "boolean") end
  end
end

-- Checks one module entry against its GRU; appends {q=, e=, es=, zs=} to plan.
local function check_module(path, where, m, gru, plan)
  need(path, where, m, "object")
  for _, k in ipairs({ { "input_size", gru.inputSize }, { "hidden_size", gru.hiddenSize }, { "layers", gru.layers }, { "directions", gru.dirs } }) do
    local v = m[k[1]]
    if type(v) ~= "number" then fail(path, where .. "." .. k[1], "expected a number, got %s", typename(v)) end
    if v ~= k[2] then fail(path, where .. "." .. k[1], "the file has %s, the model has %d", tostring(v), k[2]) end
  end
  if m.gate_order ~= nil and m.gate_order ~= "z,r,g" then
    fail(path, where .. ".gate_order", "expected \"z,r,g\" (qgru's gate order), got %s", typename(m.gate_order))
  end
  if m.disable_quantization ~= nil then need(path, where .. ".disable_quantization", m.disable_quantization, "boolean") end
  local lps = m.layers_params
  if lps == nil then fail(path, where .. ".layers_params", "missing") end
  need(path, where .. ".layers_params", lps, "array")
  local count = gru.layers * gru.dirs
  if #lps ~= count then
    fail(path, where .. ".layers_params", "expected %d entries (%d layer(s) x %d direction(s)), got %d", count, gru.layers, gru.dirs, #lps)
  end
  local seen = {}
  for li, lp in ipairs(lps) do
    local lwhere = where .. ".layers_params[" .. (li - 1) .. "]"
    need(path, lwhere, lp, "object")
    need_int(path, lwhere .. ".layer", lp.layer, 0)
    if lp.direction ~= "fwd" and lp.direction ~= "bwd" then fail(path, lwhere .. ".direction", "expected \"fwd\" or \"bwd\", got %s", typename(lp.direction)) end
    local key = lp.layer * gru.dirs + (lp.direction == "bwd" and 1 or 0)
    local lq = lp.layer < gru.layers and (lp.direction == "fwd" or gru.dirs == 2) and gru.qstate.layers[key] or nil
    if not lq then fail(path, lwhere, "layer %d %s does not exist in the model", lp.layer, lp.direction) end
    if seen[key] then fail(path, lwhere, "layer %d %s is given twice (also at layers_params[%d])", lp.layer, lp.direction, seen[key]) end
    seen[key] = li - 1
    need(path, lwhere .. ".operators", lp.operators, "object")
    local qs = lq:quantizers()
    for op in pairs(lp.operators) do
      if not qs[op] then fail(path, lwhere .. ".operators", "unknown operator \"%s\"", op) end
    end
    for _, op in ipairs(config.OPS) do
      local e = lp.operators[op]
      local owhere = lwhere .. ".operators[\"" .. op .. "\"]"
      if e == nil then fail(path, owhere, "missing") end
      need(path, owhere, e, "object")
      local q = qs[op]
      local n = q.per_channel and q.channels or 1
      if q.per_channel then
        for _, k in ipairs({ "exp2_inv", "zero_point" }) do
          if not json.isArray(e[k]) then fail(path, owhere .. "." .. k, "expected an array of %d integers, got %s", n, typename(e[k])) end
        end
      end
      local es = q.per_channel and e.exp2_inv or { e.exp2_inv }
      local zs = q.per_channel and e.zero_point or { e.zero_point }
      local field, problem = config.checkQuantizerParams(op, e.bitwidth, e.is_symmetric, e.is_unsigned, es, zs, n, q.fixed)
      if field then fail(path, owhere .. "." .. field, "%s", problem) end
      check_derived(path, owhere, e, q, es)
      plan[#plan + 1] = { q = q, e = e, es = es, zs = zs }
    end
  end
end

-- Restores a qgru-qparams file. Everything is checked first; then every quantizer is set and frozen.
function M.load(model, path)
  if type(path) ~= "string" then error("qgru: quant.load: expected a file path, got " .. type(path), 2) end
  local doc = json.read(path)
  check_header(path, doc)
  local gs = grus_of(model)
  if not json.isArray(doc.modules) or #doc.modules ~= #gs then
    fail(path, "$.modules", "expected %d GRU module(s), the file has %s", #gs, json.isArray(doc.modules) and #doc.modules or "none")
  end
  local plan = {}
  for mi, g in ipairs(gs) do check_module(path, "$.modules[" .. (mi - 1) .. "]", doc.modules[mi], g.gru, plan) end
  for _, p in ipairs(plan) do
    local q, e = p.q, p.e
    q.bitwidth, q.is_symmetric, q.is_unsigned = e.bitwidth, e.is_symmetric, e.is_unsigned
    if q.per_channel then q:set(p.es, p.zs, { method = e.method }) else q:set(p.es[1], p.zs[1], { method = e.method }) end
    if json.isArray(e.range) then q.range = { e.range[1], e.range[2] } end
    q.frozen = true
  end
  for _, g in ipairs(gs) do
    g.gru.qstate.cfg = setmetatable({ source = path }, { __index = g.gru.qstate.cfg })
    g.gru:clearState()
  end
  return model
end

return M
