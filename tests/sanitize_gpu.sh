#!/usr/bin/env bash
# sanitize_gpu.sh: compute-sanitizer (memcheck, then racecheck) over the #gpu tests of GPU specs,
# on a machine with a CUDA device, from the project root, with QGRU_LIB pointing at a CUDA build:
#   tests/sanitize_gpu.sh [SPEC.lua ...]         (default: tests/lua/cuda_ops_spec.lua)
# Each test runs in its own LuaJIT process through tests/run_spec_plain.lua (under the sanitizer,
# busted, and several tests in one process, ended early with a non-zero status and no message; a
# test alone ran through), and the process's exit status is printed. QGRU_SANITIZE_TOOLS picks the
# tools (default "memcheck racecheck"); COMPUTE_SANITIZER= (empty) runs the tests without one.
# The exit status is non-zero when a tool reports an error or a test fails or ends early.
set -uo pipefail
cs=${COMPUTE_SANITIZER-/usr/local/cuda/bin/compute-sanitizer}
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=(tests/lua/cuda_ops_spec.lua)
rc=0
for tool in ${QGRU_SANITIZE_TOOLS:-memcheck racecheck}; do
  for s in "${specs[@]}"; do
    n=$(luajit tests/run_spec_plain.lua "$s" --count "#gpu") || { echo "cannot list the tests of $s"; rc=1; continue; }
    for k in $(seq 1 "$n"); do
      run=(luajit tests/run_spec_plain.lua "$s" --only "$k" "#gpu")
      if [ -n "$cs" ]; then
        extra=(--leak-check no); [ "$tool" = racecheck ] && extra=()
        out=$("$cs" --tool "$tool" "${extra[@]}" --target-processes all --error-exitcode 9 \
                bash -c '"$@"; echo "exit status $?"' _ "${run[@]}" 2>&1)
      else
        out=$(bash -c '"$@"; echo "exit status $?"' _ "${run[@]}" 2>&1)
      fi
      st=$?
      echo "$out" | grep -E "^(ok|not ok|pending) |^  |exit status|SUMMARY" | sed "s/^/[$tool] /"
      if [ $st -ne 0 ] || ! echo "$out" | grep -q "exit status 0"; then rc=1; echo "[$tool] FAILED: $s test $k (tool status $st)"; echo "$out" | tail -15; fi
    done
  done
done
exit $rc
