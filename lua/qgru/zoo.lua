-- zoo.lua: the models and data the recipes share, so train_float, calibrate, qat, sweep and
-- export build exactly the same network.
local nn = require("qgru.nn")
local data = require("qgru.data")
local serialize = require("qgru.serialize")

local zoo = {}

-- Fashion-MNIST rows classifier: GRU(28 -> hidden) -> last step -> Linear(hidden -> 10).
function zoo.fmnistGRU(hidden, layers)
  return nn.Sequential()
    :add(nn.GRU(28, hidden, { layers = layers or 1 }))
    :add(nn.Last())
    :add(nn.Linear(hidden, 10))
end

function zoo.fmnist(opts)
  opts = opts or {}
  local train = data.fashionMNIST("train", { dir = opts.dir, limit = opts.train_limit })
  local test = data.fashionMNIST("test", { dir = opts.dir, limit = opts.test_limit })
  return train, test
end

-- A run folder runs/<name>/ and a logger that writes to stdout and runs/<name>/log.txt.
-- The name is taken literally (no shell sees it).
function zoo.run(name, append)
  if type(name) ~= "string" or name == "" then error("qgru: zoo.run: the run name must be a non-empty string, got " .. tostring(name), 2) end
  local dir = "runs/" .. name
  serialize.mkdir(dir)
  local f, err = io.open(dir .. "/log.txt", append and "a" or "w")
  if not f then error("qgru: cannot write " .. dir .. "/log.txt: " .. tostring(err), 2) end
  local function log(line)
    io.write(line, "\n"); io.flush()
    f:write(line, "\n"); f:flush()
  end
  return dir, log
end

function zoo.exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

return zoo
