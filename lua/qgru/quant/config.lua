-- quant/config.lua: bitwidth configurations (the seed's format, QUANT_SPEC.md section 6) and
-- their defaults (section 2). A config is validated completely before anything uses it; errors
-- name the file, the JSON path and the problem.
--
-- Normalized form: {source = "config/int8.json", disable_quantization = false,
--   ops = {["input.x"] = {bitwidth = 8, is_symmetric = false, is_unsigned = false,
--                         fixed = false, calibrate = true, exp2_inv = nil, zero_point = nil}, ...}}
local json = require("qgru.json")

local config = {}

-- The 17 operators in the seed's order, their granularity and the QG_Q_* order of the
-- activation operators: all read from the C library (core/quant.c), the one definition.
local clib = require("qgru.clib")
local ffi, lib = clib.ffi, clib.lib
config.OPS, config.WEIGHT_OPS, config.ACT_OPS = {}, {}, {}
for i = 0, lib.QG_NUM_OPS - 1 do config.OPS[#config.OPS + 1] = ffi.string(lib.qg_op_name(i)) end
for w = 0, lib.QG_W_NUM - 1 do config.WEIGHT_OPS[w + 1] = ffi.string(lib.qg_weight_name(w)) end
for q = 0, lib.QG_Q_NUM_ACT - 1 do config.ACT_OPS[q + 1] = ffi.string(lib.qg_act_name(q)) end
config.LUT_MAX_BITS = lib.QG_LUT_MAX_BITS
config.ALIASES = { ["weight.bx"] = "weight.bw", ["input.h"] = "output.h" }
config.FIXED = { ["gate.z_out"] = "sigmoid", ["gate.r_out"] = "sigmoid", ["gate.g_out"] = "tanh" }

local is_weight = {}
for _, op in ipairs(config.WEIGHT_OPS) do is_weight[op] = true end
config.isWeight = function(op) return is_weight[op] == true end

function config.default_op(op, bits)
  bits = bits or 8
  if is_weight[op] then return { bitwidth = bits, is_symmetric = true, is_unsigned = false } end
  if op == "gate.z_out" or op == "gate.r_out" then return { bitwidth = bits, is_symmetric = true, is_unsigned = true } end
  if op == "gate.g_out" then return { bitwidth = bits, is_symmetric = true, is_unsigned = false } end
  return { bitwidth = bits, is_symmetric = false, is_unsigned = false }
end

-- Fills the derived fields of an operator entry.
local function finish(op, e)
  e.fixed = config.FIXED[op] ~= nil and not e.calibrate_fixed
  e.per_channel = is_weight[op]
  e.pinned = e.exp2_inv ~= nil
  return e
end

local function typename(v)
  if json.isObject(v) then return "an object" end
  if json.isArray(v) then return "an array" end
  if v == json.null then return "null" end
  if type(v) == "string" then return "a string" end
  if type(v) == "number" then return "the number " .. tostring(v) end
  return "a " .. type(v)
end

-- All 17 operators with defaults, every non-weight at act_bits and weights at weight_bits.
function config.uniform(bits, opts)
  opts = opts or {}
  if type(bits) ~= "number" or bits % 1 ~= 0 or bits < 1 or bits > 32 then
    error("qgru: quant.uniform: bitwidth must be an integer 1..32, got " .. tostring(bits), 3)
  end
  if type(opts) ~= "table" then error("qgru: quant.uniform: options must be a table, got " .. type(opts), 3) end
  for k in pairs(opts) do
    if k ~= "weight_bits" and k ~= "act_bits" and k ~= "disable_quantization" then
      error("qgru: quant.uniform: unknown option '" .. tostring(k) .. "' (weight_bits, act_bits, disable_quantization)", 3)
    end
  end
  for _, k in ipairs({ "weight_bits", "act_bits" }) do
    local v = opts[k]
    if v ~= nil and (type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v > 32) then
      error("qgru: quant.uniform: " .. k .. " must be an integer 1..32, got " .. typename(v), 3)
    end
  end
  if opts.disable_quantization ~= nil and type(opts.disable_quantization) ~= "boolean" then
    error("qgru: quant.uniform: disable_quantization must be true or false, got " .. typename(opts.disable_quantization), 3)
  end
  local cfg = { source = string.format("quant.uniform(%d)", bits), disable_quantization = opts.disable_quantization == true, ops = {} }
  for _, op in ipairs(config.OPS) do
    local b = is_weight[op] and (opts.weight_bits or bits) or (opts.act_bits or bits)
    cfg.ops[op] = finish(op, config.default_op(op, b))
  end
  return cfg
end

local function fail(src, path, fmt, ...)
  error("qgru: " .. src .. ": " .. path .. ": " .. string.format(fmt, ...), 0)
end

local function check_keys(src, path, obj, allowed)
  for k in pairs(obj) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do names[#names + 1] = a end
      table.sort(names)
      fail(src, path, "unknown key \"%s\" (expected one of: %s)", k, table.concat(names, ", "))
    end
  end
end

local OP_KEYS = { bitwidth = true, is_symmetric = true, is_unsigned = true, comment = true, calibrate = true,
                  exp2_inv = true, zero_point = true }

-- Builds a normalized config from decoded JSON; src names the file in errors.
function config.fromTable(doc, src)
  src = src or "<config>"
  if not json.isObject(doc) then fail(src, "$", "expected an object, got %s", typename(doc)) end
  check_keys(src, "$", doc, { GRU_config = true, description = true, comment = true })
  local g = doc.GRU_config
  if g == nil then fail(src, "$", "missing \"GRU_config\"") end
  if not json.isObject(g) then fail(src, "GRU_config", "expected an object, got %s", typename(g)) end
  check_keys(src, "GRU_config", g, { default_config = true, operator_config = true, comment = true })
  local cfg = { source = src, disable_quantization = false, ops = {} }
  local dc = g.default_config
  if dc ~= nil then
    if not json.isObject(dc) then fail(src, "GRU_config.default_config", "expected an object, got %s", typename(dc)) end
    check_keys(src, "GRU_config.default_config", dc, { disable_quantization = true, comment = true })
    if dc.disable_quantization ~= nil then
      if type(dc.disable_quantization) ~= "boolean" then
        fail(src, "GRU_config.default_config.disable_quantization", "expected true or false, got %s", typename(dc.disable_quantization))
      end
      cfg.disable_quantization = dc.disable_quantization
    end
  end
  for _, op in ipairs(config.OPS) do cfg.ops[op] = config.default_op(op) end
  local oc = g.operator_config
  if oc ~= nil then
    if not json.isObject(oc) then fail(src, "GRU_config.operator_config", "expected an object, got %s", typename(oc)) end
    local names = {}
    for k in pairs(oc) do names[#names + 1] = k end
    table.sort(names)
    local seen = {}
    for _, name in ipairs(names) do
      local op = config.ALIASES[name] or name
      local path = string.format("GRU_config.operator_config[\"%s\"]", name)
      if cfg.ops[op] == nil then
        fail(src, path, "unknown operator \"%s\" (operators: %s; aliases: weight.bx, input.h)", name, table.concat(config.OPS, ", "))
      end
      if seen[op] then fail(src, path, "\"%s\" is already configured as \"%s\"", name, seen[op]) end
      seen[op] = name
      local e = oc[name]
      if not json.isObject(e) then fail(src, path, "expected an object, got %s", typename(e)) end
      check_keys(src, path, e, OP_KEYS)
      local d = cfg.ops[op]
      if e.bitwidth ~= nil then
        if type(e.bitwidth) ~= "number" or e.bitwidth % 1 ~= 0 then
          fail(src, path .. ".bitwidth", "expected an integer, got %s", typename(e.bitwidth))
        end
        if e.bitwidth < 1 or e.bitwidth > 32 then fail(src, path .. ".bitwidth", "must be 1..32, got %d", e.bitwidth) end
        d.bitwidth = e.bitwidth
      end
      for _, k in ipairs({ "is_symmetric", "is_unsigned", "calibrate" }) do
        if e[k] ~= nil and type(e[k]) ~= "boolean" then fail(src, path .. "." .. k, "expected true or false, got %s", typename(e[k])) end
      end
      if e.is_symmetric ~= nil then d.is_symmetric = e.is_symmetric end
      if e.is_unsigned ~= nil then d.is_unsigned = e.is_unsigned end
      if e.calibrate ~= nil then
        if config.FIXED[op] then d.calibrate_fixed = e.calibrate
        elseif e.calibrate == false and e.exp2_inv == nil then
          fail(src, path .. ".calibrate", "false needs a pinned exp2_inv (and zero_point) for this operator")
        end
      end
      if e.comment ~= nil and type(e.comment) ~= "string" then fail(src, path .. ".comment", "expected a string, got %s", typename(e.comment)) end
      for _, k in ipairs({ "exp2_inv", "zero_point" }) do
        local v = e[k]
        if v ~= nil then
          if is_weight[op] then
            if not json.isArray(v) and type(v) ~= "number" then fail(src, path .. "." .. k, "expected an integer or an array of integers, got %s", typename(v)) end
          elseif type(v) ~= "number" then
            fail(src, path .. "." .. k, "expected an integer, got %s", typename(v))
          end
          local list = type(v) == "number" and { v } or v
          for i, x in ipairs(list) do
            local p = path .. "." .. k .. (type(v) == "number" and "" or ("[" .. (i - 1) .. "]"))
            if type(x) ~= "number" or x % 1 ~= 0 then fail(src, p, "expected an integer, got %s", typename(x)) end
            if k == "exp2_inv" and (x < -31 or x > 31) then fail(src, p, "exponent out of range: must be -31..31, got %d", x) end
          end
          d[k] = type(v) == "number" and v or { unpack(v) }
        end
      end
      if d.zero_point ~= nil and d.exp2_inv == nil then fail(src, path, "zero_point needs exp2_inv (a pinned quantizer gives both)") end
      if d.is_symmetric and d.zero_point ~= nil then
        for _, zz in ipairs(type(d.zero_point) == "number" and { d.zero_point } or d.zero_point) do
          if zz ~= 0 then fail(src, path .. ".zero_point", "a symmetric quantizer has zero_point 0, got %d", zz) end
        end
      end
    end
  end
  for op, d in pairs(cfg.ops) do finish(op, d) end
  -- Pinned zero points must lie on their grids.
  for _, op in ipairs(config.OPS) do
    local d = cfg.ops[op]
    if d.zero_point ~= nil then
      local qmin = d.is_unsigned and 0 or -2 ^ (d.bitwidth - 1)
      local qmax = d.is_unsigned and 2 ^ d.bitwidth - 1 or 2 ^ (d.bitwidth - 1) - 1
      for _, zz in ipairs(type(d.zero_point) == "number" and { d.zero_point } or d.zero_point) do
        if zz < qmin or zz > qmax then
          fail(src, string.format("GRU_config.operator_config[\"%s\"].zero_point", op), "%d is outside the %d-bit grid [%d, %d]", zz, d.bitwidth, qmin, qmax)
        end
      end
    end
  end
  if cfg.ops["gate.z_out"].exp2_inv ~= nil and cfg.ops["gate.z_out"].exp2_inv < 0 then
    fail(src, "GRU_config.operator_config[\"gate.z_out\"].exp2_inv", "must be >= 0 (1 - z is 2^e - (q - z)), got %d", cfg.ops["gate.z_out"].exp2_inv)
  end
  return cfg
end

-- ---- quantizer parameter rules (QUANT_SPEC.md section 1), shared by quant.load (qparams
-- files) and quant.checkState (checkpoints); the same rules a bitwidth config follows ----
config.typename = typename

-- The grid of a bitwidth: qmin, qmax.
local function grid_of(bits, uns)
  if uns then return 0, 2 ^ bits - 1 end
  return -2 ^ (bits - 1), 2 ^ (bits - 1) - 1
end

-- Checks bitwidth (integer 1..32), is_symmetric / is_unsigned (booleans). Returns nil or
-- (field, problem).
function config.checkQuantizerKind(bits, sym, uns)
  if type(bits) ~= "number" or bits % 1 ~= 0 or bits < 1 or bits > 32 then
    return "bitwidth", "expected an integer 1..32, got " .. typename(bits)
  end
  if type(sym) ~= "boolean" then return "is_symmetric", "expected true or false, got " .. typename(sym) end
  if type(uns) ~= "boolean" then return "is_unsigned", "expected true or false, got " .. typename(uns) end
  return nil
end

-- Checks exponents es and zero points zs (lists of n values) of a quantizer of operator op
-- (fixed: its fixed output kind, "sigmoid" / "tanh", or nil). Returns nil or (field, problem).
function config.checkQuantizerParams(op, bits, sym, uns, es, zs, n, fixed)
  local field, problem = config.checkQuantizerKind(bits, sym, uns)
  if field then return field, problem end
  if type(es) ~= "table" or #es ~= n then return "exp2_inv", string.format("expected %d value(s), got %s", n, type(es) == "table" and #es or typename(es)) end
  if type(zs) ~= "table" or #zs ~= n then return "zero_point", string.format("expected %d value(s), got %s", n, type(zs) == "table" and #zs or typename(zs)) end
  local qmin, qmax = grid_of(bits, uns)
  for c = 1, n do
    local e, z = es[c], zs[c]
    local at = n > 1 and ("[" .. (c - 1) .. "]") or ""
    if type(e) ~= "number" or e % 1 ~= 0 or e < -31 or e > 31 then
      return "exp2_inv" .. at, "exponent out of range: expected an integer -31..31, got " .. typename(e)
    end
    if type(z) ~= "number" or z % 1 ~= 0 then return "zero_point" .. at, "expected an integer, got " .. typename(z) end
    if z < qmin or z > qmax then return "zero_point" .. at, string.format("%d is outside the %d-bit grid [%d, %d]", z, bits, qmin, qmax) end
    -- symmetric means z = 0; the one exception is a fixed tanh output on an unsigned grid,
    -- whose code 2^(b-1) is 0
    if sym and z ~= 0 and not (fixed == "tanh" and uns and z == 2 ^ (bits - 1)) then
      return "zero_point" .. at, string.format("a symmetric quantizer has zero_point 0, got %d", z)
    end
    if op == "gate.z_out" and e < 0 then return "exp2_inv", string.format("must be >= 0 (1 - z is 2^e - (q - z)), got %d", e) end
  end
  return nil
end

function config.load(path)
  if type(path) ~= "string" then error("qgru: quant.config: expected a file path, got " .. type(path), 3) end
  return config.fromTable(json.read(path), path)
end

-- A short text like "W8 A8" or "W4 A8 (mixed)".
function config.describe(cfg)
  if cfg.disable_quantization then return "float (quantization disabled)" end
  local wb, ab, mixed = cfg.ops["weight.W"].bitwidth, cfg.ops["input.x"].bitwidth, false
  for op, d in pairs(cfg.ops) do
    if (is_weight[op] and d.bitwidth ~= wb) or (not is_weight[op] and d.bitwidth ~= ab) then mixed = true end
  end
  return string.format("W%d A%d%s", wb, ab, mixed and " (mixed)" or "")
end

return config
