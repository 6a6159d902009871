-- progress.lua: progress of a long loop (training epochs, calibration, sweep points). On a
-- terminal it is one line, rewritten in place, with a bar, the count, the caller's text and an
-- ETA; elsewhere (a pipe, a log file, CI) it writes nothing itself, and the caller keeps
-- printing its plain lines as before.
--
--   local progress = require("qgru.progress")
--   local bar = progress.new{total = nb, label = "epoch 1/12"}   -- options below
--   for i = 1, nb do ...; bar:update(i, "loss 0.4213  acc 84.1%") end
--   bar:done()                       -- clears the line (a terminal); then print the summary line
--   progress.write(io.stdout, line)  -- prints a whole line above a live bar (clears and redraws it)
--   if bar.tty then ... end          -- whether a bar is drawn (else print plain lines)
--
-- Options of progress.new: total (> 0, required), label (text before the bar), out (a file,
-- default io.stdout), tty (true / false: draw a bar or not; default: whether out is a terminal,
-- overridden by QGRU_PROGRESS=bar | plain), width (the bar's characters, default 24), columns
-- (the line's width, default the terminal's), interval (seconds between redraws, default 0.1;
-- the first and the last update always draw), clock (a function returning seconds, default the
-- wall clock), start (items done before this bar began, e.g. a resumed epoch: the ETA counts
-- from there). Terminal detection is progress.isTerminal(out), replaceable by tests.
local posix = require("qgru.posix")

local progress = {}

local function default_clock()
  local ok, clib = pcall(require, "qgru.clib")
  if ok then return clib.wall_time() end
  return os.clock()
end

-- Whether out is a terminal. QGRU_PROGRESS=bar forces bars, QGRU_PROGRESS=plain plain lines.
function progress.isTerminal(out)
  local force = os.getenv("QGRU_PROGRESS")
  if force == "bar" then return true elseif force == "plain" then return false end
  local fd = posix.fd(out)
  return fd ~= nil and posix.isatty(fd)
end

-- "1:05:09", "4:07", "0:03"
function progress.formatTime(s)
  if s ~= s or s == math.huge or s < 0 then return "?" end
  s = math.floor(s + 0.5)
  local h, m, sec = math.floor(s / 3600), math.floor(s / 60) % 60, s % 60
  if h > 0 then return string.format("%d:%02d:%02d", h, m, sec) end
  return string.format("%d:%02d", m, sec)
end

-- The bar currently drawn on each output, so progress.write can clear and redraw it.
local live = setmetatable({}, { __mode = "k" })

local Bar = {}
Bar.__index = Bar

function progress.new(o)
  o = o or {}
  if type(o.total) ~= "number" or o.total < 1 or o.total % 1 ~= 0 then
    error("qgru: progress.new: total must be a positive integer, got " .. tostring(o.total), 2)
  end
  local out = o.out or io.stdout
  local tty = o.tty
  if tty == nil then tty = progress.isTerminal(out) end
  local self = setmetatable({
    total = o.total, label = o.label or "", out = out, tty = tty and true or false, width = o.width or 24,
    columns = o.columns, interval = o.interval or 0.1, clock = o.clock or default_clock,
    start = o.start or 0, done_n = o.start or 0, info = "", drawn = false, last_draw = nil,
  }, Bar)
  self.t0 = self.clock()
  return self
end

-- The line for the current state (without "\r"), cut to the terminal's width.
function Bar:line()
  local frac = math.min(1, math.max(0, self.done_n / self.total))
  local fill = math.floor(frac * self.width + 0.5)
  local elapsed = self.clock() - self.t0
  local eta
  if self.done_n >= self.total then eta = "in " .. progress.formatTime(elapsed)
  elseif self.done_n > self.start then
    eta = "ETA " .. progress.formatTime(elapsed / (self.done_n - self.start) * (self.total - self.done_n))
  else eta = "ETA ?" end
  local s = string.format("%s%s[%s%s] %3d%% %d/%d%s  %s", self.label, self.label ~= "" and " " or "",
    string.rep("#", fill), string.rep(".", self.width - fill), math.floor(100 * frac), self.done_n, self.total,
    self.info ~= "" and ("  " .. self.info) or "", eta)
  local cols = self.columns or posix.columns(posix.fd(self.out))
  if #s > cols - 1 then s = s:sub(1, cols - 1) end
  return s
end

function Bar:draw()
  self.out:write("\r\27[K", self:line())
  self.out:flush()
  self.drawn = true
  self.last_draw = self.clock()
  live[self.out] = self
end

-- n items done (of total); info: text shown after the count. Draws on a terminal (at most once
-- per interval, and always for the first and the last item); does nothing otherwise.
function Bar:update(n, info)
  self.done_n = n
  if info then self.info = info end
  if not self.tty then return end
  if not self.drawn or n >= self.total or (self.clock() - self.last_draw) >= self.interval then self:draw() end
end

-- Ends the bar: on a terminal the line is cleared, so the caller's next line takes its place.
function Bar:done()
  if self.tty and self.drawn then
    self.out:write("\r\27[K")
    self.out:flush()
  end
  if live[self.out] == self then live[self.out] = nil end
  self.drawn = false
end

-- Clears every live bar (before an error message, say).
function progress.clear()
  for out, bar in pairs(live) do
    if bar.drawn then out:write("\r\27[K"); out:flush(); bar.drawn = false end
    live[out] = nil
  end
end

-- Writes line (a newline is added) to out; a bar drawn there is cleared first and redrawn after.
function progress.write(out, line)
  local bar = live[out]
  if bar and bar.drawn then out:write("\r\27[K") end
  out:write(line, "\n")
  if bar and bar.drawn then out:write(bar:line()) end
  out:flush()
end

return progress
