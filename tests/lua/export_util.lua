-- export_util.lua: random quantized models and their qgru outputs for the deployment-export tests
-- (tests/lua/export_c_spec.lua, tests/export/make_cases.lua). The expected values are qgru's own
-- integer forward, which tests/lua/quant_step_spec.lua checks bit for bit against the independent
-- reference tests/lua/qref.lua: the exports must reproduce it exactly.
local ffi = require("ffi")
local qgru = require("qgru")
local nn, quant, data = qgru.nn, qgru.quant, qgru.data

local U = {}

-- A config with a random bitwidth in lo..hi and random signedness / symmetry for every operator.
function U.randomConfig(seed, lo, hi)
  math.randomseed(seed)
  lo, hi = lo or 2, hi or 16
  local oc = {}
  for _, op in ipairs(quant.OPS) do
    local w = op:match("^weight") ~= nil
    local e = { bitwidth = math.random(lo, hi) }
    e.is_symmetric = w and (math.random() < 0.7) or (math.random() < 0.3)
    e.is_unsigned = (not w) and math.random() < 0.3
    if op == "gate.z_out" or op == "gate.r_out" then e.is_unsigned = math.random() < 0.7 end
    oc[op] = e
  end
  return quant.fromTable(qgru.json.decode(qgru.json.encode({ GRU_config = { operator_config = oc } })), "random" .. seed)
end

-- A quantized, calibrated model. c: {seed, T, N, C, H, L, bidir, h0, lengths, head, cfg | lo, hi,
-- method, widen}. Returns {model, gru, x, h0, lengths (Lua list or nil), y, hn, logits}.
function U.build(c)
  qgru.seed(c.seed)
  local gru = nn.GRU(c.C, c.H, { layers = c.L, bidirectional = c.bidir })
  for _, p in ipairs(gru:namedParameters()) do p.param:uniform(-0.8, 0.8) end
  local model = gru
  if c.head then
    model = nn.Sequential():add(gru):add(nn.Last()):add(nn.Linear(gru.dirs * c.H, c.head))
  end
  quant.prepare(model, c.cfg or U.randomConfig(c.seed, c.lo, c.hi))
  local calib = {}
  for i = 1, 2 do calib[i] = qgru.zeros({ c.T, 3, c.C }):uniform(-1.5, 1.5) end
  quant.calibrate(model, calib, { method = c.method or "minmax", passes = 2 })
  if c.widen then
    -- every calibrated activation range 4x wider (e - 2): nothing clips (a near-float model)
    for _, e in ipairs(quant.quantizers(model)) do
      local q = e.quantizer
      if not q.per_channel and not q.fixed then q:set(q.e - 2, q.is_symmetric and 0 or math.floor(q.z / 4)) end
    end
  end
  quant.freeze(model)
  model:evaluate()
  local x = qgru.zeros({ c.T, c.N, c.C }):uniform(-1.6, 1.6)
  local h0 = c.h0 and qgru.zeros({ c.L * gru.dirs, c.N, c.H }):uniform(-0.9, 0.9) or nil
  local lengths
  if c.lengths then
    lengths = {}
    for n = 1, c.N do lengths[n] = (n == 1) and c.T or math.random(1, c.T) end
  end
  local y = gru:forward({ x, h0, lengths = lengths }):clone()
  local hn = gru.h_n:clone()
  local out = { model = model, gru = gru, x = x, h0 = h0, lengths = lengths, y = y, hn = hn }
  if c.head then
    local last = nn.Last()
    out.logits = model.modules[3]:forward(last:forward(y)):clone()
  end
  return out
end

-- Writes the inputs as .npy files into dir: x.npy, h0.npy (when given), lengths.npy (i64).
function U.saveInputs(r, dir)
  data.saveNpy(dir .. "/x.npy", r.x)
  if r.h0 then data.saveNpy(dir .. "/h0.npy", r.h0) end
  if r.lengths then data.saveNpy(dir .. "/lengths.npy", qgru.tensor(r.lengths, "i64")) end
end

-- Index of the first f32 element whose bits differ (nil when identical), and the two values.
function U.firstBitDiff(a, b)
  if a:numel() ~= b:numel() then return 0, "numel " .. a:numel(), "numel " .. b:numel() end
  local pa, pb = ffi.cast("uint32_t *", a:ptr()), ffi.cast("uint32_t *", b:ptr())
  for i = 0, a:numel() - 1 do
    if pa[i] ~= pb[i] then return i, a:ptr()[i], b:ptr()[i] end
  end
  return nil
end

-- A fresh temporary directory.
function U.tmpdir(tag)
  local base = os.tmpname()
  os.remove(base)
  local dir = base .. "-" .. (tag or "qgru")
  assert(os.execute("mkdir -p '" .. dir .. "'") == 0 or true)
  return dir
end

-- Runs a command; returns ok, output.
function U.run(cmd)
  -- (children do not inherit the sanitizer suite's LD_PRELOAD of libasan)
  local f = io.popen("unset LD_PRELOAD; " .. cmd .. " 2>&1; echo \"rc=$?\"")
  local out = f:read("*a")
  f:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return rc == 0, out:gsub("rc=%d+%s*$", "")
end

function U.have(cmd) return (U.run("command -v " .. cmd)) end

return U
