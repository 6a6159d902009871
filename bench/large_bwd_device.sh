#!/bin/bash
# bench/large_bwd_device.sh CALL: one device call of branch gpu-large-bwd (run from the root of the
# checkout the device receives; the branch staged as .stage/gpu-large-bwd, main's build as
# .stage/gpu-large-bwd-base, each with build/libqgru.so.gz). Logs to $OUT.
source .device/device-env.sh
R=$PWD; N=$R/.stage/gpu-large-bwd; B=$R/.stage/gpu-large-bwd-base
for d in $N $B; do [ -f $d/build/libqgru.so.gz ] && gunzip -f $d/build/libqgru.so.gz; done
export QGRU_NO_INSTALL=1
export LUA_PATH="lua/?.lua;lua/?/init.lua;$LUA_PATH"   # recipes/bench.lua requires qgru (call 2 ran without it)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/large_bwd_env.log
cd $N; export QGRU_ROOT=$N QGRU_LIB=$N/build/libqgru.so
T0=$(date +%s)
timeout 70 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua tests/lua/cuda_qat_spec.lua \
  tests/lua/cuda_ops_spec.lua > $OUT/large_bwd_specs.log 2>&1; echo "rc $? after $(( $(date +%s) - T0 )) s" >> $OUT/large_bwd_specs.log
if [ "$1" = 1 ]; then
  timeout 30 luajit bench/qat_parts.lua 20 3 > $OUT/large_bwd_parts.log 2>&1
  (cd $B && QGRU_ROOT=$B QGRU_LIB=$B/build/libqgru.so timeout 30 luajit $N/bench/qat_parts.lua 20 3 > $OUT/large_bwd_parts_base.log 2>&1)
  timeout 35 ncu --clock-control none --metrics gpu__time_duration.sum --csv luajit bench/qat_parts.lua 1 0 100 256 512 1024 tf32 int8 \
    > $OUT/large_bwd_ncu_tf32.log 2>&1
  (cd $B && QGRU_ROOT=$B QGRU_LIB=$B/build/libqgru.so timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    luajit $N/bench/qat_parts.lua 1 0 100 256 512 1024 tf32 int8 > $OUT/large_bwd_ncu_tf32_base.log 2>&1)
else
  timeout 30 luajit bench/qat_parts.lua 20 3 > $OUT/large_bwd_parts.log 2>&1
  timeout 60 luajit recipes/bench.lua --name lbwd --repeats 20 --paths false --shapes large,medium > $OUT/large_bwd_bench.log 2>&1
  cp runs/lbwd/bench.md $OUT/large_bwd_bench.md 2>/dev/null
  timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv luajit bench/qat_parts.lua 1 0 100 256 512 1024 tf32 int8 \
    > $OUT/large_bwd_ncu_tf32_after.log 2>&1
fi
cd $OUT; tail -4 large_bwd_specs.log; cat large_bwd_parts*.log
for f in large_bwd_ncu_tf32*.log; do [ -f $f ] && echo "$f: $(grep -c '"gpu__time_duration.sum"' $f) kernels"; done
cat large_bwd_bench.md 2>/dev/null | tail -8
