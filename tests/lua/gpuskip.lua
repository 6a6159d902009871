-- gpuskip.lua: how a #gpu spec says that it cannot run here. Called first inside a describe
-- block: where no CUDA device is visible it declares one pending test whose name says why (a
-- library built without CUDA, or no GPU visible to one built with it) and returns true, and the
-- block returns at once; with a device it returns false.
--   if skip_without_cuda(pending) then return end
-- busted's describe-level `pending` (a test declared pending) is passed in: a module that a spec
-- requires does not see the spec's environment, where busted defines it.
local qgru = require("qgru")
local clib = require("qgru.clib")

return function(pending)
  if qgru.cudaAvailable() then return false end
  local why = clib.lib.qgru_has_cuda() == 1 and "has CUDA, no GPU visible" or "built without CUDA"
  pending("skipped: no CUDA device (libqgru " .. why .. ")")
  return true
end
