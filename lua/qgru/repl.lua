-- repl.lua: the interactive prompt of `./qgru`. qgru and its parts (nn, optim, data, train,
-- quant, Tensor) are preloaded as locals of the session; expressions print without `=`; tensors and
-- models print through their __tostring; incomplete input continues on the next line.
local qgru = require("qgru")

local repl = {}

local function pack(...) return { n = select("#", ...), ... } end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  return tostring(v)
end

-- Compiles a chunk, trying "return <line>" first so expressions print their value.
local function compile(src, env)
  local fn = loadstring("return " .. src, "=stdin")
  if not fn then
    local err
    fn, err = loadstring(src, "=stdin")
    if not fn then return nil, err end
  end
  setfenv(fn, env)
  return fn
end

function repl.start(opts)
  opts = opts or {}
  local input, output = opts.input or io.stdin, opts.output or io.stdout
  -- The session's variables live here; reading an unknown global is nil, as in plain Lua, but
  -- qgru's names are visible without a require.
  local env = setmetatable({ qgru = qgru, nn = qgru.nn, optim = qgru.optim, data = qgru.data, train = qgru.train,
                             quant = qgru.quant, Tensor = qgru.Tensor }, { __index = _G })
  output:write(string.format("qgru %s  (LuaJIT; qgru, nn, optim, data, train, quant and Tensor are loaded; Ctrl-D quits)\n", qgru.VERSION))
  local buffer = ""
  while true do
    output:write(buffer == "" and "qgru> " or "  ... ")
    output:flush()
    local line = input:read("*l")
    if not line then output:write("\n"); break end
    buffer = buffer == "" and line or (buffer .. "\n" .. line)
    local fn, err = compile(buffer, env)
    if not fn then
      if err:match("<eof>$") or err:match("'<eof>'") then
        -- incomplete statement: keep reading
      else
        output:write(err, "\n")
        buffer = ""
      end
    else
      buffer = ""
      local trace = os.getenv("QGRU_TRACEBACK") == "1"
      local res = pack(xpcall(fn, function(e) return trace and debug.traceback(tostring(e), 2) or tostring(e) end))
      if not res[1] then
        output:write(res[2], "\n")
      else
        local parts = {}
        for i = 2, res.n do parts[#parts + 1] = show(res[i]) end
        if #parts > 0 then output:write(table.concat(parts, "\t"), "\n") end
      end
    end
  end
end

return repl
