-- posix.lua: the few C library calls the user-facing Lua code needs (no shell, no C of ours):
-- terminal detection and width (progress bars), process ids and liveness (run-directory locks),
-- the host name, poll/read on a file descriptor and the SIGINT disposition (the REPL). Each is
-- a plain function; a platform without one of them answers conservatively (not a terminal, 80
-- columns, "process alive").
--   posix.isatty(fd) -> bool          posix.columns(fd) -> int (COLUMNS, else the terminal's)
--   posix.pid() -> int                posix.alive(pid) -> bool (kill(pid, 0))
--   posix.hostname() -> string        posix.fd(file) -> 0 | 1 | 2 | nil (io.stdin/stdout/stderr)
--   posix.poll(fd, ms) -> "ready" | "timeout" | "interrupted"
--   posix.read(fd, n) -> string | "" (end of file) | nil, "interrupted"
--   posix.sigint_save() -> handle | nil; posix.sigint_restore(handle)
local ffi = require("ffi")

local posix = {}

-- Each declaration on its own, so one that another module made already does not stop the rest.
for _, decl in ipairs({
  "int isatty(int fd);",
  "int getpid(void);",
  "int kill(int pid, int sig);",
  "int gethostname(char *name, size_t len);",
  "int ioctl(int fd, unsigned long request, ...);",
  "struct qgru_winsize { unsigned short ws_row, ws_col, ws_xpixel, ws_ypixel; };",
  "struct qgru_pollfd { int fd; short events; short revents; };",
  "int poll(struct qgru_pollfd *fds, unsigned long nfds, int timeout);",
  "long read(int fd, void *buf, size_t count);",
  "int sigaction(int signum, const void *act, void *oldact);",
}) do pcall(ffi.cdef, decl) end
local ok_cdef = true
local C = ffi.C

local function call(name, ...)
  if not ok_cdef then return nil end
  local ok, r = pcall(function(...) return C[name](...) end, ...)
  if ok then return r end
  return nil
end

function posix.isatty(fd)
  if type(fd) ~= "number" then return false end
  return call("isatty", fd) == 1
end

-- The file descriptor of io.stdin / io.stdout / io.stderr, else nil.
function posix.fd(file)
  if file == io.stdin then return 0 elseif file == io.stdout then return 1 elseif file == io.stderr then return 2 end
  return nil
end

local TIOCGWINSZ = 0x5413   -- Linux
function posix.columns(fd)
  local env = tonumber(os.getenv("COLUMNS") or "")
  if env and env >= 20 then return math.floor(env) end
  if ok_cdef and ffi.os == "Linux" and type(fd) == "number" then
    local ws = ffi.new("struct qgru_winsize")
    local r = call("ioctl", fd, ffi.cast("unsigned long", TIOCGWINSZ), ws)
    if r == 0 and ws.ws_col >= 20 then return ws.ws_col end
  end
  return 80
end

function posix.pid() return tonumber(call("getpid") or 0) end

-- Whether process pid exists on this machine (EPERM counts as alive).
function posix.alive(pid)
  if type(pid) ~= "number" or pid <= 0 then return false end
  local r = call("kill", pid, 0)
  if r == nil then return true end
  if r == 0 then return true end
  return ffi.errno() ~= 3   -- ESRCH: no such process
end

function posix.hostname()
  local buf = ffi.new("char[256]")
  if call("gethostname", buf, 255) == 0 then return ffi.string(buf) end
  return os.getenv("HOSTNAME") or "localhost"
end

local EINTR = 4
local POLLIN = 1

function posix.poll(fd, ms)
  local p = ffi.new("struct qgru_pollfd[1]")
  p[0].fd, p[0].events = fd, POLLIN
  local r = call("poll", p, 1, ms or -1)
  if r == nil then return "ready" end
  if r < 0 then return ffi.errno() == EINTR and "interrupted" or "ready" end
  return r == 0 and "timeout" or "ready"
end

local readbuf = ffi.new("char[4096]")
function posix.read(fd, n)
  n = math.min(n or 4096, 4096)
  local r = call("read", fd, readbuf, n)
  if r == nil then return nil, "unavailable" end
  r = tonumber(r)
  if r < 0 then return nil, ffi.errno() == EINTR and "interrupted" or "error" end
  return ffi.string(readbuf, r)
end

-- SIGINT's current disposition, kept to be put back later (the REPL re-arms the interpreter's
-- Ctrl-C handler, which resets itself to the default action when it fires). nil when SIGINT
-- has the default action or is ignored, or the call is unavailable.
local SIGINT = 2
local SIGACTION_BYTES = 256   -- larger than struct sigaction on every Linux ABI
function posix.sigint_save()
  if ffi.os ~= "Linux" then return nil end
  local buf = ffi.new("uint8_t[?]", SIGACTION_BYTES)
  if call("sigaction", SIGINT, nil, buf) ~= 0 then return nil end
  local handler = ffi.cast("uintptr_t*", buf)[0]
  if handler == 0 or handler == 1 then return nil end   -- SIG_DFL, SIG_IGN
  return buf
end

function posix.sigint_restore(handle)
  if handle then call("sigaction", SIGINT, handle, nil) end
end

return posix
