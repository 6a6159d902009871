-- svgutil.lua: test helpers for the SVG plots: an independent XML well-formedness checker (a
-- small parser written for the tests, not the code that writes the SVG), and a PNG reader that
-- inflates the image data with zlib through the FFI and undoes the row filters, to tell whether
-- a rendered picture is blank.
local ffi = require("ffi")

local M = {}

-- Checks that text is one well-formed XML document. Returns root element name and a table of
-- element counts by name, or nil and a message.
function M.checkXML(text)
  local pos = 1
  local n = #text
  local counts, stack, root = {}, {}, nil
  local function bad(msg) return nil, string.format("%s at byte %d", msg, pos) end
  local function check_text(s)
    if s:find("<", 1, true) then return false end
    for amp in s:gmatch("&([^;]*);?") do
      if not (amp == "amp" or amp == "lt" or amp == "gt" or amp == "quot" or amp == "apos" or amp:match("^#%d+$") or amp:match("^#x%x+$")) then
        return false
      end
    end
    -- every & must start an entity terminated by ;
    for i in s:gmatch("()&") do
      if not s:find("^&[#%w]+;", i) then return false end
    end
    return true
  end
  if text:sub(1, 5) == "<?xml" then
    local e = text:find("?>", 1, true)
    if not e then return bad("unterminated XML declaration") end
    pos = e + 2
  end
  while pos <= n do
    local lt = text:find("<", pos, true)
    local chunk = text:sub(pos, (lt or n + 1) - 1)
    if #stack == 0 and chunk:find("%S") then return bad("text outside the root element") end
    if not check_text(chunk) then return bad("bad character data") end
    if not lt then break end
    pos = lt
    if text:sub(pos, pos + 3) == "<!--" then
      local e = text:find("-->", pos + 4, true)
      if not e then return bad("unterminated comment") end
      pos = e + 3
    elseif text:sub(pos, pos + 1) == "</" then
      local name, e = text:match("^</([%a_][%w_:%.%-]*)%s*>()", pos)
      if not name then return bad("bad end tag") end
      if stack[#stack] ~= name then return bad("end tag </" .. name .. "> does not close <" .. tostring(stack[#stack]) .. ">") end
      stack[#stack] = nil
      pos = e
    else
      local name, p = text:match("^<([%a_][%w_:%.%-]*)()", pos)
      if not name then return bad("bad start tag") end
      if #stack == 0 then
        if root then return bad("a second root element") end
        root = name
      end
      local seen = {}
      while true do
        local ws, p2 = text:match("^(%s*)()", p)
        p = p2
        if text:sub(p, p + 1) == "/>" then p = p + 2; counts[name] = (counts[name] or 0) + 1; break end
        if text:sub(p, p) == ">" then p = p + 1; counts[name] = (counts[name] or 0) + 1; stack[#stack + 1] = name; break end
        if #ws == 0 then return bad("attributes must be separated by white space in <" .. name .. ">") end
        local an, q, val, p3 = text:match("^([%a_][%w_:%.%-]*)%s*=%s*([\"'])(.-)%2()", p)
        if not an then return bad("bad attribute in <" .. name .. ">") end
        if seen[an] then return bad("duplicate attribute " .. an) end
        seen[an] = true
        if not check_text(val) then return bad("bad attribute value " .. an) end
        p = p3
      end
      pos = p
    end
  end
  if #stack > 0 then return nil, "unclosed <" .. stack[#stack] .. ">" end
  if not root then return nil, "no root element" end
  return root, counts
end

-- Occurrences of a plain substring.
function M.count(text, needle)
  local c, i = 0, 1
  while true do
    local a, b = text:find(needle, i, true)
    if not a then return c end
    c, i = c + 1, b + 1
  end
end

ffi.cdef [[
int uncompress(uint8_t *dest, unsigned long *destLen, const uint8_t *source, unsigned long sourceLen);
]]
local zlib
local function z()
  if not zlib then
    local ok, lib = pcall(ffi.load, "z")
    if not ok then lib = ffi.load("libz.so.1") end
    zlib = lib
  end
  return zlib
end

local function be32(s, i) return ((s:byte(i) * 256 + s:byte(i + 1)) * 256 + s:byte(i + 2)) * 256 + s:byte(i + 3) end

-- Reads an 8-bit, non-interlaced PNG (grey, RGB, grey+alpha or RGBA). Returns
-- {width, height, channels, pixel = function(x, y) -> list of channel values (0-based x, y)}.
function M.readPNG(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  assert(s:sub(1, 8) == "\137PNG\r\n\26\n", path .. ": not a PNG file")
  local i, idat, w, h, depth, ctype, interlace = 9, {}, nil, nil, nil, nil, nil
  while i <= #s do
    local len, typ = be32(s, i), s:sub(i + 4, i + 7)
    local body = s:sub(i + 8, i + 7 + len)
    if typ == "IHDR" then
      w, h, depth, ctype, interlace = be32(body, 1), be32(body, 5), body:byte(9), body:byte(10), body:byte(13)
    elseif typ == "IDAT" then
      idat[#idat + 1] = body
    elseif typ == "IEND" then
      break
    end
    i = i + 12 + len
  end
  assert(w and depth == 8 and interlace == 0, path .. ": expected an 8-bit non-interlaced PNG")
  local channels = ({ [0] = 1, [2] = 3, [4] = 2, [6] = 4 })[ctype]
  assert(channels, path .. ": unsupported PNG color type " .. tostring(ctype))
  local src = table.concat(idat)
  local stride = w * channels
  local size = h * (stride + 1)
  local raw = ffi.new("uint8_t[?]", size)
  local len = ffi.new("unsigned long[1]", size)
  assert(z().uncompress(raw, len, src, #src) == 0 and len[0] == size, path .. ": the image data does not inflate")
  local img = ffi.new("uint8_t[?]", h * stride)
  local bpp = channels
  for y = 0, h - 1 do
    local ft = raw[y * (stride + 1)]
    local row = raw + y * (stride + 1) + 1
    local out = img + y * stride
    local prev = y > 0 and (img + (y - 1) * stride) or nil
    for x = 0, stride - 1 do
      local a = x >= bpp and out[x - bpp] or 0
      local b = prev and prev[x] or 0
      local c = (prev and x >= bpp) and prev[x - bpp] or 0
      local v = row[x]
      if ft == 1 then v = v + a
      elseif ft == 2 then v = v + b
      elseif ft == 3 then v = v + math.floor((a + b) / 2)
      elseif ft == 4 then
        local p = a + b - c
        local pa, pb, pc = math.abs(p - a), math.abs(p - b), math.abs(p - c)
        local pr = (pa <= pb and pa <= pc) and a or (pb <= pc and b or c)
        v = v + pr
      elseif ft ~= 0 then
        error(path .. ": bad PNG filter type " .. ft)
      end
      out[x] = v % 256
    end
  end
  return { width = w, height = h, channels = channels, pixel = function(x, y)
    local t = {}
    for k = 0, channels - 1 do t[k + 1] = img[y * stride + x * channels + k] end
    return t
  end }
end

-- The number of distinct pixel values and of pixels that are not white (or transparent).
function M.inkStats(png)
  local distinct, nd, ink = {}, 0, 0
  for y = 0, png.height - 1 do
    for x = 0, png.width - 1 do
      local p = png.pixel(x, y)
      local key = table.concat(p, ",")
      if not distinct[key] then distinct[key] = true; nd = nd + 1 end
      local alpha = (png.channels == 4 or png.channels == 2) and p[#p] or 255
      local white = true
      for k = 1, (png.channels >= 3 and 3 or 1) do if p[k] < 250 then white = false end end
      if alpha > 0 and not white then ink = ink + 1 end
    end
  end
  return nd, ink
end

return M
