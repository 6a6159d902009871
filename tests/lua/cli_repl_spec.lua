-- cli_repl_spec.lua: recipe option parsing and the REPL (driven through in-memory input).
local cli = require("qgru.cli")
local repl = require("qgru.repl")

local spec = { epochs = { 10, "epochs" }, lr = { 1e-3, "learning rate" }, name = { "run", "run name" }, fast = { false, "flag" } }

describe("cli.parse", function()
  it("takes defaults and overrides with type conversion", function()
    local o = cli.parse({ "--epochs", "3", "--lr=0.5", "--fast", "--name", "x" }, spec)
    assert.are.same({ epochs = 3, lr = 0.5, name = "x", fast = true }, o)
    assert.are.same({ epochs = 10, lr = 1e-3, name = "run", fast = false }, cli.parse({}, spec))
  end)
  it("rejects unknown options and bad values", function()
    assert.raises_match(function() cli.parse({ "--epoch", "3" }, spec) end, "unknown option --epoch")
    assert.raises_match(function() cli.parse({ "--epochs", "many" }, spec) end, "option --epochs expects a number, got 'many'")
    assert.raises_match(function() cli.parse({ "--epochs" }, spec) end, "option --epochs needs a value")
    assert.raises_match(function() cli.parse({ "stray" }, spec) end, "unexpected argument 'stray'")
  end)
end)

-- A file-like object over a list of lines, and an output collector.
local function session(lines)
  local i, out = 0, {}
  local input = { read = function() i = i + 1; return lines[i] end }
  local output = { write = function(_, ...) for _, s in ipairs({ ... }) do out[#out + 1] = tostring(s) end end, flush = function() end }
  repl.start({ input = input, output = output })
  return table.concat(out)
end

describe("REPL", function()
  it("prints expression values without '=', tensors and models readably", function()
    local out = session({ "1 + 2", "t = qgru.tensor({{1, 2}, {3, 4}})", "t", "nn.Linear(2, 3)" })
    assert.is_truthy(out:find("qgru> 3\n", 1, true))
    assert.is_truthy(out:find("qgru.Tensor [2, 2] f32 cpu\n  1 2\n  3 4", 1, true))
    assert.is_truthy(out:find("nn.Linear(2 -> 3)  -- 9 parameters", 1, true))
  end)
  it("continues incomplete input and reports errors without stopping", function()
    local out = session({ "for i = 1, 2 do", "x = (x or 0) + i", "end", "x", "nn.GRU(0, 1)", "x * 2" })
    assert.is_truthy(out:find("  ... ", 1, true))
    assert.is_truthy(out:find("qgru> 3\n", 1, true))
    assert.is_truthy(out:find("inputSize must be a positive integer", 1, true))
    assert.is_truthy(out:find("qgru> 6\n", 1, true))
  end)
  it("keeps session variables out of the real globals", function()
    session({ "leaked_var = 42" })
    assert.is_nil(rawget(_G, "leaked_var"))
  end)
end)
