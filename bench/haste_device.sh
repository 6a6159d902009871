#!/usr/bin/env bash
# bench/haste_device.sh: Haste (lmnt-com/haste) measured on the GPU machine beside qgru, in the same
# device command (issue 7 compares with Haste; the developers' guide asks for same-run peers).
# Nothing of Haste is committed: the lead stages its source (a `git archive` of the fetched
# repository) under the git-ignored .stage/ and carries it. This script copies that source to
# /tmp, builds libhaste.a there with Haste's own Makefile (target `haste`; its GPU_ARCH_FLAGS
# name compute_37/60/70, which CUDA 13 no longer accepts, so they are overridden with sm_90 on the
# make command line; the rule is one sequential recipe, so -j16 changes nothing), builds our
# driver bench/haste_bench.cu against it, checks the driver's float64 reference (selftest), and
# runs the driver: 5 shapes x fp32 / tf32 / shipped (Haste's own CUBLAS_TENSOR_OP_MATH) x
# train / infer, median of REPS (default 20) after WARMUP (default 5). Writes $OUT/haste.log;
# exit status 0 only if the build, the selftest and every check passed.
# Usage, on the device, from the project root (or a staged copy of it):
#   bash bench/haste_device.sh <haste-source-dir> [reps] [warmup]
# The lead's command (staged tree .stage/<name>, Haste under .stage/haste-src, carried):
#   carry [".device", ".stage/<name>", ".stage/haste-src"]
#   source .device/device-env.sh && cd .stage/<name> && bash bench/haste_device.sh ../haste-src 20
# Staging Haste, on the dev machine (G: the git dir the `fetch` tool returned for
# github:lmnt-com/haste, /work/.mirror/lmnt-com+haste/repo; the commit goes into HASTE_COMMIT):
#   D=/work/main/.stage/haste-src; rm -rf $D && mkdir -p $D
#   git --git-dir=$G archive HEAD | tar -x -C $D && git --git-dir=$G rev-parse HEAD > $D/HASTE_COMMIT
set -uo pipefail
SRC=${1:?usage: bash bench/haste_device.sh <haste-source-dir> [reps] [warmup]}
REPS=${2:-20}
WARM=${3:-5}
OUT=${OUT:-/tmp/haste-out}
mkdir -p "$OUT"
LOG=$OUT/haste.log
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=nvcc
B=/tmp/haste-build
if [ ! -f "$SRC/lib/haste/gru.h" ] || [ ! -f "$SRC/Makefile" ]; then
  echo "haste_device: $SRC is not a Haste source tree (no lib/haste/gru.h or Makefile)" | tee "$LOG"
  exit 2
fi
{
  echo "# bench/haste_device.sh $(date -u +%FT%TZ), source $SRC, commit $(cat "$SRC/HASTE_COMMIT" 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
  "$NVCC" --version | tail -1
} > "$LOG"
rm -rf "$B" && cp -r "$SRC" "$B" || exit 2
S=$SECONDS
if ! (cd "$B" && make -j16 haste NVCC="$NVCC" \
        GPU_ARCH_FLAGS="-gencode arch=compute_90,code=sm_90") > "$OUT/haste_build.tmp" 2>&1; then
  tail -40 "$OUT/haste_build.tmp" | tee -a "$LOG"
  echo "haste_device: libhaste.a build failed" | tee -a "$LOG"
  exit 1
fi
echo "libhaste.a (Haste's Makefile, target haste, sm_90): $((SECONDS - S)) s," \
  "$(grep -ci warning "$OUT/haste_build.tmp") warning lines" | tee -a "$LOG"
rm -f "$OUT/haste_build.tmp"
S=$SECONDS
if ! "$NVCC" -O3 -std=c++17 -arch=sm_90 -I"$B/lib" bench/haste_bench.cu "$B/libhaste.a" \
       -lcublas -Xlinker --wrap=cublasSetMathMode -o "$B/haste_bench" >> "$LOG" 2>&1; then
  echo "haste_device: bench/haste_bench.cu build failed" | tee -a "$LOG"
  exit 1
fi
echo "bench/haste_bench.cu: $((SECONDS - S)) s" | tee -a "$LOG"
"$B/haste_bench" selftest 2>&1 | tee -a "$LOG"
st=${PIPESTATUS[0]}
S=$SECONDS
timeout 120 "$B/haste_bench" "$REPS" "$WARM" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "haste_bench rc=$rc selftest rc=$st ($((SECONDS - S)) s)" | tee -a "$LOG"
[ "$rc" = 0 ] && [ "$st" = 0 ]
