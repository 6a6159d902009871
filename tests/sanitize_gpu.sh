#!/usr/bin/env bash
# sanitize_gpu.sh: compute-sanitizer (memcheck with leak checking, then racecheck) over the #gpu
# tests of the GPU specs, on a machine with a CUDA device, from the project root, with QGRU_LIB
# pointing at a CUDA build (and busted on PATH or at /tmp/deps/usr/bin/busted):
#   tests/sanitize_gpu.sh [SPEC.lua ...]     (default: every spec under tests/lua with a #gpu test)
# Each spec file runs in one busted process under the tool. LuaJIT runs with its JIT compiler off
# (-joff): under compute-sanitizer the JIT ended the process after a few tests with status 6 and
# no message (seen with busted and with a plain runner alike), while the interpreter runs every
# test; the C and CUDA code the tests call is the same either way. QGRU_SANITIZE_TOOLS picks the
# tools (default "memcheck racecheck"); QGRU_SANITIZE_TIMEOUT bounds each (tool, spec) run in
# seconds (default 600). Logs go to $OUT (default /tmp/qgru-sanitize), one per tool and spec.
# The exit status is non-zero when a tool reports an error, a test fails or a run times out.
set -uo pipefail
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
busted=/tmp/deps/usr/bin/busted
[ -f "$busted" ] || busted=$(command -v busted)
out=${OUT:-/tmp/qgru-sanitize}
mkdir -p "$out"
specs=("$@")
if [ ${#specs[@]} -eq 0 ]; then
  mapfile -t specs < <(grep -l "#gpu" tests/lua/*_spec.lua)
fi
rc=0
for tool in ${QGRU_SANITIZE_TOOLS:-memcheck racecheck}; do
  extra=()
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  for s in "${specs[@]}"; do
    log="$out/$tool-$(basename "$s" .lua).log"
    t0=$(date +%s)
    timeout "${QGRU_SANITIZE_TIMEOUT:-600}" "$cs" --tool "$tool" "${extra[@]}" --print-limit 20 --error-exitcode 9 \
      luajit -joff "$busted" --run=unit -o plainTerminal -t gpu "$s" > "$log" 2>&1
    st=$?
    summary=$(grep -E "successes" "$log" | tail -1)
    tool_sum=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" "$log" | tr '\n' ' ')
    echo "[$tool] $s: status $st, $(( $(date +%s) - t0 )) s; ${summary:-no busted summary}; $tool_sum"
    if [ $st -ne 0 ]; then rc=1; echo "[$tool] FAILED: $s (status $st; 124 = timeout, 9 = sanitizer error)"; tail -15 "$log"; fi
  done
done
exit $rc
