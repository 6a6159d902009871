-- readline.lua: GNU readline (libreadline8) through the LuaJIT FFI, for the REPL: line editing,
-- persistent history and tab completion, using readline's callback interface so that the
-- REPL's own loop waits on the terminal (poll) and Ctrl-C reaches it as a Lua error instead of
-- being swallowed inside readline.
--
--   local rl = require("qgru.readline").open{history = "~/.qgru_history", complete = fn}
--   -- nil when libreadline cannot be loaded (the REPL then reads plain lines)
--   local line = rl:read("qgru> ")   -- the line; nil at end of input (Ctrl-D)
--   rl:add(line)                     -- into the history (and the history file)
--   rl:cancel()                      -- after an interrupted rl:read: forget the line, reset the terminal
--   rl:close()
-- complete(text) returns the candidates (full words) that may replace text, the word before the
-- cursor; "." and ":" do not break words, so "qgru.nn.Li" is completed as a whole.
local ffi = require("ffi")
local posix = require("qgru.posix")

local M = {}

for _, decl in ipairs({
  "typedef void (*qgru_rl_vcpfunc_t)(char *);",
  "typedef char **(*qgru_rl_completion_func_t)(const char *, int, int);",
  "typedef char *(*qgru_rl_compentry_func_t)(const char *, int);",
  "char *strdup(const char *s);",
  "int _rl_pushed_input_available(void);",
  "extern int _rl_optimize_typeahead;",
  "void rl_echo_signal_char(int sig);",
  "void free(void *p);",
}) do pcall(ffi.cdef, decl) end
local ok_cdef = pcall(ffi.cdef, [[
  void rl_callback_handler_install(const char *prompt, qgru_rl_vcpfunc_t lhandler);
  void rl_callback_read_char(void);
  void rl_callback_handler_remove(void);
  void rl_callback_sigcleanup(void);
  void rl_free_line_state(void);
  void rl_cleanup_after_signal(void);
  int rl_replace_line(const char *text, int clear_undo);
  int rl_crlf(void);
  int rl_initialize(void);
  char **rl_completion_matches(const char *text, qgru_rl_compentry_func_t entry_func);
  extern qgru_rl_completion_func_t rl_attempted_completion_function;
  extern int rl_attempted_completion_over;
  extern int rl_completion_append_character;
  extern const char *rl_completer_word_break_characters;
  extern const char *rl_readline_name;
  extern int rl_catch_signals;
  extern int rl_catch_sigwinch;
  void using_history(void);
  void add_history(const char *line);
  int read_history(const char *filename);
  int write_history(const char *filename);
  void stifle_history(int max);
]])

local function load_lib()
  if not ok_cdef then return nil end
  for _, name in ipairs({ "libreadline.so.8", "readline", "libreadline.so" }) do
    local ok, lib = pcall(ffi.load, name)
    if ok then
      local has = pcall(function() return lib.rl_callback_handler_install end)
      if has then return lib end
    end
  end
  return nil
end

-- "~/x" -> "$HOME/x"
local function expand(path)
  if path:sub(1, 2) == "~/" then return (os.getenv("HOME") or ".") .. path:sub(2) end
  return path
end

local RL = {}
RL.__index = RL

-- Lua words: everything but . and : (and identifier characters) breaks a word.
local WORD_BREAKS = " \t\n\"\\'`@$><=;|&{}()[],+-*/%^~#"

function M.open(o)
  o = o or {}
  local lib = load_lib()
  if not lib then return nil end
  local self = setmetatable({ lib = lib, history = o.history and expand(o.history) or nil, complete = o.complete,
                              anchors = {} }, RL)
  local name = ffi.new("char[?]", 5, "qgru")
  local breaks = ffi.new("char[?]", #WORD_BREAKS + 1, WORD_BREAKS)
  self.anchors[#self.anchors + 1] = name
  self.anchors[#self.anchors + 1] = breaks
  lib.rl_readline_name = name
  lib.rl_catch_signals = 0       -- Ctrl-C is the REPL's (see repl.lua), not readline's
  lib.rl_completer_word_break_characters = breaks
  -- readline 8.1+ gathers typed-ahead characters into its own buffer, past the end of the line
  -- being accepted; lines typed (or sent) quickly would then wait for the next key: read one
  -- character at a time instead
  pcall(function() lib._rl_optimize_typeahead = 0 end)
  lib.using_history()
  lib.stifle_history(o.max_history or 2000)
  if self.history then lib.read_history(self.history) end
  -- the line handler: called by rl_callback_read_char when a line is complete (NULL: end of input)
  -- (it removes itself, so readline does not set up the next line and redraw the prompt)
  self.line_cb = ffi.cast("qgru_rl_vcpfunc_t", function(p)
    if p == nil then self.got, self.eof = nil, true
    else
      self.got = ffi.string(p)
      ffi.C.free(p)
    end
    self.done = true
    lib.rl_callback_handler_remove()
    self.installed = false
  end)
  if self.complete then
    local list, idx = {}, 0
    self.entry_cb = ffi.cast("qgru_rl_compentry_func_t", function(text, state)
      if state == 0 then
        local ok, res = pcall(self.complete, ffi.string(text))
        list, idx = (ok and type(res) == "table") and res or {}, 0
      end
      idx = idx + 1
      if list[idx] == nil then return nil end
      return ffi.C.strdup(list[idx])   -- readline frees it
    end)
    self.attempt_cb = ffi.cast("qgru_rl_completion_func_t", function(text)
      lib.rl_attempted_completion_over = 1   -- no file-name completion
      lib.rl_completion_append_character = 0
      return lib.rl_completion_matches(text, self.entry_cb)
    end)
    lib.rl_attempted_completion_function = self.attempt_cb
  end
  return self
end

-- Reads one line with editing. Waits on the terminal with poll, so a SIGINT (whose handler
-- raises a Lua error at the next instruction) interrupts it; the caller then calls rl:cancel().
function RL:read(prompt)
  local lib = self.lib
  self.done, self.got, self.eof = false, nil, false
  lib.rl_callback_handler_install(prompt, self.line_cb)
  self.installed = true
  while not self.done do
    -- keys readline already took from the terminal (typed ahead) first, then wait for more
    if self:pending() or posix.poll(0, -1) == "ready" then lib.rl_callback_read_char() end
  end
  if self.eof then self.out_newline = true end
  return self.got
end
if jit then jit.off(RL.read) end   -- interpreted: the interrupt hook and the FFI callbacks need it

-- Whether readline holds typed-ahead input that it read from the terminal but did not use yet
-- (a fast typist's, or a pasted, next line): it must be processed without waiting on the terminal.
function RL:pending()
  if self.has_pending == false then return false end
  local ok, r = pcall(function() return self.lib._rl_pushed_input_available() end)
  if not ok then self.has_pending = false; return false end
  return r ~= 0
end

-- After an interrupted read: "^C" is shown where the cursor was, the line is dropped and the
-- terminal restored; the next prompt starts on a new line.
function RL:cancel()
  local lib = self.lib
  if self.installed then
    pcall(function() lib.rl_echo_signal_char(2) end)
    lib.rl_crlf()
    lib.rl_free_line_state()
    lib.rl_callback_sigcleanup()
    lib.rl_replace_line("", 0)
    lib.rl_callback_handler_remove()
    self.installed = false
  end
end

function RL:add(line)
  if line == nil or not line:match("%S") or line == self.last then return end
  self.last = line
  self.lib.add_history(line)
  if self.history then self.lib.write_history(self.history) end
end

function RL:close()
  self:cancel()
  self.lib.rl_attempted_completion_function = nil
end

return M
