-- help.lua: help(x) for the REPL (and scripts): the documentation written in the sources, found
-- from the value itself.
--   help()                   how to get around
--   help(nn) / help(quant)   a module: its file's header comment and its fields, one line each
--   help(nn.GRU)             a class: its file's header comment, the constructor, the methods
--   help(model), help(q)     an object (a model, a quantizer, a tensor): what it is now, then its class
--   help(quant.calibrate)    a function: its signature and the comment above its definition
--   help("recipes")          the recipes; help("qat") one recipe: its header comment and options
--   help("operators")        the GRU cell's quantized operators
--   help("quant.calibrate")  a name, looked up like the REPL would
-- help.text(x[, env]) returns the text that help(x) prints.
local help = {}

local function read_lines(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local lines = {}
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
  return lines
end

local function root()
  local ok, clib = pcall(require, "qgru.clib")
  return ok and clib.root or "."
end

-- The leading comment block of a file (without the "-- "), or nil.
local function header_comment(path)
  local lines = read_lines(path)
  if not lines then return nil end
  local out = {}
  for i, l in ipairs(lines) do
    if i == 1 and l:match("^#!") then
    elseif l:match("^%-%-") then out[#out + 1] = (l:gsub("^%-%- ?", ""))
    else break end
  end
  return #out > 0 and table.concat(out, "\n") or nil
end

-- The comment lines right above line n of a file, and line n itself (trimmed).
local function doc_above(path, n)
  local lines = read_lines(path)
  if not lines or not lines[n] then return nil, nil end
  local out = {}
  local i = n - 1
  while i >= 1 and lines[i]:match("^%s*%-%-") do
    table.insert(out, 1, (lines[i]:gsub("^%s*%-%- ?", "")))
    i = i - 1
  end
  return #out > 0 and table.concat(out, "\n") or nil, (lines[n]:gsub("^%s+", ""):gsub("%s+$", ""))
end

local function source_of(f)
  local info = debug.getinfo(f, "S")
  if not info or info.what ~= "Lua" or info.source:sub(1, 1) ~= "@" then return nil end
  return info.source:sub(2), info.linedefined, info
end

local function short_path(p)
  local r = root()
  if p:sub(1, #r + 1) == r .. "/" then return p:sub(#r + 2) end
  return (p:gsub("^%./", ""))
end

-- "(a, b, ...)" from a Lua function's parameters.
function help.params(f)
  local info = debug.getinfo(f, "u")
  if not info or info.nparams == nil then return "(...)" end
  local names = {}
  for i = 1, info.nparams do names[#names + 1] = debug.getlocal(f, i) or ("arg" .. i) end
  if info.isvararg then names[#names + 1] = "..." end
  return "(" .. table.concat(names, ", ") .. ")"
end

local function is_class(v)
  return type(v) == "table" and rawget(v, "__name") ~= nil and rawget(v, "new") ~= nil and rawget(v, "__index") == v
end
help.isClass = is_class

local function class_of(v)
  if type(v) ~= "table" then return nil end
  local mt = getmetatable(v)
  if type(mt) == "table" and is_class(mt) then return mt end
  return nil
end

-- The module name of a table in package.loaded, or nil.
local function module_name(t)
  local best
  for name, m in pairs(package.loaded) do
    if m == t and type(name) == "string" and (not best or #name < #best) then best = name end
  end
  return best
end

local function module_file(name)
  if not name then return nil end
  return package.searchpath and package.searchpath(name, package.path) or nil
end

-- The file that defines a class: the source of its constructor or its first own method.
local function class_file(cls)
  local f = rawget(cls, "__init")
  if type(f) == "function" then return (source_of(f)) end
  for _, v in pairs(cls) do
    if type(v) == "function" then
      local p = source_of(v)
      if p and not p:match("class%.lua$") then return p end
    end
  end
  return nil
end

local function first_line(s) return s and s:match("^[^\n]*") or "" end

-- One line per function field of t (own fields only), with its signature and the first line of
-- its comment.
local function field_lines(t, prefix, method)
  local names = {}
  for k, v in pairs(t) do
    if type(k) == "string" and not k:match("^_") and k ~= "new" and k ~= "isInstanceOf" then names[#names + 1] = k end
  end
  table.sort(names)
  local fns, others = {}, {}
  for _, k in ipairs(names) do
    local v = rawget(t, k)
    if type(v) == "function" then
      local path, line = source_of(v)
      local doc = path and doc_above(path, line) or nil
      local sig = help.params(v)
      if method then sig = sig:gsub("^%(self, ?", "("):gsub("^%(self%)", "()") end
      fns[#fns + 1] = string.format("  %s%s%s%s", prefix, k, sig, doc and ("  -- " .. first_line(doc)) or "")
    elseif is_class(v) then
      others[#others + 1] = string.format("  %s%s  <class %s>", prefix, k, v.__name)
    elseif type(v) == "table" then
      local n = module_name(v)
      others[#others + 1] = string.format("  %s%s  %s", prefix, k, n and ("<module " .. n .. ">") or "<table>")
    else
      others[#others + 1] = string.format("  %s%s = %s", prefix, k, type(v) == "string" and string.format("%q", v) or tostring(v))
    end
  end
  return fns, others
end

local function recipes_dir() return root() .. "/recipes" end

local RECIPES = { "train_float", "calibrate", "qat", "export", "sweep", "bench" }

-- The recipes in recipes/: the ones above first, then any other .lua file found by name.
local function recipe_names()
  local list, seen = {}, {}
  for _, n in ipairs(RECIPES) do
    if io.open(recipes_dir() .. "/" .. n .. ".lua", "rb") then list[#list + 1] = n; seen[n] = true end
  end
  return list
end

-- A recipe's options: its file is run up to its cli.main call, which is caught (nothing else
-- runs: no data, no run folder).
local function recipe_options(path)
  local cli = require("qgru.cli")
  local orig_main, orig_parse = cli.main, cli.parse
  local captured
  local STOP = {}
  cli.main = function(_, spec, title) captured = { spec = spec, title = title }; error(STOP) end
  local chunk = loadfile(path)
  local ok, err = true, nil
  if chunk then
    local saved_arg = rawget(_G, "arg")
    rawset(_G, "arg", {})
    ok, err = pcall(chunk)
    rawset(_G, "arg", saved_arg)
  end
  cli.main, cli.parse = orig_main, orig_parse
  if captured then return captured end
  if not ok and err ~= STOP then return nil end
  return nil
end

local function recipe_text(name)
  local path = name
  if not path:find("/", 1, true) then path = recipes_dir() .. "/" .. name:gsub("%.lua$", "") .. ".lua" end
  if not io.open(path, "rb") then return nil end
  local lines = { "recipe " .. short_path(path) .. "   (run: ./qgru " .. short_path(path) .. " [--option value ...])", "" }
  lines[#lines + 1] = header_comment(path) or "(no description)"
  local o = recipe_options(path)
  if o then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "options:"
    local keys = {}
    for k in pairs(o.spec) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local d = o.spec[k][1]
      lines[#lines + 1] = string.format("  --%-16s %s (default: %s)", k, o.spec[k][2] or "", d == "" and '""' or tostring(d))
    end
  end
  return table.concat(lines, "\n")
end

local function overview()
  return table.concat({
    "qgru REPL: Lua (LuaJIT) with qgru loaded. qgru, nn, optim, data, train, quant and Tensor are ready to use.",
    "  help(nn), help(quant), help(qgru)      a module and its functions",
    "  help(nn.GRU), help(model)              a class, an object (models print as trees)",
    "  help(quant.calibrate)                  a function: signature and documentation",
    "  help(\"recipes\"), help(\"qat\")           the recipes and their options",
    "  help(\"operators\")                      the quantized operators of the GRU cell",
    "Expressions print their value (no '=' needed); `local x = 1` stays defined for the next lines;",
    "unfinished statements continue on the next line. Tab completes names and table fields,",
    "the arrows recall earlier lines (history kept in ~/.qgru_history). Ctrl-C drops the line or stops",
    "a running loop; Ctrl-D quits.",
  }, "\n")
end

local function operators_text()
  local quant = require("qgru.quant")
  local config = require("qgru.quant.config")
  local lines = { "The GRU cell's quantizers (QUANT_SPEC.md; a config sets each one's bitwidth, symmetry and signedness):" }
  local w = {}
  for _, n in ipairs(config.WEIGHT_OPS or {}) do w[n] = true end
  for _, n in ipairs(quant.OPS) do
    lines[#lines + 1] = string.format("  %-16s %s", n, w[n] and "weight / bias (per channel, 3H channels)" or "activation (per tensor)")
  end
  lines[#lines + 1] = "In a model: quant.get(model, \"1.l0.fwd.gate.z_out\"), quant.quantizers(model); help(q) for one."
  return table.concat(lines, "\n")
end

-- Finds a dotted name ("quant.calibrate") in env (or the qgru table).
local function lookup(name, env)
  local v = env or {}
  local first = true
  for part in name:gmatch("[^%.:]+") do
    if first then
      v = (env and env[part]) or (part == "qgru" and require("qgru")) or rawget(_G, part)
      first = false
    elseif type(v) == "table" then v = v[part]
    else return nil end
    if v == nil then return nil end
  end
  return v
end

local function function_text(f, name)
  local path, line = source_of(f)
  if not path then
    local info = debug.getinfo(f, "S")
    if info and info.what ~= "C" then
      return (name or "function") .. help.params(f) .. ": defined in " .. info.short_src .. ":" .. tostring(info.linedefined)
    end
    return (name or "function") .. ": a built-in function (see the Lua 5.1 and LuaJIT manuals)"
  end
  local doc, def = doc_above(path, line)
  local lines = { (name or "function") .. help.params(f) .. "   [" .. short_path(path) .. ":" .. line .. "]" }
  if def and not name then lines[1] = def .. "   [" .. short_path(path) .. ":" .. line .. "]" end
  lines[#lines + 1] = doc or "(no comment above its definition)"
  return table.concat(lines, "\n")
end

-- A name for function f found in the qgru modules ("quant.calibrate"), or nil.
local function function_name(f)
  for k, v in pairs(_G) do
    if v == f and type(k) == "string" then return k end
  end
  for _, lib in ipairs({ "string", "table", "math", "io", "os", "debug", "coroutine", "bit", "jit" }) do
    local t = rawget(_G, lib)
    if type(t) == "table" then
      for k, v in pairs(t) do if v == f and type(k) == "string" then return lib .. "." .. k end end
    end
  end
  local qgru = package.loaded.qgru
  if type(qgru) ~= "table" then return nil end
  for k, v in pairs(qgru) do
    if v == f then return "qgru." .. k end
  end
  for k, m in pairs(qgru) do
    if type(m) == "table" then
      for k2, v in pairs(m) do
        if v == f then return (k == "nn" or k == "quant" or k == "optim" or k == "data" or k == "train") and (k .. "." .. k2) or ("qgru." .. k .. "." .. k2) end
      end
    end
  end
  return nil
end

local function class_text(cls, short)
  local lines = { "class " .. cls.__name .. (cls.__parent and ("  (a " .. cls.__parent.__name .. ")") or "") }
  local file = class_file(cls)
  if file then
    lines[#lines + 1] = "  [" .. short_path(file) .. "]"
    if not short then
      lines[#lines + 1] = ""
      lines[#lines + 1] = header_comment(file) or ""
    end
  end
  local init = rawget(cls, "__init")
  if type(init) == "function" then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "constructor: " .. cls.__name .. help.params(init):gsub("^%(self, ?", "("):gsub("^%(self%)", "()")
  end
  local fns = field_lines(cls, ":", true)
  if #fns > 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "methods:"
    for _, l in ipairs(fns) do lines[#lines + 1] = l end
  end
  local parent = cls.__parent
  while parent do
    local pf = field_lines(parent, ":", true)
    if #pf > 0 then
      lines[#lines + 1] = "inherited from " .. parent.__name .. ": " .. #pf .. " methods (help(" .. parent.__name .. "))"
    end
    parent = parent.__parent
  end
  return table.concat(lines, "\n")
end

local function module_text(t, name)
  local file = module_file(name)
  local lines = { "module " .. (name or "(a table)") .. (file and ("   [" .. short_path(file) .. "]") or "") }
  local head = file and header_comment(file)
  if head then lines[#lines + 1] = ""; lines[#lines + 1] = head end
  local fns, others = field_lines(t, "", false)
  if #fns > 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "functions:"
    for _, l in ipairs(fns) do lines[#lines + 1] = l end
  end
  if #others > 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "fields:"
    for _, l in ipairs(others) do lines[#lines + 1] = l end
  end
  return table.concat(lines, "\n")
end

function help.text(x, env)
  if x == nil then return overview() end
  if type(x) == "string" then
    if x == "recipes" then
      local lines = { "recipes (./qgru recipes/<name>.lua --help lists the options; help(\"<name>\") here):" }
      for _, n in ipairs(recipe_names()) do
        lines[#lines + 1] = string.format("  %-12s %s", n, (first_line(header_comment(recipes_dir() .. "/" .. n .. ".lua")):gsub("^recipes/[%w_]+%.lua: ", "")))
      end
      return table.concat(lines, "\n")
    end
    if x == "operators" or x == "quantizers" then return operators_text() end
    local r = recipe_text(x)
    if r then return r end
    local v = lookup(x, env)
    if v ~= nil then return help.text(v, env) end
    return "no help for \"" .. x .. "\": not a recipe, a topic (\"recipes\", \"operators\") or a name defined here"
  end
  if type(x) == "function" then
    if env and x == rawget(env, "print") then return "print(...): Lua's print; in the REPL it writes to the session's output" end
    if env and x == rawget(env, "help") then return overview() end
    return function_text(x, function_name(x))
  end
  if is_class(x) then return class_text(x) end
  local cls = class_of(x)
  if cls then
    return "an object of class " .. cls.__name .. ":\n" .. tostring(x) .. "\n\n" .. class_text(cls, true)
  end
  if type(x) == "table" then
    local name = module_name(x)
    if name then return module_text(x, name) end
    return require("qgru.repl").show(x) .. "\n(a table; help(x) explains modules, classes, objects, functions and recipes)"
  end
  return string.format("a %s: %s", type(x), tostring(x))
end

-- Prints help.text(x).
function help.help(x, env) print(help.text(x, env)) end

setmetatable(help, { __call = function(_, x, env) print(help.text(x, env)) end })

return help
