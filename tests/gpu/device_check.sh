#!/usr/bin/env bash
# tests/gpu/device_check.sh: one call on the GPU machine for the CUDA float GRU: build, the C
# drivers tests/c/test_cuda_gru.c, test_exact_split.cu and test_igemm.cu (cgru), the #gpu specs, compute-sanitizer memcheck and racecheck
# (on the C driver; luasanitize: both tools over every #gpu spec, tests/sanitize_gpu.sh), the
# persistent-kernel sweep and the GPU benchmark (recipes/bench.lua), the cuDNN / PyTorch
# baseline (bench_cudnn.py) and Haste built and timed beside them (bench/haste_device.sh), each
# phase under its own time limit, logs under $OUT. Run from the project root (or a staged copy) after
# `source .device/device-env.sh`, with QGRU_NO_INSTALL=1 and QGRU_BUILD_DIR set:
#   bash tests/gpu/device_check.sh [phases] [bench options...]
# phases: comma-separated, in the order given: build,cgru,specs,memcheck,luasanitize,racecheck,
# sweep,bench,cudnn,haste,mainjob (default: all but luasanitize, sweep and mainjob). A phase may repeat
# (specs,specs: the specs twice, logs specs1.log, specs2.log). The recipes run through luajit with
# lua/ on LUA_PATH (./qgru would build). luasanitize: QGRU_SANITIZE_DEADLINE (default 300 s) bounds
# it; the per-test logs go to a tarball, $OUT/sanitize.tgz. mainjob: the README's main job
# (recipes/qat.lua) on the GPU; the data from QGRU_FASHION_MNIST or the Debian package's folder.
# haste: only when QGRU_HASTE_SRC names a Haste source tree (carried, e.g. .stage/haste-src; see
# bench/haste_device.sh's header), else it says it is skipped; builds libhaste.a and
# bench/haste_bench.cu there and times Haste (fp32 / tf32 / its shipped fp16 tensor-op math,
# HASTE_REPS, default 20) into $OUT/haste.log.
set -uo pipefail
OUT=${OUT:-/tmp/qgru-out}
mkdir -p "$OUT"
B=${QGRU_BUILD_DIR:-$PWD/build}
phases=${1:-build,cgru,specs,memcheck,racecheck,bench,cudnn,haste}
shift || true
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
export QGRU_ROOT=$PWD QGRU_LIB=$B/libqgru.so
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;${LUA_PATH:-;}"
nspecs=0
BUSTED=/tmp/deps/usr/bin/busted
[ -f "$BUSTED" ] || BUSTED=$(command -v busted)
SAN=/usr/local/cuda/bin/compute-sanitizer
CUDNN=${CUDNN_BENCH:-}
for c in .device/bench_cudnn.py ../../.device/bench_cudnn.py /work/shared/tools/bench_cudnn.py; do
  [ -z "$CUDNN" ] && [ -f "$c" ] && CUDNN=$c
done

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/device.log" 2>&1
run_phase() {
  case "$1" in
  build)
    if ! ./qgru build > "$OUT/build.log" 2>&1; then
      cat .cmake-build.log >> "$OUT/build.log" 2>/dev/null
      tail -40 "$OUT/build.log"; stamp "build failed"; exit 1
    fi
    grep -ci warning .cmake-build.log | sed 's/^/build warnings: /' ;;
  cgru)
    timeout 60 "$B/test_cuda_gru" > "$OUT/cgru.log" 2>&1
    echo "cgru rc=$?"; tail -3 "$OUT/cgru.log"; grep FAIL "$OUT/cgru.log" | head
    timeout 60 "$B/test_exact_split" > "$OUT/exact_split.log" 2>&1
    echo "exact_split rc=$?"; tail -1 "$OUT/exact_split.log"; grep FAIL "$OUT/exact_split.log" | head
    timeout 60 "$B/test_igemm" > "$OUT/igemm.log" 2>&1
    echo "igemm rc=$?"; tail -1 "$OUT/igemm.log"; grep FAIL "$OUT/igemm.log" | head ;;
  specs)
    nspecs=$((nspecs + 1))
    timeout 150 luajit "$BUSTED" --run=unit -o plainTerminal -t gpu tests/lua > "$OUT/specs$nspecs.log" 2>&1
    echo "specs rc=$?"
    grep -E "successes|^Failure|^Error" -A4 "$OUT/specs$nspecs.log" | cut -c1-300 | head -80 ;;
  memcheck)
    timeout 120 "$SAN" --tool memcheck --print-limit 20 "$B/test_cuda_gru" > "$OUT/sanitize.log" 2>&1
    echo "memcheck rc=$?"
    timeout 60 "$SAN" --tool memcheck --print-limit 20 "$B/test_exact_split" >> "$OUT/sanitize.log" 2>&1
    echo "memcheck exact_split rc=$?"
    timeout 60 "$SAN" --tool memcheck --print-limit 20 "$B/test_igemm" >> "$OUT/sanitize.log" 2>&1
    echo "memcheck igemm rc=$?"
    grep -E "ERROR SUMMARY|failure|FAIL|Invalid" "$OUT/sanitize.log" | head -20 ;;
  luasanitize)
    QGRU_SANITIZE_DIR=/tmp/qgru-sanitize QGRU_SANITIZE_DEADLINE=${QGRU_SANITIZE_DEADLINE:-300} \
      bash tests/sanitize_gpu.sh > "$OUT/luasanitize.log" 2>&1
    echo "lua sanitize rc=$?"; grep -E "^\[(memcheck|racecheck|initcheck|synccheck)\]" "$OUT/luasanitize.log" | cut -c1-300
    tar -czf "$OUT/sanitize.tgz" -C /tmp qgru-sanitize 2>/dev/null ;;
  mainjob)
    timeout 240 luajit recipes/qat.lua --device cuda > "$OUT/mainjob.log" 2>&1
    echo "mainjob rc=$?"; grep -iE "accuracy|float|ptq|qat" "$OUT/mainjob.log" | tail -8 | cut -c1-200 ;;
  racecheck)
    timeout 120 "$SAN" --tool racecheck --print-limit 20 "$B/test_cuda_gru" quick >> "$OUT/sanitize.log" 2>&1
    echo "racecheck rc=$?"
    timeout 60 "$SAN" --tool racecheck --print-limit 20 "$B/test_exact_split" >> "$OUT/sanitize.log" 2>&1
    echo "racecheck exact_split rc=$?"
    timeout 60 "$SAN" --tool racecheck --print-limit 20 "$B/test_igemm" >> "$OUT/sanitize.log" 2>&1
    echo "racecheck igemm rc=$?"
    grep -E "RACECHECK SUMMARY|failure|FAIL" "$OUT/sanitize.log" | tail -6 ;;
  sweep)
    timeout 150 luajit recipes/bench.lua --name sweep --sweep --repeats 5 --warmup 1 > "$OUT/sweep.log" 2>&1
    echo "sweep rc=$?"; grep -E "auto fwd|best" "$OUT/sweep.log" | cut -c1-260 ;;
  bench)
    timeout 240 luajit recipes/bench.lua --name gpu "${BENCH_ARGS[@]}" > "$OUT/bench.log" 2>&1
    echo "bench rc=$?"
    grep -A60 "^GPU, one GRU" "$OUT/bench.log" | head -70 ;;
  cudnn)
    PYTHONUNBUFFERED=1 timeout 150 python3 "$CUDNN" ${CUDNN_REPS:-20} > "$OUT/cudnn.log" 2>&1
    echo "cudnn ($CUDNN) rc=$?"
    grep -A40 "^anchor" "$OUT/cudnn.log" | head -45 ;;
  haste)
    if [ -n "${QGRU_HASTE_SRC:-}" ]; then
      timeout 150 bash bench/haste_device.sh "$QGRU_HASTE_SRC" "${HASTE_REPS:-20}" > /dev/null 2>&1
      echo "haste ($QGRU_HASTE_SRC) rc=$?"
      grep -E "^haste|^selftest|^libhaste|rror|failed" "$OUT/haste.log" | cut -c1-220
    else
      echo "haste: skipped (QGRU_HASTE_SRC is not set: no Haste source tree to build)"
    fi ;;
  *) echo "unknown phase $1" ;;
  esac
}
BENCH_ARGS=("$@")
IFS=',' read -ra PH <<< "$phases"
for p in "${PH[@]}"; do
  stamp "$p"
  run_phase "$p"
done
stamp done
