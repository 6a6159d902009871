-- helper.lua: loaded by busted before the specs (see .busted): registers assert.raises_match and
-- makes the cpu the specs' default device.
-- Shared test code lives in tests/lua/testutil.lua; the library under test comes from QGRU_LIB.
local say = require("say")
local assert = require("luassert")

say:set("assertion.raises_match.positive", "Expected an error matching:\n%s\nGot:\n%s")
say:set("assertion.raises_match.negative", "Expected no error matching:\n%s\nGot:\n%s")
-- assert.raises_match(fn, pattern): fn raises an error whose message contains pattern (plain).
local function raises_match(state, args)
  local ok, err = pcall(args[1])
  local msg = tostring(err)
  args[1] = args[2]
  args[2] = ok and "(no error)" or msg
  return (not ok) and msg:find(args[1], 1, true) ~= nil
end
assert:register("assertion", "raises_match", raises_match, "assertion.raises_match.positive", "assertion.raises_match.negative")

-- The specs build on the cpu by default whatever the machine has (qgru's own default is cuda when
-- a GPU is present, or QGRU_DEVICE): the cpu is the reference they check, and the GPU specs (#gpu)
-- ask for cuda explicitly.
require("qgru").setDevice("cpu")
