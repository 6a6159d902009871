#!/usr/bin/env bash
# sanitize_gpu.sh: compute-sanitizer over the #gpu tests of the GPU specs, ONE PROCESS PER TEST,
# several at once, on a machine with a CUDA device, from the project root, with QGRU_LIB pointing
# at a CUDA build (and busted on PATH or at /tmp/deps/usr/bin/busted):
#   tests/sanitize_gpu.sh [SPEC.lua ...]     (default: every spec under tests/lua with a #gpu test)
# Why one process per test: racecheck instruments every shared-memory access, and the persistent
# kernels run thousands of steps, so a whole spec in one process (the old way) ran past 200 s; a
# test alone takes seconds to a few minutes (H200: 4 s to over 134 s), and the tests of a spec run side by side (one GPU, many
# host cores: the tool's time is mostly on the host). The tests come from `busted --list -t gpu`
# (run without the tool); each runs as `busted --filter '^<its exact name>$'` (the name with the
# pattern characters escaped). LuaJIT runs with its JIT compiler off (-joff): under
# compute-sanitizer the JIT ended the process after a few tests with status 6 and no message
# (seen with busted and with a plain runner alike), while the interpreter runs every test; the C
# and CUDA code the tests call is the same either way.
# Environment:
#   QGRU_SANITIZE_TOOLS     tools, in order (default "memcheck racecheck"; also initcheck, synccheck);
#                           memcheck runs with --leak-check full
#   QGRU_SANITIZE_JOBS      processes at once (default: the number of cores, at most 16)
#   QGRU_SANITIZE_TIMEOUT   seconds one test may take under a tool (default 600)
#   QGRU_SANITIZE_DEADLINE  seconds from the start after which no further test is started, and
#                           which no test outlives (default: none); such tests are counted as
#                           "not run" / "timeout", so a run within a fixed budget still reports
#   QGRU_SANITIZE_FILTER    Lua patterns separated by ';': only tests whose name matches one of
#                           them (default: all)
#   QGRU_SANITIZE_DIR       where the logs go (default $OUT/sanitize if OUT is set, else
#                           /tmp/qgru-sanitize): one log per (tool, spec, test) under
#                           <tool>/<spec>/NNN.log, and <tool>-<spec>.txt, one line per test
# Output: per (tool, spec) one line
#   [tool] spec: T tests, P passed, F failed, X timeout, C crashed, S sanitizer-failed, N not run;
#   E errors, H hazards (W warnings) in W0 s
# ("failed": busted reported a failure or error; "crashed": no busted summary and no timeout;
# errors: the sum of the tool's ERROR SUMMARY, or for racecheck its hazards reported as errors;
# hazards: racecheck's hazards displayed), then the lines of the tests that did not pass with the
# tail of their logs. The exit status is non-zero when a tool reports an error or hazard, a test
# fails, crashes, times out or is not run.
set -uo pipefail
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
busted=/tmp/deps/usr/bin/busted
[ -f "$busted" ] || busted=$(command -v busted)
if [ -n "${OUT:-}" ]; then dir_default="$OUT/sanitize"; else dir_default=/tmp/qgru-sanitize; fi
dir=${QGRU_SANITIZE_DIR:-$dir_default}
mkdir -p "$dir"
ncpu=$(nproc 2>/dev/null || echo 4)
jobs=${QGRU_SANITIZE_JOBS:-$(( ncpu < 16 ? ncpu : 16 ))}
timeout_s=${QGRU_SANITIZE_TIMEOUT:-600}
deadline=${QGRU_SANITIZE_DEADLINE:-}
t_start=$(date +%s)
specs=("$@")
if [ ${#specs[@]} -eq 0 ]; then
  mapfile -t specs < <(grep -l "#gpu" tests/lua/*_spec.lua)
fi

# The exact names of a spec's #gpu tests, one per line (busted --list prints "file:line: name").
list_tests() {
  luajit -joff "$busted" --run=unit -t gpu --list "$1" 2>/dev/null | sed -E 's/^[^:]+:[0-9]+: //' |
    { if [ -n "${QGRU_SANITIZE_FILTER:-}" ]; then
        luajit -e 'local ps = {}
          for p in os.getenv("QGRU_SANITIZE_FILTER"):gmatch("[^;]+") do ps[#ps + 1] = p end
          for l in io.lines() do for _, p in ipairs(ps) do if l:find(p) then print(l); break end end end'
      else cat; fi; }
}

# A Lua pattern matching exactly the string $1.
exact_pattern() {
  printf '^%s$' "$(printf '%s' "$1" | sed -E "s/([][^\$().%*+?-])/%\1/g")"
}

# One test under one tool: writes its log and one result line "status seconds name" to $3.res.
run_one() {   # tool spec log name
  local tool=$1 spec=$2 log=$3 name=$4 extra=() limit=$timeout_s t0 st
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  if [ -n "$deadline" ]; then
    local left=$(( deadline - ($(date +%s) - t_start) ))
    if [ "$left" -le 0 ]; then printf 'notrun 0 %s\n' "$name" > "$log.res"; return; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  t0=$(date +%s)
  { echo "# $tool $spec: $name"; } > "$log"
  timeout -k 5 "$limit" "$cs" --tool "$tool" "${extra[@]}" --print-limit 20 --error-exitcode 9 \
    luajit -joff "$busted" --run=unit -o plainTerminal -t gpu --filter "$(exact_pattern "$name")" "$spec" >> "$log" 2>&1
  st=$?
  printf '%s %s %s\n' "$st" "$(( $(date +%s) - t0 ))" "$name" > "$log.res"
}

rc=0
for tool in ${QGRU_SANITIZE_TOOLS:-memcheck racecheck}; do
  for s in "${specs[@]}"; do
    base=$(basename "$s" .lua)
    sdir="$dir/$tool/$base"
    rm -rf "$sdir"; mkdir -p "$sdir"
    mapfile -t names < <(list_tests "$s")
    t0=$(date +%s)
    i=0
    for name in "${names[@]}"; do
      i=$((i + 1))
      while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
      run_one "$tool" "$s" "$(printf '%s/%03d.log' "$sdir" "$i")" "$name" &
    done
    wait
    # per-test results
    n=0 pass=0 fail=0 tmo=0 crash=0 sanfail=0 notrun=0 errs=0 haz=0 warns=0
    table="$dir/$tool-$base.txt"
    : > "$table"
    bad_lines=()
    for ((k = 1; k <= i; k++)); do
      log=$(printf '%s/%03d.log' "$sdir" "$k")
      read -r st secs name < "$log.res"
      n=$((n + 1))
      summary=$(grep -E "[0-9]+ success(es)? / [0-9]+ failures? / [0-9]+ errors?" "$log" 2>/dev/null | tail -1)
      e=$(grep -E "ERROR SUMMARY: [0-9]+ error" "$log" 2>/dev/null | tail -1 | sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/')
      rl=$(grep -E "RACECHECK SUMMARY: [0-9]+ hazard" "$log" 2>/dev/null | tail -1)
      h=0; he=0; hw=0
      if [ -n "$rl" ]; then
        h=$(sed -E 's/.*SUMMARY: ([0-9]+) hazard.*/\1/' <<< "$rl")
        he=$(sed -E 's/.*\(([0-9]+) error.*/\1/' <<< "$rl")
        hw=$(sed -E 's/.*, ([0-9]+) warning.*/\1/' <<< "$rl")
      fi
      errs=$((errs + ${e:-0} + he)); haz=$((haz + h)); warns=$((warns + hw))
      if [ "$st" = notrun ]; then
        verdict="not run"; notrun=$((notrun + 1))
      elif [ "$st" = 124 ] || [ "$st" = 137 ]; then
        verdict="timeout"; tmo=$((tmo + 1))
      elif [ -z "$summary" ]; then
        verdict="crashed (status $st)"; crash=$((crash + 1))
      elif ! grep -qE "^[0-9]+ success(es)? / 0 failures / 0 errors" <<< "$summary" || [ "${summary%% *}" = 0 ]; then
        verdict="FAILED (status $st)"; fail=$((fail + 1))
      elif [ "$st" != 0 ] || [ "${e:-0}" != 0 ] || [ "$h" != 0 ]; then
        verdict="sanitizer (status $st, ${e:-0} errors, $h hazards)"; sanfail=$((sanfail + 1))
      else
        verdict="ok"; pass=$((pass + 1))
      fi
      printf '%s %4ss %-32s %s | %s\n' "$(basename "$log")" "$secs" "$verdict" "$name" "${summary:-no busted summary}" >> "$table"
      [ "$verdict" = ok ] || bad_lines+=("$log")
    done
    echo "[$tool] $s: $n tests, $pass passed, $fail failed, $tmo timeout, $crash crashed, $sanfail sanitizer-failed, $notrun not run;" \
         "$errs errors, $haz hazards ($warns warnings) in $(( $(date +%s) - t0 )) s (jobs $jobs)"
    [ "$n" -eq 0 ] && { rc=1; echo "  -- no test listed (busted --list -t gpu $s)"; }
    for log in "${bad_lines[@]}"; do
      rc=1
      echo "  -- $(grep -F "$(basename "$log") " "$table")"
      [ -s "$log" ] && tail -12 "$log" | sed 's/^/     /'
    done
  done
done
exit $rc
