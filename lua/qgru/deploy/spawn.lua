-- deploy/spawn.lua: runs a program with an argument vector (posix_spawnp), never through a shell,
-- so paths and names from users reach the program as they are. Used by the exports to call the
-- ONNX builder (python3) and, when present, the Cortex-M4 compiler for the size report.
--
--   local code = spawn.run({"python3", "tools/onnx_export.py", dir}, {stdout = path})
--   -> the exit status (0..255), or nil and a message when the program could not be started
local ffi = require("ffi")

local M = {}

ffi.cdef [[
int posix_spawnp(int *pid, const char *file, const void *file_actions, const void *attrp, char *const argv[], char *const envp[]);
int posix_spawn_file_actions_init(void *file_actions);
int posix_spawn_file_actions_destroy(void *file_actions);
int posix_spawn_file_actions_addopen(void *file_actions, int fd, const char *path, int oflag, unsigned int mode);
int waitpid(int pid, int *status, int options);
char *strerror(int errnum);
extern char **environ;
]]

local O_WRONLY, O_CREAT, O_TRUNC = 1, 64, 512   -- Linux values

-- opts.stdout / opts.stderr: files that receive the program's output (truncated first).
function M.run(argv, opts)
  opts = opts or {}
  local n = #argv
  local cargv = ffi.new("char *[?]", n + 1)
  local keep = {}
  for i = 1, n do
    local s = tostring(argv[i])
    local buf = ffi.new("char[?]", #s + 1, s)
    keep[i] = buf
    cargv[i - 1] = buf
  end
  cargv[n] = nil
  local actions = ffi.new("uint64_t[64]")   -- opaque posix_spawn_file_actions_t (80 bytes on glibc)
  ffi.C.posix_spawn_file_actions_init(actions)
  if opts.stdout then ffi.C.posix_spawn_file_actions_addopen(actions, 1, opts.stdout, O_WRONLY + O_CREAT + O_TRUNC, 420) end
  if opts.stderr then ffi.C.posix_spawn_file_actions_addopen(actions, 2, opts.stderr, O_WRONLY + O_CREAT + O_TRUNC, 420) end
  local pid = ffi.new("int[1]")
  local rc = ffi.C.posix_spawnp(pid, cargv[0], actions, nil, cargv, ffi.C.environ)
  ffi.C.posix_spawn_file_actions_destroy(actions)
  if rc ~= 0 then return nil, argv[1] .. ": " .. ffi.string(ffi.C.strerror(rc)) end
  local status = ffi.new("int[1]")
  if ffi.C.waitpid(pid[0], status, 0) < 0 then return nil, "waitpid failed" end
  local st = status[0]
  if bit.band(st, 0x7f) ~= 0 then return 128 + bit.band(st, 0x7f) end   -- killed by a signal
  return bit.band(bit.rshift(st, 8), 0xff)
end

-- Whether a program can be found on PATH (runs nothing).
function M.which(prog)
  if prog:find("/") then
    local f = io.open(prog, "rb")
    if f then f:close() return prog end
    return nil
  end
  for dir in (os.getenv("PATH") or ""):gmatch("[^:]+") do
    local p = dir .. "/" .. prog
    local f = io.open(p, "rb")
    if f then f:close() return p end
  end
  return nil
end

return M
