#!/usr/bin/env bash
# tests/fuzz/run.sh: builds the libFuzzer targets of the C loaders with clang (-DQGRU_FUZZ=ON,
# build-fuzz/) and runs each for a bounded time (default 20 s; first argument) starting from its
# seed corpus and the regression corpus. Fails on any finding (crash, sanitizer report, leak,
# timeout, an allocation above 1 GB); the input that triggered it is kept in
# build-fuzz/artifacts/<target>/ and belongs, once fixed, in tests/fuzz/regressions/<target>/.
# The checked-in corpora are only read: new inputs go to build-fuzz/corpus/<target>/.
# Usage: tests/fuzz/run.sh [seconds per target] [target ...]   (targets: idx npy safetensors json)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="${QGRU_FUZZ_BUILD_DIR:-$root/build-fuzz}"
secs="${1:-20}"
shift || true
targets="${*:-idx npy safetensors json}"
cc="${QGRU_FUZZ_CC:-clang}"
command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (Debian: apt-get install clang libclang-rt-dev)" >&2; exit 1; }
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC="$cc" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQGRU_FUZZ=ON -DQGRU_CUDA=OFF >"$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2; echo "fuzz: cmake configure failed" >&2; exit 1; }
fi
tlist=""
for t in $targets; do tlist="$tlist fuzz_$t"; done
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" --target $tlist >"$build.build.log" 2>&1 || {
  cat "$build.build.log" >&2; echo "fuzz: build failed" >&2; exit 1; }
failed=""
for t in $targets; do
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t"
  log="$build/fuzz_$t.log"
  dirs=("$build/corpus/$t" "$root/tests/fuzz/corpus/$t")
  [ -d "$root/tests/fuzz/regressions/$t" ] && dirs+=("$root/tests/fuzz/regressions/$t")
  opts=()
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && opts+=(-dict="$root/tests/fuzz/dict/$t.dict")
  set +e
  "$build/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 "${opts[@]}" \
    -artifact_prefix="$build/artifacts/$t/" "${dirs[@]}" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz: $t FAILED (exit $rc) after ${execs:-?} executions; the input is in $build/artifacts/$t/" >&2
    failed="$failed $t"
  else
    echo "fuzz: $t: ${execs:-?} executions in ${secs} s, no finding"
  fi
done
[ -z "$failed" ] || { echo "fuzz: findings in:$failed" >&2; exit 1; }
