-- cli.lua: recipe options. A recipe declares its options with defaults and help; the command
-- line (`./qgru recipe.lua --epochs 3 --lr 1e-3`) overrides them with type checks, and
-- `--help` prints them.
--   local opt = cli.parse(arg, {epochs = {10, "training epochs"}, lr = {1e-3, "learning rate"}},
--                         "recipes/train_float.lua: ...")
local cli = {}

local function usage(spec, title)
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  local lines = { title or "options:" }
  for _, k in ipairs(names) do
    lines[#lines + 1] = string.format("  --%-18s %s (default: %s)", k, spec[k][2] or "", tostring(spec[k][1]))
  end
  return table.concat(lines, "\n")
end

function cli.parse(args, spec, title)
  local opt = {}
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
    if value == nil then
      if type(default) == "boolean" and (args[i + 1] == nil or args[i + 1]:match("^%-%-")) then
        value = "true"
      else
        i = i + 1
        value = args[i]
        if value == nil then error("qgru: option --" .. key .. " needs a value", 0) end
      end
    end
    if type(default) == "number" then
      local n = tonumber(value)
      if not n then error(string.format("qgru: option --%s expects a number, got '%s'", key, value), 0) end
      opt[key] = n
    elseif type(default) == "boolean" then
      if value ~= "true" and value ~= "false" then error(string.format("qgru: option --%s expects true or false, got '%s'", key, value), 0) end
      opt[key] = value == "true"
    else
      opt[key] = value
    end
    i = i + 1
  end
  return opt
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
