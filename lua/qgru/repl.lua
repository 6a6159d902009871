-- repl.lua: the interactive prompt of `./qgru`. qgru and its parts (nn, optim, data, train,
-- quant, Tensor) and help are preloaded in the session's environment.
--   - expressions print their value without `=`; tables print readably (nested, sorted,
--     bounded), models as trees with parameter counts and quantization state, functions with
--     their parameters, classes and modules by name; `_` holds the last value
--   - `local x = 5` at the top level stays defined on the next lines (top-level locals become
--     session variables; locals inside blocks and functions stay local)
--   - an unfinished statement continues on the next line ("  ... " prompt)
--   - help(x): modules, classes, objects (models, quantizers), functions, recipes (qgru.help)
--   - line editing, history (~/.qgru_history, or QGRU_HISTORY) and tab completion of names and
--     table fields through GNU readline (qgru.readline) when stdin is a terminal; plain lines
--     otherwise (QGRU_REPL_PLAIN=1 forces them, e.g. under rlwrap)
--   - Ctrl-C at the prompt drops the line; Ctrl-C while code runs stops it and returns to the
--     prompt. It uses LuaJIT's own SIGINT handler (installed by `luajit -e`, which the launcher
--     runs): it makes the next Lua instruction raise "interrupted!"; the REPL catches that, and
--     re-installs the handler, which resets itself when it fires. Code typed here runs
--     interpreted (jit.off), so that a tight loop sees the interrupt.
--
-- The core is usable without a terminal (tests drive it):
--   local s = repl.new{output = out}     -- out: an object with :write(...) (and :flush())
--   s:feed("for i = 1, 3 do")  -> "more"  -- "ok" | "more" | "error" | "empty"
--   s:prompt()                 -> "  ... "
--   s:interrupt()                         -- what Ctrl-C at the prompt does: drops the pending lines
--   s:complete("qgru.nn.Li")   -> {"qgru.nn.Linear"}
--   repl.show(value)           -> the text the REPL prints for a value
--   repl.rewriteLocals(src)    -> src with its top-level `local` declarations made session variables
--   repl.start{input = f, output = out}  -- the whole loop over an input with :read("*l")
local qgru = require("qgru")
local help = require("qgru.help")
local posix = require("qgru.posix")

local repl = {}

local function pack(...) return { n = select("#", ...), ... } end

-- ---- printing values ---------------------------------------------------------------------------

local IDENT = "^[%a_][%w_]*$"
local MAX_ITEMS, MAX_DEPTH, WIDTH = 30, 3, 96

local function module_name(t)
  for name, m in pairs(package.loaded) do
    if m == t and type(name) == "string" and name ~= "_G" then return name end
  end
  return nil
end

local function scalar(v)
  local t = type(v)
  if t == "string" then return string.format("%q", v):gsub("\\\n", "\\n") end
  if t == "number" then
    if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
    return string.format("%.14g", v)
  end
  if t == "function" then
    local info = debug.getinfo(v, "S")
    if info.what == "C" then return "builtin function" end
    return "function" .. help.params(v)
  end
  return tostring(v)
end

local function sorted_keys(t)
  local nums, strs, others = {}, {}, {}
  local n = #t
  for k in pairs(t) do
    if type(k) == "number" and k >= 1 and k <= n and k % 1 == 0 then
    elseif type(k) == "number" then nums[#nums + 1] = k
    elseif type(k) == "string" then strs[#strs + 1] = k
    else others[#others + 1] = k end
  end
  table.sort(nums)
  table.sort(strs)
  local out = {}
  for _, k in ipairs(nums) do out[#out + 1] = k end
  for _, k in ipairs(strs) do out[#out + 1] = k end
  for _, k in ipairs(others) do out[#out + 1] = k end
  return out, n
end

local show

-- Text of a table: one line when it fits, else one entry per line, nested tables indented.
local function show_table(t, depth, indent, seen)
  local mt = getmetatable(t)
  if type(mt) == "table" and rawget(mt, "__tostring") then return tostring(t) end
  if help.isClass(t) then return "<class " .. tostring(rawget(t, "__name")) .. ">" end
  local mname = depth > 0 and module_name(t)
  if mname then return "<module " .. mname .. ">" end
  if seen[t] then return "<cycle>" end
  if depth >= MAX_DEPTH then return "{...}" end
  seen[t] = true
  local keys, n = sorted_keys(t)
  local items, count = {}, 0
  local inner = indent .. "  "
  for i = 1, n do
    count = count + 1
    if count > MAX_ITEMS then break end
    items[#items + 1] = show(t[i], depth + 1, inner, seen)
  end
  for _, k in ipairs(keys) do
    count = count + 1
    if count > MAX_ITEMS then break end
    local ks = (type(k) == "string" and k:match(IDENT)) and k or ("[" .. show(k, MAX_DEPTH, inner, seen) .. "]")
    items[#items + 1] = ks .. " = " .. show(t[k], depth + 1, inner, seen)
  end
  seen[t] = nil
  local total = n + #keys
  if total > MAX_ITEMS then items[#items + 1] = string.format("... (%d entries in all)", total) end
  if #items == 0 then return "{}" end
  local one = "{" .. table.concat(items, ", ") .. "}"
  if #one + #indent <= WIDTH and not one:find("\n", 1, true) then return one end
  return "{\n" .. inner .. table.concat(items, ",\n" .. inner) .. "\n" .. indent .. "}"
end

function show(v, depth, indent, seen)
  if type(v) == "table" then return show_table(v, depth or 0, indent or "", seen or {}) end
  return scalar(v)
end

-- The text the REPL prints for a value.
function repl.show(v) return show(v, 0, "", {}) end

-- ---- top-level locals ----------------------------------------------------------------------------

-- Lua tokens of src: {kind, text, s, e} with kind "name" | "string" | "comment" | "number" |
-- "op" | "space".
local function tokens(src)
  local out, i, n = {}, 1, #src
  local function add(kind, j) out[#out + 1] = { kind, src:sub(i, j), i, j }; i = j + 1 end
  while i <= n do
    local c = src:sub(i, i)
    if c:match("%s") then add("space", (src:find("[^%s]", i) or n + 1) - 1)
    elseif src:sub(i, i + 1) == "--" then
      local eq = src:match("^%-%-%[(=*)%[", i)
      if eq then
        local _, e = src:find("]" .. eq .. "]", i + 4 + #eq, true)
        add("comment", e or n)
      else
        add("comment", (src:find("\n", i, true) or n + 1) - 1)
      end
    elseif c == "[" and src:match("^%[=*%[", i) then
      local eq = src:match("^%[(=*)%[", i)
      local _, e = src:find("]" .. eq .. "]", i + 2 + #eq, true)
      add("string", e or n)
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n do
        local d = src:sub(j, j)
        if d == "\\" then j = j + 2
        elseif d == c or d == "\n" then break
        else j = j + 1 end
      end
      add("string", math.min(j, n))
    elseif c:match("[%a_]") then add("name", (src:find("[^%w_]", i) or n + 1) - 1)
    elseif c:match("%d") or (c == "." and src:sub(i + 1, i + 1):match("%d")) then
      local e = select(2, src:find("^0[xX][%x%.]*[pP]?[%+%-]?%x*", i)) or select(2, src:find("^[%d%.]*[eE]?[%+%-]?%d*", i))
      add("number", e)
    else
      local three, two = src:sub(i, i + 2), src:sub(i, i + 1)
      if three == "..." then add("op", i + 2)
      elseif two == "==" or two == "~=" or two == "<=" or two == ">=" or two == ".." or two == "::" then add("op", i + 1)
      else add("op", i) end
    end
  end
  return out
end
repl.tokens = tokens

local OPEN = { ["function"] = true, ["if"] = true, ["do"] = true, ["repeat"] = true }
local CLOSE = { ["end"] = true, ["until"] = true }

-- src with each top-level `local a, b = ...` made `a, b = ...`, `local a` made `a = nil` and
-- `local function f` made `function f`, so the names live in the session's environment.
-- Locals inside blocks (do, if, for, while, repeat, function) are left alone.
function repl.rewriteLocals(src)
  local toks = tokens(src)
  local depth = 0
  local edits = {}   -- {s, e, replacement}
  local function next_sig(i)
    i = i + 1
    while toks[i] and (toks[i][1] == "space" or toks[i][1] == "comment") do i = i + 1 end
    return i, toks[i]
  end
  local i = 1
  while i <= #toks do
    local t = toks[i]
    if t[1] == "name" then
      local w = t[2]
      if OPEN[w] then depth = depth + 1
      elseif CLOSE[w] then depth = depth - 1
      elseif w == "local" and depth == 0 then
        local j, nt = next_sig(i)
        if nt and nt[1] == "name" and nt[2] == "function" then
          edits[#edits + 1] = { t[3], nt[3] - 1, "" }
        elseif nt and nt[1] == "name" then
          -- the name list, then "=" or not
          local k, last = j, nt
          while true do
            local k2, comma = next_sig(k)
            if comma and comma[1] == "op" and comma[2] == "," then
              local k3, nm = next_sig(k2)
              if nm and nm[1] == "name" then k, last = k3, nm else break end
            else break end
          end
          local _, after = next_sig(k)
          edits[#edits + 1] = { t[3], nt[3] - 1, "" }
          if not (after and after[1] == "op" and after[2] == "=") then
            edits[#edits + 1] = { last[4] + 1, last[4], " = nil" }
          end
        end
      end
    end
    i = i + 1
  end
  if #edits == 0 then return src end
  table.sort(edits, function(a, b) return a[1] > b[1] end)
  for _, e in ipairs(edits) do src = src:sub(1, e[1] - 1) .. e[3] .. src:sub(e[2] + 1) end
  return src
end

-- ---- the session ----------------------------------------------------------------------------------

local Session = {}
Session.__index = Session

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in", "local",
                   "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

function repl.new(o)
  o = o or {}
  local out = o.output or io.stdout
  local self = setmetatable({ out = out, buffer = nil, trace = o.trace or os.getenv("QGRU_TRACEBACK") == "1" }, Session)
  local env = o.env or setmetatable({ qgru = qgru, nn = qgru.nn, optim = qgru.optim, data = qgru.data, train = qgru.train,
                                      quant = qgru.quant, Tensor = qgru.Tensor }, { __index = _G })
  rawset(env, "help", function(x) self:write(help.text(x, env), "\n") end)
  rawset(env, "print", function(...)
    local a = pack(...)
    local parts = {}
    for i = 1, a.n do parts[i] = tostring(a[i]) end
    self:write(table.concat(parts, "\t"), "\n")
  end)
  self.env = env
  return self
end

function Session:write(...)
  if self.out == io.stdout then
    local s = table.concat({ ... })
    require("qgru.progress").write(io.stdout, (s:gsub("\n$", "")))
  else
    self.out:write(...)
  end
end

function Session:prompt() return self.buffer and "  ... " or "qgru> " end

function Session:interrupt()
  self.buffer = nil
end

local function incomplete(err)
  return err ~= nil and (err:match("'<eof>'$") ~= nil or err:match("<eof>$") ~= nil)
end

-- The function of src (an expression whose value is printed, or statements); nil and the error,
-- and whether more input could complete it.
local function compile(src, env)
  local fn, err1 = load("return " .. src, "=stdin", "t", env)
  if fn then return fn end
  local fn2, err2 = load(repl.rewriteLocals(src), "=stdin", "t", env)
  if fn2 then return fn2 end
  -- the message of the source as typed (the rewrite keeps line numbers but may change text)
  local _, err0 = load(src, "=stdin", "t", env)
  return nil, err0 or err2, incomplete(err1) or incomplete(err2) or incomplete(err0)
end

-- Feeds one line; returns "ok" (ran), "more" (the statement continues), "error" (a syntax or
-- runtime error, printed) or "empty".
function Session:feed(line)
  if line == nil then return "empty" end
  if not self.buffer and line:sub(1, 1) == "\27" then
    self:write("qgru: an escape sequence (an arrow key?) was typed, but this prompt has no line editing ",
               "(libreadline8 or rlwrap gives it); the line was ignored\n")
    return "error"
  end
  if not self.buffer then
    if not line:match("%S") then return "empty" end
    line = line:gsub("^%s*=", "return ", 1)   -- Lua 5.1's "=expr"
  end
  local src = self.buffer and (self.buffer .. "\n" .. line) or line
  local fn, err, more = compile(src, self.env)
  if not fn then
    if more then
      self.buffer = src
      return "more"
    end
    self.buffer = nil
    self:write(err, "\n")
    return "error"
  end
  self.buffer = nil
  if jit then jit.off(fn, true) end   -- interpreted, so Ctrl-C stops a tight loop
  local trace = self.trace
  local res = pack(xpcall(fn, function(e)
    if type(e) == "string" and e:match("interrupted!$") then return e end
    return trace and debug.traceback(tostring(e), 2) or tostring(e)
  end))
  if not res[1] then
    local e = tostring(res[2])
    if e:match("interrupted!$") then
      self:write(self.interrupt_prefix or "", "interrupted\n")
      return "interrupted"
    end
    self:write(e, "\n")
    return "error"
  end
  if res.n > 1 then
    local parts = {}
    for i = 2, res.n do parts[#parts + 1] = repl.show(res[i]) end
    self:write(table.concat(parts, "\t"), "\n")
    rawset(self.env, "_", res[2])
  end
  return "ok"
end

-- The keys of t usable after "." (identifiers), including those of its metatable's __index
-- tables (methods); for ":" only functions.
local function fields(t, methods_only, out, seen)
  seen = seen or {}
  if type(t) ~= "table" or seen[t] then return end
  seen[t] = true
  for k, v in pairs(t) do
    if type(k) == "string" and k:match(IDENT) and (not methods_only or type(v) == "function") then out[k] = true end
  end
  local mt = getmetatable(t)
  if type(mt) == "table" then
    local idx = rawget(mt, "__index")
    if type(idx) == "table" then fields(idx, methods_only, out, seen) end
  end
end

-- Completions of text (the word before the cursor): names of the session and Lua keywords, or
-- the fields of a table reached by a chain of names ("qgru.nn.Li", "model:for").
function Session:complete(text)
  local base, sep, part = text:match("^(.*)([%.:])([%w_]*)$")
  local names = {}
  if base then
    local v, first = nil, true
    local ok = pcall(function()
      for name in base:gmatch("[^%.:]+") do
        if not name:match(IDENT) then v = nil; return end
        if first then v, first = self.env[name], false
        elseif type(v) == "table" then v = v[name]
        else v = nil; return end
        if v == nil then return end
      end
    end)
    if not ok or type(v) ~= "table" then return {} end
    fields(v, sep == ":", names)
  else
    part = text
    fields(self.env, false, names)
    for k in pairs(_G) do if type(k) == "string" and k:match(IDENT) then names[k] = true end end
    for _, k in ipairs(KEYWORDS) do names[k] = true end
  end
  local out = {}
  for k in pairs(names) do
    if k:sub(1, #part) == part and not (base and k:match("^__")) then out[#out + 1] = (base and (base .. sep) or "") .. k end
  end
  table.sort(out)
  return out
end

-- ---- the loop ---------------------------------------------------------------------------------------

local function is_interrupt(e) return type(e) == "string" and e:match("interrupted!$") ~= nil end

-- A line reader over a file descriptor (stdin): waits with poll, so Ctrl-C interrupts it.
local function fd_reader(fd)
  local buf = ""
  local r = {}
  function r.read(_, prompt, out)
    out:write(prompt)
    if out.flush then out:flush() end
    while true do
      local nl = buf:find("\n", 1, true)
      if nl then
        local line = buf:sub(1, nl - 1)
        buf = buf:sub(nl + 1)
        return line
      end
      if posix.poll(fd, -1) == "ready" then
        local data = posix.read(fd, 4096)
        if data == "" then
          if buf ~= "" then local line = buf; buf = ""; return line end
          return nil
        elseif data then
          buf = buf .. data
        end
      end
    end
  end
  -- the terminal (cooked mode) echoed ^C and dropped the typed line itself
  function r.cancel() buf = ""; return posix.isatty(fd) and "\n" or "^C\n" end
  function r.add() end
  function r.close() end
  return r
end

-- A line reader over an object with :read("*l") (tests, files).
local function file_reader(input)
  return {
    read = function(_, prompt, out)
      out:write(prompt)
      if out.flush then out:flush() end
      return input:read("*l")
    end,
    cancel = function() return "^C\n" end, add = function() end, close = function() end,
  }
end

local function reader_for(o, session)
  if o.input then return file_reader(o.input), "plain" end
  if posix.isatty(0) and os.getenv("QGRU_REPL_PLAIN") ~= "1" then
    local rl = require("qgru.readline").open{
      history = os.getenv("QGRU_HISTORY") or "~/.qgru_history",
      complete = function(text) return session:complete(text) end,
    }
    if rl then
      return {
        read = function(_, prompt) return rl:read(prompt) end,
        cancel = function() rl:cancel(); return "" end,
        add = function(_, line) rl:add(line) end,
        close = function() rl:close() end,
      }, "readline"
    end
  end
  return fd_reader(0), "plain"
end

-- The interactive loop. o.input / o.output replace stdin / stdout (then no readline).
function repl.start(o)
  o = o or {}
  local out = o.output or io.stdout
  local session = repl.new{ output = out, env = o.env }
  local reader, mode = reader_for(o, session)
  -- on a terminal, the ^C of a Ctrl-C during a run is echoed without a newline
  if not o.input and posix.isatty(0) then session.interrupt_prefix = "\n" end
  local sigint = posix.sigint_save()   -- LuaJIT's handler: re-armed after each Ctrl-C
  out:write(string.format("qgru %s  (LuaJIT; qgru, nn, optim, data, train, quant and Tensor are loaded; help() for help, Ctrl-D quits)\n",
                          qgru.VERSION))
  if mode == "plain" and not o.input and posix.isatty(0) and os.getenv("QGRU_REPL_PLAIN") ~= "1" then
    out:write("(no line editing: libreadline8 was not found; install it, or run under rlwrap)\n")
  end
  while true do
    local ok, res = pcall(function()
      local line = reader:read(session:prompt(), out)
      if line == nil then return "eof" end
      reader:add(line)
      session:feed(line)
      return "ok"
    end)
    if ok and res == "eof" then out:write("\n"); break end
    if not ok then
      if is_interrupt(res) then
        out:write(reader:cancel())
        session:interrupt()
      else
        out:write("qgru: ", tostring(res), "\n")
      end
    end
    -- LuaJIT's SIGINT handler resets itself to the default action when it fires: re-arm it
    if sigint then posix.sigint_restore(sigint) end
  end
  reader:close()
end
if jit then jit.off(repl.start, true) end

return repl
