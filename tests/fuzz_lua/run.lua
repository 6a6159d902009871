-- tests/fuzz_lua/run.lua: a longer run of the Lua loader fuzzer (fuzz.lua), for CI or by hand.
--   ./qgru tests/fuzz_lua/run.lua [--iterations 300] [--seed 1] [--targets config,qparams,checkpoint,weights]
--                                 [--out runs/fuzz_lua]
-- Before each case the input is saved as <out>/current-<target>.<ext>, so a crash (the process
-- dies) leaves the input that caused it; run.sh moves it into regressions/. Lua-level findings
-- (an unclean error, a model changed by a failed load) are written as
-- <out>/finding-<target>-<iteration>.<ext> and make the exit status 1. Prints the executions
-- per target.
local qgru = require("qgru")
local cli = qgru.cli

local here = debug.getinfo(1, "S").source:gsub("^@", ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. package.path
local fuzz = require("fuzz")

local opt = cli.main(arg, {
  iterations = { 300, "cases per target", { int = true, min = 1 } },
  seed = { 1, "PRNG seed", { int = true, min = 0 } },
  targets = { table.concat(fuzz.TARGETS, ","), "targets, comma separated" },
  out = { "runs/fuzz_lua", "output folder (current inputs, findings)" },
}, "tests/fuzz_lua/run.lua: mutation fuzzing of the Lua loaders")

local targets = {}
for t in opt.targets:gmatch("[^,]+") do
  if not fuzz.EXT[t] then io.stderr:write("unknown target " .. t .. "\n"); os.exit(2) end
  targets[#targets + 1] = t
end
qgru.mkdir(opt.out)
local work = opt.out .. "/work"
qgru.mkdir(work)

local function copy(src, dst)
  local f = assert(io.open(src, "rb")); local s = f:read("*a"); f:close()
  f = assert(io.open(dst, "wb")); f:write(s); f:close()
end

local t0 = qgru.wallTime()
local per = {}
local findings, n = fuzz.run{
  iterations = opt.iterations, seed = opt.seed, targets = targets, dir = work,
  on_case = function(target, path)
    -- one current input at a time: the previous target's is no longer running
    for _, t in ipairs(targets) do if t ~= target then os.remove(opt.out .. "/current-" .. t .. fuzz.EXT[t]) end end
    copy(path, opt.out .. "/current-" .. target .. fuzz.EXT[target])
    per[target] = (per[target] or 0) + 1
  end,
}
for _, t in ipairs(targets) do
  print(string.format("fuzz_lua: %-10s %d executions", t, per[t] or 0))
  os.remove(opt.out .. "/current-" .. t .. fuzz.EXT[t])
end
for _, f in ipairs(findings) do
  local p = string.format("%s/finding-%s-%d%s", opt.out, f.target, f.iteration, fuzz.EXT[f.target])
  local h = assert(io.open(p, "wb")); h:write(f.input); h:close()
  print(string.format("FINDING %s iteration %d: %s\n  input: %s", f.target, f.iteration, f.message:sub(1, 400), p))
end
print(string.format("fuzz_lua: %d executions in %.1f s, %d finding(s) (seed %d)", n, qgru.wallTime() - t0, #findings, opt.seed))
os.exit(#findings == 0 and 0 or 1)
