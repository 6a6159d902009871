-- export_c_spec.lua: the C99 export (lua/qgru/deploy/c99.lua) against qgru's integer forward, bit
-- for bit: random models (1-3 layers, bidirectional, h0, variable lengths, every operator at a
-- random bitwidth in 2..16, asymmetric and unsigned quantizers), compiled with
-- gcc -std=c99 -Wall -Wextra -Werror -pedantic, run by the generated .npy driver; every output
-- step and the final states must have the same float32 bits as qgru's (deq is one-to-one, so
-- equal bits are equal output.h codes). The Cortex-M4 cross-compile (arm-none-eabi-gcc) is checked
-- when the compiler is there (QGRU_REQUIRE_ARM=1, set by .ci/run, makes its absence a failure).
-- The exporter's refusals name the operator.
local qgru = require("qgru")
local E = require("export_util")
local deploy = require("qgru.deploy.model")
local c99 = require("qgru.deploy.c99")
local data = qgru.data

local CFLAGS = "-std=c99 -Wall -Wextra -Werror -pedantic -O1"

local function export(r, dir, name)
  local desc = deploy.describe(r.model, { what = "export c" })
  return c99.write(desc, dir, { name = name })
end

local function compile_and_run(r, dir, name)
  local ok, out = E.run(string.format("cd '%s' && gcc %s -o %s_main %s_main.c %s.c", dir, CFLAGS, name, name, name))
  assert(ok, "gcc failed:\n" .. out)
  E.saveInputs(r, dir)
  local cmd = string.format("cd '%s' && ./%s_main x.npy y.npy --hn hn.npy%s%s%s", dir, name,
    r.lengths and " --lengths lengths.npy" or "", r.h0 and " --h0 h0.npy" or "", r.logits and " --logits logits.npy" or "")
  ok, out = E.run(cmd)
  assert(ok, "driver failed:\n" .. out)
  return data.npy(dir .. "/y.npy"), data.npy(dir .. "/hn.npy"), r.logits and data.npy(dir .. "/logits.npy")
end

local function check_equal(what, got, want)
  assert.are.same(want:shape(), got:shape())
  local i, a, b = E.firstBitDiff(got, want)
  if i then error(string.format("%s: element %d differs: C %.9g, qgru %.9g", what, i, a, b)) end
end

describe("C99 export == qgru's integer forward, bit for bit", function()
  local cases = {
    { seed = 101, T = 7, N = 3, C = 3, H = 4, L = 1, bidir = false, h0 = false, lengths = false },
    { seed = 102, T = 9, N = 4, C = 2, H = 5, L = 1, bidir = true, h0 = true, lengths = true },
    { seed = 103, T = 6, N = 3, C = 4, H = 3, L = 2, bidir = false, h0 = true, lengths = true, method = "histogram" },
    { seed = 104, T = 8, N = 3, C = 3, H = 4, L = 2, bidir = true, h0 = true, lengths = true },
    { seed = 105, T = 5, N = 2, C = 5, H = 3, L = 3, bidir = true, h0 = false, lengths = true, method = "mse" },
    { seed = 106, T = 10, N = 3, C = 2, H = 6, L = 3, bidir = false, h0 = true, lengths = false },
    { seed = 107, T = 6, N = 4, C = 3, H = 4, L = 1, bidir = true, h0 = true, lengths = true, head = 3 },
    { seed = 108, T = 7, N = 3, C = 4, H = 5, L = 2, bidir = true, h0 = true, lengths = true, lo = 2, hi = 8 },
    { seed = 109, T = 7, N = 3, C = 4, H = 5, L = 2, bidir = false, h0 = true, lengths = true, lo = 12, hi = 16 },
  }
  local bits_seen, uns_seen, asym_seen = {}, false, false
  for _, c in ipairs(cases) do
    it(string.format("seed %d: T=%d N=%d C=%d H=%d layers=%d%s%s%s%s", c.seed, c.T, c.N, c.C, c.H, c.L,
                     c.bidir and " bidirectional" or "", c.h0 and " h0" or "", c.lengths and " lengths" or "",
                     c.head and " head" or ""), function()
      local r = E.build(c)
      for _, e in ipairs(qgru.quant.quantizers(r.model)) do
        local q = e.quantizer
        bits_seen[q.bitwidth] = true
        if q.is_unsigned then uns_seen = true end
        if not q.is_symmetric then asym_seen = true end
      end
      local dir = E.tmpdir("c99")
      local name = "m" .. c.seed
      export(r, dir, name)
      local y, hn, logits = compile_and_run(r, dir, name)
      check_equal("y", y, r.y)
      check_equal("h_n", hn, r.hn)
      if logits then
        -- the float head: same float32 weights, another summation order than qgru's BLAS
        local a, b = logits:totable(), r.logits:totable()
        for n = 1, #a do for k = 1, #a[n] do assert(math.abs(a[n][k] - b[n][k]) <= 1e-5 * (1 + math.abs(b[n][k]))) end end
      end
      os.execute("rm -rf '" .. dir .. "'")
    end)
  end
  it("covered bitwidths 2..16, unsigned and asymmetric quantizers", function()
    local n = 0
    for b = 2, 16 do if bits_seen[b] then n = n + 1 end end
    assert.is_true(n >= 12, "only " .. n .. " of the bitwidths 2..16 were drawn")
    assert.is_true(uns_seen and asym_seen)
  end)
end)

describe("C99 export: the step function is the sequence function one step at a time", function()
  it("streams 2 layers", function()
    local r = E.build({ seed = 120, T = 6, N = 1, C = 3, H = 4, L = 2, bidir = false, h0 = false })
    local dir = E.tmpdir("c99step")
    export(r, dir, "st")
    local vals = {}
    for i, a in ipairs(require("testutil").flatten(r.x:totable())) do vals[i] = string.format("%.9gf", a) end
    local src = [[
#include "st.h"
#include <stdio.h>
int main(void) {
  static const float x[6 * 3] = {XVALS};
  st_x_t xq[6 * 3];
  st_h_t y[6 * ST_OUTPUT_SIZE], hn[ST_STATE_SIZE], state[ST_STATE_SIZE], work[ST_WORK_SIZE(6)];
  st_scratch s;
  int t, i, bad = 0;
  st_quantize_input(xq, x, 6 * 3);
  if (st_sequence(y, hn, xq, 6, NULL, work, &s) != 0) return 2;
  st_reset(state);
  for (t = 0; t < 6; t++) {
    st_step(state, xq + t * 3, &s);
    for (i = 0; i < ST_HIDDEN_SIZE; i++) bad += state[ST_HIDDEN_SIZE + i] != y[t * ST_OUTPUT_SIZE + i];
  }
  for (i = 0; i < ST_STATE_SIZE; i++) bad += state[i] != hn[i];
  printf("mismatches %d\n", bad);
  return bad != 0;
}
]]
    src = src:gsub("XVALS", table.concat(vals, ", "))
    local f = assert(io.open(dir .. "/stream.c", "w"))
    f:write(src)
    f:close()
    local ok, out = E.run(string.format("cd '%s' && gcc %s -o stream stream.c st.c && ./stream", dir, CFLAGS))
    assert(ok, out)
    assert.truthy(out:match("mismatches 0"))
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("C99 export: Cortex-M4 cross-compile", function()
  it("builds the module with arm-none-eabi-gcc -mcpu=cortex-m4 -mthumb -Os", function()
    if not E.have("arm-none-eabi-gcc") then
      if os.getenv("QGRU_REQUIRE_ARM") == "1" then error("arm-none-eabi-gcc not found (apt-get install gcc-arm-none-eabi)") end
      print("\nskipped: arm-none-eabi-gcc not found (apt-get install gcc-arm-none-eabi)")
      return
    end
    local r = E.build({ seed = 130, T = 5, N = 2, C = 4, H = 8, L = 2, bidir = true, h0 = true, lengths = true, lo = 2, hi = 16 })
    local dir = E.tmpdir("c99arm")
    export(r, dir, "arm")
    local ok, out = E.run(string.format("cd '%s' && arm-none-eabi-gcc -mcpu=cortex-m4 -mthumb -Os %s -c arm.c -o arm.o && arm-none-eabi-size arm.o", dir,
                                        "-std=c99 -Wall -Wextra -Werror -pedantic"))
    assert(ok, out)
    local text, dat, bss = out:match("\n%s*(%d+)%s+(%d+)%s+(%d+)")
    assert(text and tonumber(text) > 0, out)
    print(string.format("\nCortex-M4 object of a 2-layer bidirectional GRU 4 -> 8 (mixed 2..16 bits): text+rodata %s B, data %s B, bss %s B",
                        text, dat, bss))
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("C99 export refuses what it cannot reproduce, naming the operator", function()
  local function cfg(over)
    local t = { GRU_config = { operator_config = over } }
    return qgru.quant.fromTable(qgru.json.decode(qgru.json.encode(t)), "test")
  end
  it("a 20-bit GEMM operand (simulated in float by qgru)", function()
    local r = E.build({ seed = 140, T = 3, N = 1, C = 2, H = 3, L = 1, cfg = cfg({ ["output.h"] = { bitwidth = 20 } }) })
    local ok, err = pcall(deploy.describe, r.model, { what = "export c" })
    assert.is_false(ok)
    assert.truthy(tostring(err):match("export c: l0%.fwd%.output%.h has 20 bits"), err)
  end)
  it("a sum beyond 62 bits (qgru's 128-bit cell)", function()
    local r = E.build({ seed = 141, T = 3, N = 1, C = 2, H = 3, L = 1,
                        cfg = cfg({ ["op.old_contrib"] = { bitwidth = 30 }, ["op.new_contrib"] = { bitwidth = 30 } }) })
    -- pin the two contributions 40 binades apart: the aligned sum for output.h needs ~70 bits
    local q1 = qgru.quant.get(r.model, "l0.fwd.op.old_contrib")
    local q2 = qgru.quant.get(r.model, "l0.fwd.op.new_contrib")
    q1:pin(-20, 0); q2:pin(20, 0)
    local ok, err = pcall(function() c99.generate(deploy.describe(r.model, { what = "export c" }), { name = "x" }) end)
    assert.is_false(ok)
    assert.truthy(tostring(err):match("l0%.fwd%.output%.h: the aligned sum of op%.old_contrib, op%.new_contrib"), err)
  end)
  it("a model without quantizers", function()
    local m = qgru.nn.GRU(2, 3)
    local ok, err = pcall(deploy.describe, m, { what = "export c" })
    assert.is_false(ok)
    assert.truthy(tostring(err):match("no quantizers"), err)
  end)
end)
