-- run_spec_plain.lua: runs the tests of one busted spec file without the busted runner, for
-- compute-sanitizer on the GPU machine (tests/sanitize_gpu.sh): under it, busted (and a long run
-- of many tests in one process) ended early with a non-zero status and no message, while single
-- tests in their own process ran through. It provides describe / it / pending / setup / teardown
-- / before_each / after_each and luassert's assert (with tests/lua/helper.lua's additions), runs
-- the tests whose full name matches one of the patterns (Lua patterns; default "#gpu"), and prints
-- one line per test on stderr.
--   luajit tests/run_spec_plain.lua SPEC.lua [--count | --only K] [PATTERN ...]
-- --count prints how many tests match; --only K runs the K-th of them alone.
-- Exit status: the number of failed tests (0 when all passed).
local spec = arg[1]
if not spec then io.stderr:write("usage: luajit tests/run_spec_plain.lua SPEC.lua [--count | --only K] [PATTERN ...]\n"); os.exit(2) end
local patterns, count_only, only = {}, false, nil
local i = 2
while i <= #arg do
  if arg[i] == "--count" then count_only = true
  elseif arg[i] == "--only" then only = tonumber(arg[i + 1]); i = i + 1
  else patterns[#patterns + 1] = arg[i] end
  i = i + 1
end
if #patterns == 0 then patterns = { "#gpu" } end
package.path = "lua/?.lua;lua/?/init.lua;tests/lua/?.lua;" .. package.path

_G.assert = require("luassert")
dofile("tests/lua/helper.lua")

local tests, names, befores, afters = {}, {}, {}, {}
local function full(name)
  local parts = {}
  for _, n in ipairs(names) do parts[#parts + 1] = n end
  parts[#parts + 1] = name
  return table.concat(parts, " ")
end
function _G.describe(name, fn)
  names[#names + 1] = name
  befores[#names], afters[#names] = {}, {}
  fn()
  befores[#names], afters[#names] = nil, nil
  names[#names] = nil
end
function _G.it(name, fn)
  local before, after = {}, {}
  for d = 1, #names do
    for _, f in ipairs(befores[d]) do before[#before + 1] = f end
    for _, f in ipairs(afters[d]) do after[#after + 1] = f end
  end
  tests[#tests + 1] = { name = full(name), fn = fn, before = before, after = after }
end
function _G.pending() error({ pending = true }) end
function _G.setup(fn) fn() end
_G.teardown = function() end
function _G.before_each(fn) table.insert(befores[#names], fn) end
function _G.after_each(fn) table.insert(afters[#names], fn) end

dofile(spec)

local selected = {}
for _, t in ipairs(tests) do
  for _, p in ipairs(patterns) do
    if t.name:find(p) then selected[#selected + 1] = t; break end
  end
end
if count_only then io.write(#selected, "\n"); os.exit(0) end
if only then selected = { selected[only] } end

local failed = 0
for k, t in ipairs(selected) do
  local ok, err = pcall(function()
    for _, f in ipairs(t.before) do f() end
    t.fn()
    for _, f in ipairs(t.after) do f() end
  end)
  local label = string.format("%d - %s", only or k, t.name)
  if ok then io.stderr:write("ok ", label, "\n")
  elseif type(err) == "table" and err.pending then io.stderr:write("pending ", label, "\n")
  else
    failed = failed + 1
    io.stderr:write("not ok ", label, "\n  ", tostring(err), "\n")
  end
end
io.stderr:write(string.format("%d tests, %d failed\n", #selected, failed))
os.exit(failed)
