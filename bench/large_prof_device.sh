#!/bin/bash
# bench/large_prof_device.sh: one device call that measures where the large QAT train step's time
# goes (T100 N256 C512 H1024, int8, tf32): bench/step_gemm_lt.cu (the backward's float GEMMs
# against cuBLASLt's heuristic algorithms) and an nsys kernel summary of bench/qat_parts.lua
# (forward + backward, 3 repeats after 2). Run from the checkout root with main's tree and build
# staged as .stage/final (build/libqgru.so.xz). Logs to $OUT/prof_*.log.
source .device/device-env.sh
R=$PWD; S=$R/.stage/final
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/prof_env.log
uptime >> $OUT/prof_env.log
nvcc -O3 -std=c++17 -arch=sm_90 bench/step_gemm_lt.cu -lcublasLt -lcublas -o /tmp/step_gemm_lt && \
  timeout 150 /tmp/step_gemm_lt > $OUT/prof_gemm.log 2>&1
cd $S
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('build/libqgru.so.xz'),open('build/libqgru.so','wb'))"
export QGRU_NO_INSTALL=1 QGRU_ROOT=$S QGRU_LIB=$S/build/libqgru.so
export LUA_PATH="$S/lua/?.lua;$S/lua/?/init.lua;$LUA_PATH"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: $NSYS" >> $OUT/prof_env.log
timeout 30 luajit bench/qat_parts.lua 20 3 100 256 512 1024 tf32 int8 > $OUT/prof_parts.log 2>&1
if [ -n "$NSYS" ]; then
  timeout 120 $NSYS profile -o /tmp/qp --force-overwrite true luajit bench/qat_parts.lua 3 2 100 256 512 1024 tf32 int8 \
    > /tmp/nsys_run.log 2>&1
  $NSYS stats --report cuda_gpu_kern_sum --format csv /tmp/qp.nsys-rep > $OUT/prof_kern.log 2>&1
  $NSYS stats --report cuda_gpu_trace --format csv /tmp/qp.nsys-rep 2>/dev/null | tail -n 2000 > /tmp/trace.csv
  tail -5 /tmp/nsys_run.log >> $OUT/prof_env.log
  gzip -c /tmp/trace.csv > $OUT/prof_trace.csv.gz
else
  timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    luajit bench/qat_parts.lua 1 1 100 256 512 1024 tf32 int8 > $OUT/prof_ncu.log 2>&1
fi
