-- class.lua: a minimal class helper in the spirit of torch.class: class(name, parent) returns a
-- class table whose call creates an instance and runs __init. Instances answer :isInstanceOf().
--
-- Error positions: an error raised by a constructor (a "qgru..." message positioned inside the
-- library's own files, or carrying no position) is re-raised at the caller's line, the first
-- stack frame outside lua/qgru/, so `nn.GRU(28, 0)` points at the line that wrote it, not at
-- class.lua.
local LIB_DIR = (debug.getinfo(1, "S").source:gsub("^@", ""):match("^(.*/)[^/]*$") or "./")

local function in_library(src) return src:sub(1, 1) == "@" and src:sub(2, #LIB_DIR + 1) == LIB_DIR end

-- "file:line: " of the first frame (from level up) outside the library, or "".
local function user_position(level)
  while true do
    local info = debug.getinfo(level + 1, "Sl")
    if not info then return "" end
    if info.currentline and info.currentline > 0 and info.what ~= "C" and not in_library(info.source) then
      return info.short_src .. ":" .. info.currentline .. ": "
    end
    level = level + 1
  end
end

-- Re-raises err from a constructor at the caller's position (see above).
local function rethrow(err)
  if type(err) == "string" then
    local pos, rest = err:match("^([^\n]-:%d+: )(qgru.*)$")
    local lib_pos = pos and (pos:sub(1, #LIB_DIR) == LIB_DIR or pos:match("class%.lua:%d+: $"))
    if (pos == nil and err:match("^qgru")) or lib_pos then
      error(user_position(3) .. (rest or err), 0)
    end
  end
  error(err, 0)
end

local function construct(ok, ...)
  if not ok then rethrow((...)) end
  return ...
end

local function class(name, parent)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.__parent = parent
  if parent then
    setmetatable(cls, { __index = parent, __call = function(c, ...) return construct(pcall(c.new, ...)) end })
    -- Metamethods are not inherited through __index; copy the parent's.
    for _, mm in ipairs({ "__tostring", "__len", "__eq" }) do
      if rawget(cls, mm) == nil and parent[mm] then cls[mm] = parent[mm] end
    end
  else
    setmetatable(cls, { __call = function(c, ...) return construct(pcall(c.new, ...)) end })
  end
  function cls.new(...)
    local self = setmetatable({}, cls)
    if self.__init then
      local ok, err = pcall(self.__init, self, ...)
      if not ok then rethrow(err) end
    end
    return self
  end
  function cls:isInstanceOf(other)
    local c = getmetatable(self)
    while c do
      if c == other then return true end
      c = c.__parent
    end
    return false
  end
  return cls
end

return class
