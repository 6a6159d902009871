-- fuzz_lua_spec.lua: the Lua loader fuzzer (tests/fuzz_lua/fuzz.lua) in the normal suite: a short
-- fixed run over every target (config, qparams, checkpoint, weights), and the replay of every
-- input in tests/fuzz_lua/regressions/ (crashes and unclean errors found before; each must now
-- give a clean qgru error, or load, and leave the model unchanged when it fails).
-- Longer runs: ./qgru tests/fuzz_lua/run.lua --iterations 3000 (or tests/fuzz_lua/run.sh).
local qgru = require("qgru")
local clib = require("qgru.clib")
local U = require("testutil")

local ROOT = clib.root
if ROOT:sub(1, 1) ~= "/" then ROOT = os.getenv("PWD") .. "/" .. ROOT end
package.path = ROOT .. "/tests/fuzz_lua/?.lua;" .. package.path
local fuzz = require("fuzz")

describe("Lua loader fuzzer", function()
  it("a short run of every target finds nothing", function()
    local dir = U.tmpname("_fuzz_lua")
    qgru.mkdir(dir)
    local findings, n = fuzz.run{ iterations = 60, seed = 20261122, dir = dir }
    assert.are.equal(60 * #fuzz.TARGETS, n)
    local msgs = {}
    for _, f in ipairs(findings) do msgs[#msgs + 1] = f.target .. " #" .. f.iteration .. ": " .. f.message end
    assert.are.equal("", table.concat(msgs, "\n"))
  end)

  it("replays the regression corpus", function()
    local f = io.popen("ls '" .. ROOT .. "/tests/fuzz_lua/regressions'")
    local n = 0
    for name in f:lines() do
      local finding, target = fuzz.replay(ROOT .. "/tests/fuzz_lua/regressions/" .. name)
      assert.is_truthy(fuzz.EXT[target], name)
      assert.is_nil(finding, name .. ": " .. tostring(finding))
      n = n + 1
    end
    f:close()
    assert.is_true(n >= 5)
  end)

  it("is able to fail: an unclean error and a half-applied load are findings", function()
    local dir = U.tmpname("_fuzz_lua_self")
    qgru.mkdir(dir)
    local seeds = fuzz.makeSeeds(dir)
    local quant = qgru.quant
    local saved = quant.load
    quant.load = function(model) model:namedParameters()[1].param:fill(1); error("qgru: refused") end
    local half = fuzz.check("qparams", seeds.qparams[1])
    quant.load = function() local t = nil; return t.x end
    local unclean = fuzz.check("qparams", seeds.qparams[1])
    quant.load = saved
    assert.is_truthy(half:find("a failed load changed", 1, true))
    assert.is_truthy(unclean:find("unclean error", 1, true))
    assert.is_nil(fuzz.check("qparams", seeds.qparams[1]))
  end)
end)
