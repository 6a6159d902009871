-- serialize.lua: safetensors files from Lua: raw save/load of named tensors, model weights,
-- checkpoints, and import of a PyTorch nn.GRU state dict.
--
-- Loading is all-or-nothing: every name, dtype and shape is checked against the model before
-- the first byte is copied, so a file for another model leaves the model exactly as it was.
-- Checkpoints are data: tensors and JSON metadata, checked completely (readCheckpoint) before
-- anything is applied; metadata that is Lua source (qgru 0.1) is refused, never run.
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")
local json = require("qgru.json")

local ffi, lib, check = clib.ffi, clib.lib, clib.check

local M = {}

local function cpu_ctx() return clib.context("cpu") end

-- Creates a directory and its parents (like mkdir -p, through C: no shell sees the path).
function M.mkdir(path)
  if type(path) ~= "string" or path == "" then error("qgru: mkdir: expected a non-empty path, got " .. tostring(path), 2) end
  if path:find("\0", 1, true) then error("qgru: mkdir: the path contains a NUL byte", 2) end
  local ctx = cpu_ctx()
  check(ctx, lib.qg_mkdir_p(ctx, path))
  return path
end

-- save(path, {name = Tensor, ...}, {key = "string", ...}). Tensors may live on any device: CUDA
-- ones are read through the cuda context, whose stream orders the copy after the work that wrote
-- them (one device-to-host copy per tensor).
function M.save(path, tensors, metadata)
  local ctx = cpu_ctx()
  for _, t in pairs(tensors) do
    if t:device() ~= "cpu" then ctx = clib.context(t:device()); break end
  end
  local out = ffi.new("qg_st_writer*[1]")
  check(ctx, lib.qg_st_writer_create(ctx, out))
  local w = ffi.gc(out[0], lib.qg_st_writer_free)
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do check(ctx, lib.qg_st_writer_add(ctx, w, name, tensors[name].t)) end
  -- metadata in sorted key order, so the same content always gives the same bytes
  local keys = {}
  for k in pairs(metadata or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do check(ctx, lib.qg_st_writer_metadata(ctx, w, k, tostring(metadata[k]))) end
  check(ctx, lib.qg_st_writer_save(ctx, w, path))
  lib.qg_st_writer_free(ffi.gc(w, nil))
end

-- An open safetensors file: f.entries[name] = {dtype=, shape=}, f.metadata, f:read(name, dst).
local File = {}
File.__index = File

function M.open(path)
  if type(path) ~= "string" then error("qgru: expected a safetensors file path, got " .. type(path), 2) end
  local fh = io.open(path, "rb")
  if fh then   -- a directory opens, and fails on the first read
    local _, _, code = fh:read(0)
    fh:close()
    if code == 21 then error("qgru: '" .. path .. "': is a directory, not a safetensors file", 2) end
  end
  local ctx = cpu_ctx()
  local out = ffi.new("qg_st_file*[1]")
  check(ctx, lib.qg_st_open(ctx, out, path))
  local self = setmetatable({ path = path, h = ffi.gc(out[0], lib.qg_st_close), entries = {}, names = {}, metadata = {} }, File)
  local name, dt, nd, dims = ffi.new("const char*[1]"), ffi.new("int[1]"), ffi.new("int[1]"), ffi.new("int64_t[4]")
  for i = 0, tonumber(lib.qg_st_count(self.h)) - 1 do
    check(ctx, lib.qg_st_entry(ctx, self.h, i, name, dt, nd, dims))
    local shape = {}
    for d = 0, nd[0] - 1 do shape[d + 1] = tonumber(dims[d]) end
    local n = ffi.string(name[0])
    self.entries[n] = { dtype = clib.dtype_names[dt[0]], shape = shape }
    self.names[#self.names + 1] = n
  end
  for i = 0, tonumber(lib.qg_st_metadata_count(self.h)) - 1 do
    local k = ffi.string(lib.qg_st_metadata_key(self.h, i))
    self.metadata[k] = ffi.string(lib.qg_st_metadata(self.h, k))
  end
  return self
end

function File:read(name, dst)
  local e = self.entries[name]
  if not e then error("qgru: '" .. self.path .. "' has no tensor '" .. name .. "'", 2) end
  dst = dst or Tensor.new(e.shape, e.dtype, "cpu")
  local ctx = dst:ctx()
  check(ctx, lib.qg_st_read(ctx, self.h, name, dst.t))
  return dst
end

function File:close()
  if self.h ~= nil then lib.qg_st_close(ffi.gc(self.h, nil)); self.h = nil end
end

-- load(path) -> {name = Tensor}, metadata
function M.load(path)
  local f = M.open(path)
  local out = {}
  for _, n in ipairs(f.names) do out[n] = f:read(n) end
  local meta = f.metadata
  f:close()
  return out, meta
end

local report_nonfinite

-- Checks that file f holds every (prefix .. name) of params with the same dtype and shape.
local function check_params(f, params, prefix, what)
  local problems = {}
  for _, p in ipairs(params) do
    local e = f.entries[prefix .. p.name]
    if not e then
      problems[#problems + 1] = "missing " .. prefix .. p.name
    elseif e.dtype ~= p.param:dtype() or not p.param:sameShape(e.shape) then
      problems[#problems + 1] = string.format("%s%s: file has %s %s, model has %s %s", prefix, p.name, e.dtype,
                                              Tensor.shape_str(e.shape), p.param:dtype(), Tensor.shape_str(p.param:shape()))
    end
    if #problems >= 6 then problems[#problems + 1] = "..."; break end
  end
  if #problems > 0 then
    error(string.format("qgru: %s '%s' does not match the model (nothing was loaded):\n  %s", what, f.path,
                        table.concat(problems, "\n  ")), 0)
  end
end

-- Model weights: one safetensors entry per named parameter.
function M.saveModel(model, path, metadata)
  local t = {}
  for _, p in ipairs(model:namedParameters()) do t[p.name] = p.param end
  local meta = { ["qgru.kind"] = "weights", ["qgru.model"] = tostring(model):match("^[^\n]*") }
  for k, v in pairs(metadata or {}) do meta[k] = v end
  M.save(path, t, meta)
end

-- Loads model weights (all or nothing); parameters holding NaN or Inf are reported by name
-- (M.warn) and listed in the second result.
function M.loadModel(model, path)
  local f = M.open(path)
  local params = model:namedParameters()
  local ok, err = pcall(check_params, f, params, "", "weights file")
  if not ok then f:close(); error(err, 2) end
  local loaded = {}
  for _, p in ipairs(params) do loaded[#loaded + 1] = { name = p.name, dst = p.param, t = f:read(p.name) } end
  f:close()
  local nonfinite = report_nonfinite(path, loaded)
  for _, l in ipairs(loaded) do l.dst:copy(l.t) end
  return model, nonfinite
end

-- ---- checkpoint metadata: JSON data, never code ----
-- Checkpoints of qgru 0.1 stored their metadata as Lua source and ran it to load it; those are
-- refused (never executed). The metadata is JSON now: non-finite numbers (a diverged loss in the
-- history) are written as {"$float": "nan" | "inf" | "-inf"}; tables must be arrays (keys 1..n)
-- or objects (string keys).
M.CHECKPOINT_FORMAT = 2
M.MAX_STATE_BYTES = 64 * 1024 * 1024    -- qgru.state (options, history, every step's loss, quantizers)
M.MAX_OPTIM_BYTES = 64 * 1024            -- qgru.optim (kind and a few scalars)

local function to_json(v, path)
  local t = type(v)
  if t == "number" then
    if v ~= v then return json.object("$float", "nan") end
    if v == math.huge then return json.object("$float", "inf") end
    if v == -math.huge then return json.object("$float", "-inf") end
    return v
  elseif t == "string" or t == "boolean" then return v
  elseif t == "table" then
    local n, nkeys, strkeys = #v, 0, true
    for k in pairs(v) do
      nkeys = nkeys + 1
      if type(k) ~= "string" then strkeys = false end
    end
    if nkeys == 0 then return json.array({}) end
    if nkeys == n then
      local out = {}
      for i = 1, n do out[i] = to_json(v[i], path .. "[" .. i .. "]") end
      return json.array(out)
    end
    if not strkeys then error("qgru: cannot save " .. path .. " in a checkpoint: a table with mixed or sparse keys", 0) end
    local out = {}
    for k, x in pairs(v) do out[k] = to_json(x, path .. "." .. k) end
    return setmetatable(out, { kind = "object" })
  end
  error("qgru: cannot save " .. path .. " in a checkpoint: a " .. t, 0)
end

local function from_json(v)
  if type(v) ~= "table" then return v end
  if v == json.null then return nil end
  if json.isObject(v) then
    local f = v["$float"]
    if f ~= nil and next(v, next(v)) == nil and next(v) == "$float" then
      if f == "nan" then return 0 / 0 elseif f == "inf" then return math.huge elseif f == "-inf" then return -math.huge end
    end
  end
  local out = {}
  for k, x in pairs(v) do out[k] = from_json(x) end
  return out
end

function M.encode(v) return json.encode(to_json(v, "$")) end

-- Parses checkpoint metadata (JSON only; limit: most bytes accepted).
function M.decode(s, what, limit)
  what = what or "metadata"
  if type(s) ~= "string" then error("qgru: " .. what .. ": expected a JSON string, got " .. type(s), 0) end
  if limit and #s > limit then
    error(string.format("qgru: %s: %d bytes, more than the %d this qgru reads", what, #s, limit), 0)
  end
  local ok, v = pcall(json.decode, s, what)
  if not ok then error(tostring(v), 0) end
  return from_json(v)
end

local function is_int(v, lo) return type(v) == "number" and v % 1 == 0 and v == v and (not lo or v >= lo) and v < 2 ^ 53 end
local function is_num(v) return type(v) == "number" and v == v and v > -math.huge and v < math.huge end
local function tname(v)
  if type(v) == "number" then return "the number " .. tostring(v) end
  if type(v) == "string" then return "a string" end
  return type(v) == "table" and "a table" or type(v)
end

-- Checks the engine state stored in a checkpoint; returns nil or a problem.
local function check_state(st)
  if type(st) ~= "table" then return "qgru.state: expected an object, got " .. tname(st) end
  for _, k in ipairs({ "epoch", "batch_size", "epochs" }) do
    if st[k] ~= nil and not is_int(st[k], 1) then return "qgru.state." .. k .. ": expected a positive integer, got " .. tname(st[k]) end
  end
  for _, k in ipairs({ "batch", "step" }) do
    if st[k] ~= nil and not is_int(st[k], 0) then return "qgru.state." .. k .. ": expected an integer >= 0, got " .. tname(st[k]) end
  end
  if st.seed ~= nil and not is_num(st.seed) then return "qgru.state.seed: expected a number, got " .. tname(st.seed) end
  for _, k in ipairs({ "history", "losses" }) do
    local v = st[k]
    if v ~= nil then
      if type(v) ~= "table" or #v ~= (function() local n = 0 for _ in pairs(v) do n = n + 1 end return n end)() then
        return "qgru.state." .. k .. ": expected an array, got " .. tname(v)
      end
      for i, x in ipairs(v) do
        if k == "losses" and type(x) ~= "number" then return "qgru.state.losses[" .. i .. "]: expected a number, got " .. tname(x) end
        if k == "history" and type(x) ~= "table" then return "qgru.state.history[" .. i .. "]: expected an object, got " .. tname(x) end
      end
    end
  end
  if st.options ~= nil and type(st.options) ~= "table" then return "qgru.state.options: expected an object, got " .. tname(st.options) end
  if st.quant ~= nil and type(st.quant) ~= "table" then return "qgru.state.quant: expected an array, got " .. tname(st.quant) end
  return nil
end

-- Checks the optimizer metadata against the optimizer; returns nil or a problem.
local function check_optim_info(oinfo, optimizer)
  if type(oinfo) ~= "table" then return "qgru.optim: expected an object, got " .. tname(oinfo) end
  if type(oinfo.kind) ~= "string" then return "qgru.optim.kind: expected a string, got " .. tname(oinfo.kind) end
  local sc = oinfo.scalars
  if type(sc) ~= "table" then return "qgru.optim.scalars: missing (expected an object with t and lr)" end
  if not is_int(sc.t, 0) then return "qgru.optim.scalars.t: expected an integer >= 0, got " .. tname(sc.t) end
  if not is_num(sc.lr) or sc.lr < 0 then return "qgru.optim.scalars.lr: expected a finite number >= 0, got " .. tname(sc.lr) end
  for k, v in pairs(sc) do
    if type(k) ~= "string" or not is_num(v) then return "qgru.optim.scalars." .. tostring(k) .. ": expected a finite number, got " .. tname(v) end
  end
  return nil
end

-- Reports non-finite values of loaded tensors, by name (warn may be replaced, e.g. by a test).
M.warn = function(msg) io.stderr:write(msg, "\n") end
function report_nonfinite(path, list)
  local found = {}
  for _, e in ipairs(list) do
    local n, first = e.t:countNonFinite()
    if n > 0 then
      local msg = string.format("%s has %d non-finite value%s (first at element %d)", e.name, n, n == 1 and "" or "s", first)
      found[#found + 1] = msg
      M.warn("qgru: warning: " .. path .. ": " .. msg)
    end
  end
  return found
end

-- Checkpoint: model parameters ("model.<name>"), optimizer tensors ("optim.<name>"), the
-- context RNG ("rng", u64 as i64 [4]) and JSON metadata: "qgru.state" (everything else, the
-- quantizer state included) and "qgru.optim" (the optimizer's kind and scalars).
function M.saveCheckpoint(path, model, optimizer, state)
  local t = {}
  for _, p in ipairs(model:namedParameters()) do t["model." .. p.name] = p.param end
  local ostate = optimizer and optimizer:state()
  if ostate then for n, v in pairs(ostate.tensors) do t["optim." .. n] = v end end
  local rng = Tensor.new({ 4 }, "i64")
  local ctx = cpu_ctx()
  check(ctx, lib.qg_rng_get_state(ctx, ffi.cast("uint64_t*", rng:ptr())))
  t.rng = rng
  M.save(path, t, {
    ["qgru.kind"] = "checkpoint",
    ["qgru.format"] = tostring(M.CHECKPOINT_FORMAT),
    ["qgru.model"] = tostring(model):match("^[^\n]*"),
    ["qgru.state"] = M.encode(state or {}),
    ["qgru.optim"] = ostate and M.encode({ kind = ostate.kind, scalars = ostate.scalars }) or "null",
  })
end

-- Reads and checks a whole checkpoint against model and optimizer without changing either:
-- every entry's dtype and shape (model.*, optim.*, rng i64 [4] and not all zero), the JSON
-- metadata, the optimizer's kind and scalars, and the quantizer state (quant.checkState).
-- Returns a plan: plan.state (the saved state table), plan.nonfinite (warnings) and
-- plan:apply(), which copies everything in and cannot fail on a checked plan.
function M.readCheckpoint(path, model, optimizer)
  if type(path) ~= "string" then error("qgru: loadCheckpoint: expected a file path, got " .. type(path), 2) end
  local f = M.open(path)
  local function bad(msg, ...)
    f:close()
    error(string.format("qgru: checkpoint '%s': " .. msg .. " (nothing was loaded)", path, ...), 0)
  end
  local kind = f.metadata["qgru.kind"]
  if kind ~= "checkpoint" then
    f:close()
    error("qgru: '" .. path .. "' is not a qgru checkpoint (qgru.kind = " .. tostring(kind) .. ")", 0)
  end
  local fmt = f.metadata["qgru.format"]
  if fmt == nil then
    bad("written by an older qgru, whose checkpoint metadata is Lua source; it is not run (a checkpoint must be data): " ..
        "re-create it with this version")
  end
  if fmt ~= tostring(M.CHECKPOINT_FORMAT) then bad("format %s, this qgru reads %d", fmt, M.CHECKPOINT_FORMAT) end
  local params = model:namedParameters()
  local ok, err = pcall(check_params, f, params, "model.", "checkpoint")
  if not ok then f:close(); error(err, 0) end
  local okd, state = pcall(M.decode, f.metadata["qgru.state"] or "{}", "checkpoint '" .. path .. "' metadata qgru.state", M.MAX_STATE_BYTES)
  if not okd then f:close(); error(tostring(state) .. " (nothing was loaded)", 0) end
  local problem = check_state(state)
  if problem then bad("%s", problem) end
  local oko, oinfo = pcall(M.decode, f.metadata["qgru.optim"] or "null", "checkpoint '" .. path .. "' metadata qgru.optim", M.MAX_OPTIM_BYTES)
  if not oko then f:close(); error(tostring(oinfo) .. " (nothing was loaded)", 0) end
  -- every entry is expected
  local expected = { rng = true }
  for _, p in ipairs(params) do expected["model." .. p.name] = true end
  local ostate
  if optimizer then
    if oinfo == nil then bad("holds no optimizer state") end
    problem = check_optim_info(oinfo, optimizer)
    if problem then bad("%s", problem) end
    if oinfo.kind ~= optimizer.name then
      bad("holds %s state, the optimizer is %s", tostring(oinfo.kind), optimizer.name)
    end
    ostate = { kind = oinfo.kind, scalars = oinfo.scalars, tensors = {} }
    local names = {}
    for n in pairs(optimizer:state().tensors) do names[#names + 1] = n end
    table.sort(names)
    for _, n in ipairs(names) do
      local t = optimizer:state().tensors[n]
      local e = f.entries["optim." .. n]
      if not e then bad("optimizer tensor optim.%s is missing", n) end
      if e.dtype ~= t:dtype() or not t:sameShape(e.shape) then
        bad("optimizer tensor optim.%s: file has %s %s, the optimizer has %s %s", n, e.dtype, Tensor.shape_str(e.shape),
            t:dtype(), Tensor.shape_str(t:shape()))
      end
      expected["optim." .. n] = true
    end
  elseif oinfo ~= nil then
    for _, n in ipairs(f.names) do if n:match("^optim%.") then expected[n] = true end end
  end
  for _, n in ipairs(f.names) do
    if not expected[n] then bad("unexpected entry '%s'", n) end
  end
  local e = f.entries.rng
  if not e then bad("has no rng entry") end
  if e.dtype ~= "i64" or not (#e.shape == 1 and e.shape[1] == 4) then
    bad("rng: expected i64 [4], got %s %s", e.dtype, Tensor.shape_str(e.shape))
  end
  if state.quant ~= nil then
    local okq, qerr = pcall(require("qgru.quant").checkState, model, state.quant)
    if not okq then f:close(); error(tostring(qerr), 0) end
  end
  -- read everything into fresh tensors
  local rng = f:read("rng")
  local rp = rng:ptr()
  if rp[0] == 0 and rp[1] == 0 and rp[2] == 0 and rp[3] == 0 then bad("rng: the state is all zero (not a valid xoshiro256** state)") end
  local loaded = {}
  for _, p in ipairs(params) do loaded[#loaded + 1] = { name = p.name, dst = p.param, t = f:read("model." .. p.name) } end
  if ostate then
    for n in pairs(optimizer:state().tensors) do ostate.tensors[n] = f:read("optim." .. n) end
  end
  f:close()
  local plan = { state = state, nonfinite = report_nonfinite(path, loaded) }
  function plan.apply()
    for _, l in ipairs(loaded) do l.dst:copy(l.t) end
    if optimizer then optimizer:loadState(ostate) end
    local ctx = cpu_ctx()
    check(ctx, lib.qg_rng_set_state(ctx, ffi.cast("const uint64_t*", rng:ptr())))
    if state.quant ~= nil then require("qgru.quant").setState(model, state.quant) end
  end
  return plan
end

-- Restores a checkpoint into model and optimizer (and the quantizers, when it holds their
-- state); returns the saved state table. All or nothing: see readCheckpoint.
function M.loadCheckpoint(path, model, optimizer)
  local plan = M.readCheckpoint(path, model, optimizer)
  plan.apply()
  return plan.state
end

-- PyTorch nn.GRU state dict (saved with safetensors.torch.save_file) into an nn.GRU.
-- PyTorch names: weight_ih_l{k}[_reverse] [3H, in], weight_hh_l{k}[_reverse] [3H, H],
-- bias_ih_l{k}[_reverse], bias_hh_l{k}[_reverse] [3H]; gate blocks r, z, n -> qgru's z, r, g.
-- opts.prefix: the key prefix (e.g. "gru." or "rnn."); found automatically when there is one.
function M.importTorchGRU(gru, path, opts)
  opts = opts or {}
  local f = M.open(path)
  local prefix = opts.prefix
  if not prefix then
    for _, n in ipairs(f.names) do
      local p = n:match("^(.-)weight_ih_l0$")
      if p then
        if prefix and prefix ~= p then
          error("qgru: '" .. path .. "' holds several GRUs ('" .. prefix .. "', '" .. p .. "'); pass {prefix = ...}", 2)
        end
        prefix = p
      end
    end
    if not prefix then error("qgru: '" .. path .. "' has no weight_ih_l0 entry: not a PyTorch nn.GRU state dict", 2) end
  end
  local H = gru.hiddenSize
  local plan, problems = {}, {}
  for l = 0, gru.layers - 1 do
    for d = 0, gru.dirs - 1 do
      local sfx = l .. (d == 1 and "_reverse" or "")
      local w = gru.weights[l][d]
      for _, m in ipairs({ { "weight_ih_l", "W" }, { "weight_hh_l", "R" }, { "bias_ih_l", "bx" }, { "bias_hh_l", "br" } }) do
        local name = prefix .. m[1] .. sfx
        local e = f.entries[name]
        local dst = w[m[2]]
        if not e then problems[#problems + 1] = "missing " .. name
        elseif e.dtype ~= "f32" or not dst:sameShape(e.shape) then
          problems[#problems + 1] = string.format("%s: file has %s %s, expected f32 %s", name, e.dtype,
                                                  Tensor.shape_str(e.shape), Tensor.shape_str(dst:shape()))
        else plan[#plan + 1] = { name = name, dst = dst } end
      end
    end
  end
  if #problems > 0 then
    error(string.format("qgru: '%s' does not match %s (nothing was loaded):\n  %s", path, tostring(gru), table.concat(problems, "\n  ")), 2)
  end
  local reads = {}
  for _, p in ipairs(plan) do reads[#reads + 1] = { name = p.name, t = f:read(p.name) } end
  report_nonfinite(path, reads)
  for i, p in ipairs(plan) do
    local src = reads[i].t
    local cols = src:numel() / (3 * H)
    local sp, dp = src:ptr(), Tensor.new(src:shape(), "f32")
    local d = dp:ptr()
    -- rows [0,H) r -> [H,2H); [H,2H) z -> [0,H); [2H,3H) n -> [2H,3H) (byte copies: values
    -- never pass through Lua numbers)
    local block = H * cols
    ffi.copy(d + block, sp, 4 * block)
    ffi.copy(d, sp + block, 4 * block)
    ffi.copy(d + 2 * block, sp + 2 * block, 4 * block)
    p.dst:copy(dp)
  end
  f:close()
  return gru
end

return M
