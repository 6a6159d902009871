-- serialize.lua: safetensors files from Lua: raw save/load of named tensors, model weights,
-- checkpoints, and import of a PyTorch nn.GRU state dict.
--
-- Loading is all-or-nothing: every name, dtype and shape is checked against the model before
-- the first byte is copied, so a file for another model leaves the model exactly as it was.
local clib = require("qgru.clib")
local Tensor = require("qgru.tensor")

local ffi, lib, check = clib.ffi, clib.lib, clib.check

local M = {}

local function cpu_ctx() return clib.context("cpu") end

-- save(path, {name = Tensor, ...}, {key = "string", ...})
function M.save(path, tensors, metadata)
  local ctx = cpu_ctx()
  local out = ffi.new("qg_st_writer*[1]")
  check(ctx, lib.qg_st_writer_create(ctx, out))
  local w = ffi.gc(out[0], lib.qg_st_writer_free)
  local names = {}
  for name in pairs(tensors) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do check(ctx, lib.qg_st_writer_add(ctx, w, name, tensors[name].t)) end
  for k, v in pairs(metadata or {}) do check(ctx, lib.qg_st_writer_metadata(ctx, w, k, tostring(v))) end
  check(ctx, lib.qg_st_writer_save(ctx, w, path))
  lib.qg_st_writer_free(ffi.gc(w, nil))
end

-- An open safetensors file: f.entries[name] = {dtype=, shape=}, f.metadata, f:read(name, dst).
local File = {}
File.__index = File

function M.open(path)
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
                        table.concat(problems, "\n  ")), 3)
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

function M.loadModel(model, path)
  local f = M.open(path)
  local params = model:namedParameters()
  check_params(f, params, "", "weights file")
  for _, p in ipairs(params) do f:read(p.name, p.param) end
  f:close()
  return model
end

-- Lua values <-> a Lua-literal string, for checkpoint metadata (options, history, engine state).
local function serialize_value(v, out)
  local t = type(v)
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then out[#out + 1] = v ~= v and "0/0" or (v > 0 and "1/0" or "-1/0")
    else out[#out + 1] = string.format("%.17g", v) end
  elseif t == "string" then out[#out + 1] = string.format("%q", v)
  elseif t == "boolean" then out[#out + 1] = tostring(v)
  elseif t == "table" then
    out[#out + 1] = "{"
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    for _, k in ipairs(keys) do
      out[#out + 1] = "["; serialize_value(k, out); out[#out + 1] = "]="; serialize_value(v[k], out); out[#out + 1] = ","
    end
    out[#out + 1] = "}"
  else
    error("qgru: cannot serialize a " .. t, 3)
  end
end

function M.encode(v)
  local out = {}
  serialize_value(v, out)
  return table.concat(out)
end

function M.decode(s, what)
  local fn, err = loadstring("return " .. s)
  if not fn then error("qgru: corrupt " .. (what or "metadata") .. ": " .. err, 2) end
  setfenv(fn, {})
  local ok, v = pcall(fn)
  if not ok then error("qgru: corrupt " .. (what or "metadata") .. ": " .. tostring(v), 2) end
  return v
end

-- Checkpoint: model parameters ("model.<name>"), optimizer tensors ("optim.<name>"), the
-- context RNG ("rng", u64 as i64) and a Lua-literal "qgru.state" with everything else.
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
    ["qgru.model"] = tostring(model):match("^[^\n]*"),
    ["qgru.state"] = M.encode(state or {}),
    ["qgru.optim"] = M.encode(ostate and { kind = ostate.kind, scalars = ostate.scalars } or false),
  })
end

-- Restores a checkpoint into model and optimizer; returns the saved state table.
function M.loadCheckpoint(path, model, optimizer)
  local f = M.open(path)
  if f.metadata["qgru.kind"] ~= "checkpoint" then
    error("qgru: '" .. path .. "' is not a qgru checkpoint (qgru.kind = " .. tostring(f.metadata["qgru.kind"]) .. ")", 2)
  end
  local params = model:namedParameters()
  check_params(f, params, "model.", "checkpoint")
  local state = M.decode(f.metadata["qgru.state"] or "{}", "checkpoint state")
  local oinfo = M.decode(f.metadata["qgru.optim"] or "false", "checkpoint optimizer state")
  local ostate
  if optimizer then
    if not oinfo then error("qgru: checkpoint '" .. path .. "' holds no optimizer state", 2) end
    ostate = { kind = oinfo.kind, scalars = oinfo.scalars, tensors = {} }
    if oinfo.kind ~= optimizer.name then
      error(string.format("qgru: checkpoint '%s' holds %s state, the optimizer is %s (nothing was loaded)", path, tostring(oinfo.kind), optimizer.name), 2)
    end
    for n, t in pairs(optimizer:state().tensors) do
      local e = f.entries["optim." .. n]
      if not e or not t:sameShape(e.shape) then
        error("qgru: checkpoint '" .. path .. "': optimizer tensor " .. n .. " is missing or has another shape (nothing was loaded)", 2)
      end
    end
    for n in pairs(optimizer:state().tensors) do ostate.tensors[n] = f:read("optim." .. n) end
  end
  local rng = f:read("rng")
  -- Everything is validated: apply.
  for _, p in ipairs(params) do f:read("model." .. p.name, p.param) end
  if optimizer then optimizer:loadState(ostate) end
  local ctx = cpu_ctx()
  check(ctx, lib.qg_rng_set_state(ctx, ffi.cast("const uint64_t*", rng:ptr())))
  f:close()
  return state
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
  for _, p in ipairs(plan) do
    local src = f:read(p.name)
    local cols = src:numel() / (3 * H)
    local sp, dp = src:ptr(), Tensor.new(src:shape(), "f32")
    local d = dp:ptr()
    -- rows [0,H) r -> [H,2H); [H,2H) z -> [0,H); [2H,3H) n -> [2H,3H)
    local block = H * cols
    for i = 0, block - 1 do
      d[block + i] = sp[i]
      d[i] = sp[block + i]
      d[2 * block + i] = sp[2 * block + i]
    end
    p.dst:copy(dp)
  end
  f:close()
  return gru
end

return M
