#!/usr/bin/env bash
# tests/gpu/device_check.sh: one call on the GPU machine for the CUDA float GRU: build, the #gpu
# specs, compute-sanitizer (memcheck on the #sanitize subset, racecheck on the #race subset), the
# GPU benchmark (recipes/bench.lua) and the cuDNN / PyTorch baseline (bench_cudnn.py), each phase
# under its own time limit, logs under $OUT. Run from the project root (or a staged copy) after
# `source .device/device-env.sh`, with QGRU_NO_INSTALL=1 and QGRU_BUILD_DIR set:
#   bash tests/gpu/device_check.sh [phases] [bench options...]
# phases: comma-separated subset of build,specs,memcheck,racecheck,bench,cudnn (default: all).
set -uo pipefail
OUT=${OUT:-/tmp/qgru-out}
mkdir -p "$OUT"
B=${QGRU_BUILD_DIR:-$PWD/build}
phases=${1:-build,specs,memcheck,racecheck,bench,cudnn}
shift || true
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
has() { [[ ",$phases," == *",$1,"* ]]; }
export QGRU_ROOT=$PWD QGRU_LIB=$B/libqgru.so
BUSTED=/tmp/deps/usr/bin/busted
[ -f "$BUSTED" ] || BUSTED=$(command -v busted)
SAN=/usr/local/cuda/bin/compute-sanitizer
CUDNN=${CUDNN_BENCH:-}
for c in .device/bench_cudnn.py ../../.device/bench_cudnn.py /work/shared/tools/bench_cudnn.py; do
  [ -z "$CUDNN" ] && [ -f "$c" ] && CUDNN=$c
done

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/device.log" 2>&1
if has build; then
  stamp build
  if ! ./qgru build > "$OUT/build.log" 2>&1; then
    cat .cmake-build.log >> "$OUT/build.log" 2>/dev/null
    tail -40 "$OUT/build.log"; stamp "build failed"; exit 1
  fi
  grep -ci warning .cmake-build.log | sed 's/^/build warnings: /'
fi
if has specs; then
  stamp specs
  timeout 150 luajit "$BUSTED" --run=unit -o plainTerminal -t gpu tests/lua > "$OUT/specs.log" 2>&1
  echo "specs rc=$?"
  grep -E "successes|^Failure|^Error" -A4 "$OUT/specs.log" | cut -c1-300 | head -80
fi
if has memcheck; then
  stamp memcheck
  timeout 100 "$SAN" --tool memcheck --print-limit 20 luajit "$BUSTED" --run=unit -o plainTerminal -t sanitize \
    tests/lua/cuda_gru_spec.lua > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"
  grep -E "ERROR SUMMARY|successes|^Failure|^Error|Invalid|Race" "$OUT/memcheck.log" | head -20
fi
if has racecheck; then
  stamp racecheck
  timeout 100 "$SAN" --tool racecheck --print-limit 20 luajit "$BUSTED" --run=unit -o plainTerminal -t race \
    tests/lua/cuda_gru_spec.lua > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|successes|^Failure|^Error|hazard" "$OUT/racecheck.log" | head -20
fi
if has bench; then
  stamp bench
  timeout 150 ./qgru recipes/bench.lua --name gpu "$@" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  grep -A60 "^GPU, one GRU" "$OUT/bench.log" | head -70
fi
if has cudnn; then
  stamp "cudnn ($CUDNN)"
  PYTHONUNBUFFERED=1 timeout 150 python3 "$CUDNN" ${CUDNN_REPS:-20} > "$OUT/cudnn.log" 2>&1
  echo "cudnn rc=$?"
  grep -A40 "^anchor" "$OUT/cudnn.log" | head -45
fi
stamp done
