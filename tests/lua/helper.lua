-- helper.lua: loaded by busted before the specs (see .busted): registers assert.raises_match.
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
