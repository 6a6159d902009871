-- json.lua: JSON for configs and exported parameters. Decoding goes through libqgru's cJSON
-- (errors carry line and column); objects and arrays come back as Lua tables marked with
-- json.isObject / json.isArray, and JSON null as json.null. Encoding writes keys in the order
-- given by json.object(k1, v1, k2, v2, ...) (or sorted, for plain tables), and refuses NaN and
-- infinities instead of writing null.
local clib = require("qgru.clib")

local ffi, lib = clib.ffi, clib.lib

local json = {}

local OBJECT, ARRAY = { kind = "object" }, { kind = "array" }
json.null = setmetatable({}, { __tostring = function() return "null" end })

function json.isObject(v) return type(v) == "table" and getmetatable(v) == OBJECT end
function json.isArray(v) return type(v) == "table" and getmetatable(v) == ARRAY end

local function convert(node)
  local t = lib.qg_json_type(node)
  if t == lib.QG_JSON_NULL then return json.null
  elseif t == lib.QG_JSON_FALSE then return false
  elseif t == lib.QG_JSON_TRUE then return true
  elseif t == lib.QG_JSON_NUMBER then return tonumber(lib.qg_json_number(node))
  elseif t == lib.QG_JSON_STRING then return ffi.string(lib.qg_json_string(node))
  elseif t == lib.QG_JSON_ARRAY then
    local out = setmetatable({}, ARRAY)
    local c = lib.qg_json_child(node)
    while c ~= nil do out[#out + 1] = convert(c); c = lib.qg_json_next(c) end
    return out
  end
  local out = {}
  local c = lib.qg_json_child(node)
  while c ~= nil do
    local k = ffi.string(lib.qg_json_key(c))
    if out[k] ~= nil then error({ duplicate = k }) end
    out[k] = convert(c)
    c = lib.qg_json_next(c)
  end
  return setmetatable(out, OBJECT)
end

-- decode(text, source_name) -> value; errors name the source, line and column.
function json.decode(text, source)
  if type(text) ~= "string" then error("qgru: " .. (source or "json.decode") .. ": expected JSON text, got " .. type(text), 0) end
  local ctx = clib.context("cpu")
  local out = ffi.new("qg_json*[1]")
  local st = lib.qg_json_parse(ctx, out, text, #text, source or "<string>")
  if st ~= lib.QG_OK then error("qgru: " .. ffi.string(lib.qg_last_error(ctx)):gsub("^qg_json_parse: ", ""), 0) end
  local root = ffi.gc(out[0], lib.qg_json_free)
  local ok, v = pcall(convert, root)
  lib.qg_json_free(ffi.gc(root, nil))
  if not ok then
    if type(v) == "table" and v.duplicate then error("qgru: " .. (source or "<string>") .. ": duplicate key \"" .. v.duplicate .. "\"", 0) end
    error(v, 0)
  end
  return v
end

json.MAX_FILE_BYTES = 256 * 1024 * 1024   -- configs and qparams files are small; refuse a runaway one

-- The whole content of a file; errors say why it cannot be read ("is a directory", ...).
function json.readFile(path, what)
  if type(path) ~= "string" then error("qgru: " .. (what or "json.read") .. ": expected a file path, got " .. type(path), 0) end
  local f, err = io.open(path, "rb")
  if not f then error("qgru: cannot read '" .. path .. "': " .. tostring(err):gsub("^" .. path:gsub("%p", "%%%0") .. ": ", ""), 0) end
  local _, _, dcode = f:read(0)
  if dcode == 21 then f:close(); error("qgru: '" .. path .. "': is a directory, not a file", 0) end
  local size = f:seek("end")
  if size and size > json.MAX_FILE_BYTES then
    f:close()
    error(string.format("qgru: '%s': %d bytes, more than the %d a JSON file may have here", path, size, json.MAX_FILE_BYTES), 0)
  end
  f:seek("set", 0)
  local s, rerr, code = f:read("*a")
  f:close()
  if s == nil then
    if code == 21 then error("qgru: '" .. path .. "': is a directory, not a file", 0) end
    error("qgru: cannot read '" .. path .. "': " .. tostring(rerr), 0)
  end
  return s
end

function json.read(path)
  return json.decode(json.readFile(path), path)
end

-- An object whose keys are written in the given order.
function json.object(...)
  local n = select("#", ...)
  local t, order = {}, {}
  for i = 1, n, 2 do
    local k, v = select(i, ...)
    if v ~= nil then t[k] = v; order[#order + 1] = k end
  end
  return setmetatable(t, { kind = "object", order = order })
end

function json.array(t) return setmetatable(t or {}, ARRAY) end

local function encode_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local map = { ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
    return map[c] or string.format("\\u%04x", c:byte())
  end) .. '"'
end

local MAX_DEPTH = 500

local function encode(v, path, indent, out, depth)
  depth = (depth or 0) + 1
  if depth > MAX_DEPTH then error("qgru: refusing to write JSON nested deeper than " .. MAX_DEPTH .. " levels (a cycle?) at " .. path:sub(1, 200), 0) end
  local t = type(v)
  if v == json.null then out[#out + 1] = "null"
  elseif t == "boolean" then out[#out + 1] = tostring(v)
  elseif t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then
      error("qgru: refusing to write a non-finite number (" .. tostring(v) .. ") at " .. path, 0)
    end
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then out[#out + 1] = string.format("%d", v)
    else out[#out + 1] = string.format("%.17g", v) end
  elseif t == "string" then out[#out + 1] = encode_string(v)
  elseif t == "table" then
    local mt = getmetatable(v)
    local is_array = mt == ARRAY or (mt == nil and (#v > 0 or next(v) == nil))
    if mt and mt.kind == "object" then is_array = false end
    if is_array then   -- every key must be one of 1..#v: nothing may be dropped silently
      local n = 0
      for _ in pairs(v) do n = n + 1 end
      if n ~= #v then error("qgru: cannot write a table with mixed or sparse keys as JSON at " .. path, 0) end
    end
    local inner = indent and (indent .. "  ") or nil
    local nl = indent and ("\n" .. inner) or ""
    if is_array then
      local flat = true
      for _, x in ipairs(v) do if type(x) == "table" then flat = false end end
      out[#out + 1] = "["
      for i, x in ipairs(v) do
        if i > 1 then out[#out + 1] = "," end
        if not flat then out[#out + 1] = nl elseif i > 1 and indent then out[#out + 1] = " " end
        encode(x, path .. "[" .. (i - 1) .. "]", inner, out, depth)
      end
      if not flat and #v > 0 and indent then out[#out + 1] = "\n" .. indent end
      out[#out + 1] = "]"
    else
      local keys = mt and mt.order
      if not keys then
        keys = {}
        for k in pairs(v) do keys[#keys + 1] = k end
        table.sort(keys)
      end
      out[#out + 1] = "{"
      for i, k in ipairs(keys) do
        if i > 1 then out[#out + 1] = "," end
        out[#out + 1] = nl
        out[#out + 1] = encode_string(tostring(k)) .. (indent and ": " or ":")
        encode(v[k], path .. "." .. tostring(k), inner, out, depth)
      end
      if #keys > 0 and indent then out[#out + 1] = "\n" .. indent end
      out[#out + 1] = "}"
    end
  else
    error("qgru: cannot write a " .. t .. " as JSON at " .. path, 0)
  end
end

-- encode(value, {pretty = true}) -> string
function json.encode(v, opts)
  local out = {}
  encode(v, "$", (opts and opts.pretty) and "" or nil, out)
  return table.concat(out)
end

-- Writes atomically (path.tmp, then rename).
function json.write(path, v)
  local text = json.encode(v, { pretty = true }) .. "\n"
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("qgru: cannot write '" .. path .. "': " .. tostring(err), 0) end
  f:write(text)
  f:close()
  local ok, rerr = os.rename(tmp, path)
  if not ok then os.remove(tmp); error("qgru: cannot write '" .. path .. "': " .. tostring(rerr), 0) end
end

return json
