-- class.lua: a minimal class helper in the spirit of torch.class: class(name, parent) returns a
-- class table whose call creates an instance and runs __init. Instances answer :isInstanceOf().
local function class(name, parent)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.__parent = parent
  if parent then
    setmetatable(cls, { __index = parent, __call = function(c, ...) return c.new(...) end })
    -- Metamethods are not inherited through __index; copy the parent's.
    for _, mm in ipairs({ "__tostring", "__len", "__eq" }) do
      if rawget(cls, mm) == nil and parent[mm] then cls[mm] = parent[mm] end
    end
  else
    setmetatable(cls, { __call = function(c, ...) return c.new(...) end })
  end
  function cls.new(...)
    local self = setmetatable({}, cls)
    if self.__init then self:__init(...) end
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
