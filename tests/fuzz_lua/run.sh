#!/usr/bin/env bash
# tests/fuzz_lua/run.sh: bounded run of the Lua loader fuzzer for CI (.ci/run). Runs run.lua;
# when the process crashes (a signal), the input that was running is copied into
# tests/fuzz_lua/regressions/ (named after the target and the time) so the normal suite
# replays it, and the exit status is 1.
#   tests/fuzz_lua/run.sh [ITERATIONS_PER_TARGET] [SEED]     (defaults 400, 1)
set -uo pipefail
root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)
out="${QGRU_FUZZ_OUT:-$root/runs/fuzz_lua}"
"$root/qgru" "$root/tests/fuzz_lua/run.lua" --iterations "${1:-400}" --seed "${2:-1}" --out "$out"
rc=$?
if [ "$rc" -gt 128 ]; then
  for f in "$out"/current-*; do
    [ -e "$f" ] || continue
    name=$(basename "$f"); name=${name#current-}
    dst="$root/tests/fuzz_lua/regressions/${name%%.*}-crash-$(date +%Y%m%d%H%M%S).${name#*.}"
    cp "$f" "$dst"
    echo "fuzz_lua: CRASH (signal $((rc - 128))); input saved as $dst" >&2
  done
  exit 1
fi
exit "$rc"
