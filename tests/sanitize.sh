#!/usr/bin/env bash
# tests/sanitize.sh: the whole test suite (C tests and busted specs, through ctest) on a build
# with AddressSanitizer + UndefinedBehaviorSanitizer (-DQGRU_SANITIZE=ON, gcc), in build-sanitize/.
# Any sanitizer report aborts the test that triggered it, so the suite fails. LuaJIT is not
# instrumented: CMake gives the Lua specs LD_PRELOAD=<gcc's libasan.so> and
# ASAN_OPTIONS=detect_leaks=0 (LuaJIT and busted keep memory until exit by design).
# Usage: tests/sanitize.sh [ctest arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="${QGRU_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQGRU_SANITIZE=ON -DQGRU_CUDA=OFF >"$build.configure.log" 2>&1 || {
    cat "$build.configure.log" >&2; echo "sanitize: cmake configure failed" >&2; exit 1; }
fi
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >"$build.build.log" 2>&1 || {
  cat "$build.build.log" >&2; echo "sanitize: build failed" >&2; exit 1; }
cd "$build"
ctest --output-on-failure "$@"
echo "sanitize: the whole suite passed under ASan + UBSan"
