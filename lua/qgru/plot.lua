-- plot.lua: small SVG charts written by hand (no external tools), for the plots of a run
-- directory (recipes/sweep.lua: accuracy vs bits, sensitivity bars, the mixed-precision path).
-- The output is a complete, self-contained SVG 1.1 document (well-formed XML, text escaped) that
-- opens in a browser; the same input gives the same bytes (numbers are printed with fixed
-- precision), so plots of a merged sweep equal those of an unsharded one.
--   local plot = require("qgru.plot")
--   local svg = plot.lines{title = "...", xlabel = "bits", ylabel = "accuracy (%)",
--     series = {{label = "W4", points = {{4, 80.1}, {8, 90.2}}}, {label = "QAT", points = ..., dashed = true}},
--     hlines = {{y = 90.8, label = "float"}}}
--   local svg = plot.bars{title = "...", xlabel = "drop (points)", labels = {"a", "b"}, values = {0.5, 0.1}}
--   plot.write("runs/x/plot.svg", svg)
-- Every data point of plot.lines is one element with class "point" (circle, or a cross for
-- series with marker = "cross"); every bar of plot.bars is one rect with class "bar".
local plot = {}

plot.PALETTE = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" }

local function esc(s)
  return (tostring(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;", ["'"] = "&apos;" }))
end
plot.escape = esc

local function num(v) return string.format("%.2f", v) end

local function check_finite(what, v)
  if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
    error("qgru: plot: " .. what .. ": expected a finite number, got " .. tostring(v), 3)
  end
end

-- A "nice" tick step (1, 2 or 5 times a power of ten) for about n ticks over [lo, hi].
local function nice_step(lo, hi, n)
  local raw = (hi - lo) / math.max(1, n)
  if raw <= 0 then return 1 end
  local p = 10 ^ math.floor(math.log10(raw))
  for _, m in ipairs({ 1, 2, 5, 10 }) do
    if m * p >= raw then return m * p end
  end
  return 10 * p
end

local function tick_label(v, step)
  if math.abs(v) < step * 1e-6 then v = 0 end
  local decimals = -math.floor(math.log10(step) + 1e-9)
  if decimals < 1 then return string.format("%.0f", v) end
  return string.format("%." .. decimals .. "f", v)
end

-- The frame: {x0, y0, w, h} of the plot area inside a width x height canvas.
local function frame(o, left)
  local W, H = o.width or 720, o.height or 440
  local f = { W = W, H = H, x0 = left or 70, y0 = 50, right = 170 }
  f.w = W - f.x0 - f.right
  f.h = H - f.y0 - 60
  return f
end

local function header(out, f, title)
  out[#out + 1] = '<?xml version="1.0" encoding="UTF-8"?>'
  out[#out + 1] = string.format('<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">',
    f.W, f.H, f.W, f.H)
  out[#out + 1] = string.format('<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>', f.W, f.H)
  out[#out + 1] = string.format('<text x="%s" y="24" text-anchor="middle" font-size="15" font-weight="bold">%s</text>', num(f.W / 2), esc(title or ""))
end

local function range_of(values, pad_frac)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(values) do lo, hi = math.min(lo, v), math.max(hi, v) end
  if lo == math.huge then lo, hi = 0, 1 end
  if hi - lo < 1e-9 then lo, hi = lo - 1, hi + 1 end
  local pad = (hi - lo) * (pad_frac or 0.05)
  return lo - pad, hi + pad
end

-- Line chart. o: title, xlabel, ylabel, series = {{label, points = {{x, y}, ...}, dashed,
-- marker = "circle" | "cross", line = false (markers only), color}}, hlines = {{y, label}},
-- xticks (a list of x values to label; default: nice ticks), width, height.
function plot.lines(o)
  if type(o) ~= "table" or type(o.series) ~= "table" then error("qgru: plot.lines: expected {series = {...}, ...}", 2) end
  local xs, ys = {}, {}
  for si, s in ipairs(o.series) do
    if type(s.points) ~= "table" then error("qgru: plot.lines: series " .. si .. ": expected points = {{x, y}, ...}", 2) end
    for pi, p in ipairs(s.points) do
      check_finite("series " .. si .. " point " .. pi .. " x", p[1])
      check_finite("series " .. si .. " point " .. pi .. " y", p[2])
      xs[#xs + 1], ys[#ys + 1] = p[1], p[2]
    end
  end
  for _, h in ipairs(o.hlines or {}) do check_finite("hline y", h.y); ys[#ys + 1] = h.y end
  if o.xticks then for _, x in ipairs(o.xticks) do xs[#xs + 1] = x end end
  local f = frame(o)
  local xlo, xhi = range_of(xs, 0.04)
  local ylo, yhi = range_of(ys, 0.06)
  local function px(x) return f.x0 + (x - xlo) / (xhi - xlo) * f.w end
  local function py(y) return f.y0 + f.h - (y - ylo) / (yhi - ylo) * f.h end
  local out = {}
  header(out, f, o.title)
  -- axes, grid and ticks
  out[#out + 1] = string.format('<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#444444"/>', num(f.x0), num(f.y0), num(f.w), num(f.h))
  local ystep = nice_step(ylo, yhi, 6)
  local y = math.ceil(ylo / ystep) * ystep
  while y <= yhi + 1e-9 do
    out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#dddddd"/>', num(f.x0), num(py(y)), num(f.x0 + f.w), num(py(y)))
    out[#out + 1] = string.format('<text x="%s" y="%s" text-anchor="end">%s</text>', num(f.x0 - 6), num(py(y) + 4), esc(tick_label(y, ystep)))
    y = y + ystep
  end
  local xt, xlabels = o.xticks, {}
  if xt then
    for i, x in ipairs(xt) do xlabels[i] = tostring(x) end
  else
    xt = {}
    local xstep = nice_step(xlo, xhi, 8)
    local x = math.ceil(xlo / xstep) * xstep
    while x <= xhi + 1e-9 do xt[#xt + 1] = x; xlabels[#xt] = tick_label(x, xstep); x = x + xstep end
  end
  for i, x in ipairs(xt) do
    out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444444"/>', num(px(x)), num(f.y0 + f.h), num(px(x)), num(f.y0 + f.h + 5))
    out[#out + 1] = string.format('<text x="%s" y="%s" text-anchor="middle">%s</text>', num(px(x)), num(f.y0 + f.h + 18), esc(xlabels[i]))
  end
  out[#out + 1] = string.format('<text x="%s" y="%s" text-anchor="middle">%s</text>', num(f.x0 + f.w / 2), num(f.H - 14), esc(o.xlabel or ""))
  out[#out + 1] = string.format('<text x="16" y="%s" text-anchor="middle" transform="rotate(-90 16 %s)">%s</text>', num(f.y0 + f.h / 2), num(f.y0 + f.h / 2), esc(o.ylabel or ""))
  -- reference lines (dotted), listed first in the legend
  local legend_y = f.y0 + 10
  local lx = f.x0 + f.w + 10
  for _, h in ipairs(o.hlines or {}) do
    local color = h.color or "#000000"
    out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-dasharray="2,3"/>', num(f.x0), num(py(h.y)), num(f.x0 + f.w),
      num(py(h.y)), color)
    out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-dasharray="2,3"/>', num(lx), num(legend_y), num(lx + 22),
      num(legend_y), color)
    out[#out + 1] = string.format('<text x="%s" y="%s">%s</text>', num(lx + 28), num(legend_y + 4), esc(h.label or ""))
    legend_y = legend_y + 18
  end
  -- series
  for si, s in ipairs(o.series) do
    local color = s.color or plot.PALETTE[(si - 1) % #plot.PALETTE + 1]
    local dash = s.dashed and ' stroke-dasharray="6,4"' or ""
    if s.line ~= false and #s.points > 1 then
      local pts = {}
      for _, p in ipairs(s.points) do pts[#pts + 1] = num(px(p[1])) .. "," .. num(py(p[2])) end
      out[#out + 1] = string.format('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>', table.concat(pts, " "), color, dash)
    end
    for _, p in ipairs(s.points) do
      local cx, cy = px(p[1]), py(p[2])
      if s.marker == "cross" then
        out[#out + 1] = string.format('<path class="point" d="M%s %sL%s %sM%s %sL%s %s" stroke="%s" stroke-width="2"/>', num(cx - 4), num(cy - 4), num(cx + 4),
          num(cy + 4), num(cx - 4), num(cy + 4), num(cx + 4), num(cy - 4), color)
      else
        out[#out + 1] = string.format('<circle class="point" cx="%s" cy="%s" r="3.5" fill="%s"/>', num(cx), num(cy), color)
      end
    end
    if s.label then
      if s.line == false then
        local cx, cy = lx + 11, legend_y
        out[#out + 1] = string.format('<path d="M%s %sL%s %sM%s %sL%s %s" stroke="%s" stroke-width="2"/>', num(cx - 4), num(cy - 4), num(cx + 4),
          num(cy + 4), num(cx - 4), num(cy + 4), num(cx + 4), num(cy - 4), color)
      else
        out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>', num(lx), num(legend_y), num(lx + 22), num(legend_y), color, dash)
      end
      out[#out + 1] = string.format('<text x="%s" y="%s">%s</text>', num(lx + 28), num(legend_y + 4), esc(s.label))
      legend_y = legend_y + 18
    end
  end
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

-- Horizontal bar chart, one bar per label (top to bottom in the given order). o: title, xlabel,
-- labels, values, width (height grows with the number of bars), color.
function plot.bars(o)
  if type(o) ~= "table" or type(o.labels) ~= "table" or type(o.values) ~= "table" or #o.labels ~= #o.values then
    error("qgru: plot.bars: expected {labels = {...}, values = {...}} of the same length", 2)
  end
  for i, v in ipairs(o.values) do check_finite("value " .. i, v) end
  local longest = 0
  for _, l in ipairs(o.labels) do longest = math.max(longest, #tostring(l)) end
  local bar_h = 18
  local f = frame({ width = o.width or 760, height = 110 + bar_h * math.max(1, #o.values) }, 20 + 7 * longest)
  f.right = 60
  f.w = f.W - f.x0 - f.right
  local lo, hi = 0, 0
  for _, v in ipairs(o.values) do lo, hi = math.min(lo, v), math.max(hi, v) end
  if hi - lo < 1e-9 then hi = lo + 1 end
  local step = nice_step(lo, hi, 6)
  lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
  local function px(x) return f.x0 + (x - lo) / (hi - lo) * f.w end
  local out = {}
  header(out, f, o.title)
  local x = lo
  while x <= hi + 1e-9 do
    out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#dddddd"/>', num(px(x)), num(f.y0), num(px(x)), num(f.y0 + f.h))
    out[#out + 1] = string.format('<text x="%s" y="%s" text-anchor="middle">%s</text>', num(px(x)), num(f.y0 + f.h + 16), esc(tick_label(x, step)))
    x = x + step
  end
  for i, v in ipairs(o.values) do
    local y = f.y0 + 4 + (i - 1) * bar_h
    local x0, x1 = px(math.min(0, v)), px(math.max(0, v))
    out[#out + 1] = string.format('<rect class="bar" x="%s" y="%s" width="%s" height="%s" fill="%s"/>', num(x0), num(y), num(math.max(0.5, x1 - x0)),
      num(bar_h - 5), v >= 0 and (o.color or plot.PALETTE[1]) or plot.PALETTE[3])
    out[#out + 1] = string.format('<text x="%s" y="%s" text-anchor="end">%s</text>', num(f.x0 - 6), num(y + bar_h - 8), esc(o.labels[i]))
    out[#out + 1] = string.format('<text x="%s" y="%s">%s</text>', num(x1 + 4), num(y + bar_h - 8), esc(string.format("%.2f", v)))
  end
  out[#out + 1] = string.format('<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444444"/>', num(px(0)), num(f.y0), num(px(0)), num(f.y0 + f.h))
  out[#out + 1] = string.format('<text x="%s" y="%s" text-anchor="middle">%s</text>', num(f.x0 + f.w / 2), num(f.H - 14), esc(o.xlabel or ""))
  out[#out + 1] = "</svg>"
  return table.concat(out, "\n") .. "\n"
end

-- Writes text to path atomically (path.tmp, then rename).
function plot.write(path, text)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("qgru: cannot write '" .. path .. "': " .. tostring(err), 2) end
  f:write(text)
  f:close()
  local ok, rerr = os.rename(tmp, path)
  if not ok then os.remove(tmp); error("qgru: cannot write '" .. path .. "': " .. tostring(rerr), 2) end
end

return plot
