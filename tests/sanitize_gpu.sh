#!/usr/bin/env bash
# sanitize_gpu.sh: compute-sanitizer over the GPU specs, on a machine with a CUDA device, from the
# project root, with QGRU_LIB pointing at a CUDA build of libqgru:
#   tests/sanitize_gpu.sh [SPEC.lua ...]         (default: tests/lua/cuda_ops_spec.lua)
# memcheck runs every #gpu test of each spec; racecheck runs the tests matching
# QGRU_RACECHECK_PATTERN (a Lua pattern; default "#gpu": all of them). busted exits at its first
# test under compute-sanitizer, so the tests run through tests/run_spec_plain.lua. The exit status
# is non-zero when a tool reports an error or a test fails.
set -uo pipefail
cs=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
specs=("$@")
[ ${#specs[@]} -eq 0 ] && specs=(tests/lua/cuda_ops_spec.lua)
rc=0
for s in "${specs[@]}"; do
  echo "== memcheck $s"
  "$cs" --tool memcheck --leak-check no --target-processes application-only --error-exitcode 9 \
    luajit tests/run_spec_plain.lua "$s" "#gpu" || rc=1
  echo "== racecheck $s (${QGRU_RACECHECK_PATTERN:-#gpu})"
  "$cs" --tool racecheck --target-processes application-only --error-exitcode 9 \
    luajit tests/run_spec_plain.lua "$s" "${QGRU_RACECHECK_PATTERN:-#gpu}" || rc=1
done
exit $rc
