-- cli.lua: recipe options. A recipe declares its options with defaults and help; the command
-- line (`./qgru recipe.lua --epochs 3 --lr 1e-3`) overrides them with type checks, and
-- `--help` prints them. An option may carry rules as a third field: {int = true, min = 0,
-- max = 32, choices = {"a", "b"}, nonempty = true, bare = "true"} (bare: the value of an option
-- given without one, e.g. `--resume` alone).
--   local opt = cli.parse(arg, {epochs = {10, "training epochs", {int = true, min = 1}},
--                               lr = {1e-3, "learning rate", {min = 0}}}, "recipes/train_float.lua: ...")
-- Recipes call cli.main instead: a bad option prints the message and the usage on stderr and
-- exits with status 2 (no stack traceback), before anything else (data loading) happens.
local cli = {}

-- The options given on the command line, per parsed options table (cli.given(opt)).
local given_sets = setmetatable({}, { __mode = "k" })

-- The set of option names that the command line gave (the others took their defaults).
function cli.given(opt) return given_sets[opt] or {} end

local function usage(spec, title)
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  local lines = { title or "options:" }
  for _, k in ipairs(names) do
    local d = spec[k][1]
    lines[#lines + 1] = string.format("  --%-18s %s (default: %s)", k, spec[k][2] or "", d == "" and '""' or tostring(d))
  end
  return table.concat(lines, "\n")
end

-- Checks value v of option key against its rules; returns nil or a problem.
local function check_rules(key, v, rules)
  if not rules then return nil end
  if type(v) == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return string.format("option --%s expects a finite number, got %s", key, tostring(v)) end
    if rules.int and v % 1 ~= 0 then return string.format("option --%s expects an integer, got %s", key, tostring(v)) end
    if rules.min and v < rules.min then return string.format("option --%s must be >= %s, got %s", key, tostring(rules.min), tostring(v)) end
    if rules.max and v > rules.max then return string.format("option --%s must be <= %s, got %s", key, tostring(rules.max), tostring(v)) end
  elseif type(v) == "string" then
    if rules.nonempty and v == "" then return string.format("option --%s must not be empty", key) end
    if rules.choices then
      local ok = false
      for _, c in ipairs(rules.choices) do if c == v then ok = true end end
      if not ok then return string.format("option --%s must be one of %s, got '%s'", key, table.concat(rules.choices, ", "), v) end
    end
  end
  return nil
end

function cli.parse(args, spec, title)
  local opt, given = {}, {}
  for k, v in pairs(spec) do opt[k] = v[1] end
  local i = 1
  args = args or {}
  while i <= #args do
    local a = args[i]
    if a == "-h" or a == "--help" then print(usage(spec, title)); os.exit(0) end
    local key, inline = a:match("^%-%-([%w_%-]+)=(.*)$")
    key = key or a:match("^%-%-([%w_%-]+)$")
    if not key then error("qgru: unexpected argument '" .. a .. "'\n" .. usage(spec, title), 0) end
    key = key:gsub("-", "_")
    if not spec[key] then error("qgru: unknown option --" .. key .. "\n" .. usage(spec, title), 0) end
    local default, value = spec[key][1], inline
    local bare = spec[key][3] and spec[key][3].bare
    given[key] = true
    if value == nil then
      if type(default) == "boolean" and (args[i + 1] == nil or args[i + 1]:match("^%-%-")) then
        value = "true"
      elseif bare ~= nil and (args[i + 1] == nil or args[i + 1]:match("^%-%-")) then
        value = bare
      else
        i = i + 1
        value = args[i]
        if value == nil then error("qgru: option --" .. key .. " needs a value", 0) end
      end
    end
    if type(default) == "number" then
      local n = tonumber(value)
      if not n then error(string.format("qgru: option --%s expects a number, got '%s'", key, value), 0) end
      if n ~= n or n == math.huge or n == -math.huge then
        error(string.format("qgru: option --%s expects a finite number, got '%s'", key, value), 0)
      end
      opt[key] = n
    elseif type(default) == "boolean" then
      if value ~= "true" and value ~= "false" then error(string.format("qgru: option --%s expects true or false, got '%s'", key, value), 0) end
      opt[key] = value == "true"
    else
      opt[key] = value
    end
    i = i + 1
  end
  for k, v in pairs(opt) do
    local problem = check_rules(k, v, spec[k][3])
    if problem then error("qgru: " .. problem, 0) end
  end
  given_sets[opt] = given
  return opt
end

-- For recipes: cli.parse, then check(opt) (a function that raises "qgru: ..." errors, e.g. to
-- load a config file before any data). On an error: the message and the usage on stderr, exit
-- status 2, no traceback.
function cli.main(args, spec, title, check)
  local ok, opt = pcall(cli.parse, args, spec, title)
  local err = not ok and opt or nil
  if ok and check then
    local cok, cerr = pcall(check, opt)
    if not cok then err = cerr end
  end
  if err ~= nil then
    local msg = tostring(err)
    local u = usage(spec, title)
    if not msg:find(u, 1, true) then msg = msg .. "\n" .. u end
    io.stderr:write(msg, "\n")
    os.exit(2)
  end
  return opt
end

-- For recipes: runs fn(...) and returns its results; an error (a bad checkpoint to resume from,
-- options that differ from the checkpoint's) prints its message on stderr and exits with
-- status 2, without a traceback.
function cli.guard(fn, ...)
  local res = { pcall(fn, ...) }
  if not res[1] then
    require("qgru.progress").clear()
    io.stderr:write(tostring(res[2]), "\n")
    os.exit(2)
  end
  return unpack(res, 2, table.maxn(res))
end

-- Prints the options, sorted, one per line.
function cli.describe(opt)
  local names = {}
  for k in pairs(opt) do names[#names + 1] = k end
  table.sort(names)
  local lines = {}
  for _, k in ipairs(names) do lines[#lines + 1] = string.format("  %-18s %s", k, tostring(opt[k])) end
  return table.concat(lines, "\n")
end

return cli
