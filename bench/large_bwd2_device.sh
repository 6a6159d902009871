#!/bin/bash
# bench/large_bwd2_device.sh CALL: one device call of branch gpu-large-bwd2 (run from the root of
# the checkout the device receives, the branch staged as .stage/gpu-large-bwd2 with its build).
# Logs to $OUT as large_bwd2_*.log. Experiment knobs of the calls' builds (removed after call 2;
# the knobs no longer exist, so the variant lines repeat the default):
# QGRU_BWD_SLICES forces the per-step GEMM's K slices (0: cuBLAS's own split-K into the direct
# part), QGRU_BWD_STEP_MB=6 the step kernel's 40-register build (call 2; default 8: 32 registers).
source .device/device-env.sh
R=$PWD; N=$R/.stage/gpu-large-bwd2
export QGRU_NO_INSTALL=1
export LUA_PATH="$N/lua/?.lua;$N/lua/?/init.lua;$LUA_PATH"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/large_bwd2_env.log
cd $N; export QGRU_ROOT=$N QGRU_LIB=$N/build/libqgru.so
T0=$(date +%s)
timeout 50 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua tests/lua/cuda_qat_spec.lua \
  tests/lua/cuda_ops_spec.lua > $OUT/large_bwd2_specs.log 2>&1; echo "rc $? after $(( $(date +%s) - T0 )) s" >> $OUT/large_bwd2_specs.log
P=$OUT/large_bwd2_parts.log
timeout 30 luajit bench/qat_parts.lua 20 3 > $P 2>&1
if [ "$1" = 1 ]; then
  for k in 0 4 6; do echo "QGRU_BWD_SLICES=$k" >> $P; QGRU_BWD_SLICES=$k timeout 12 luajit bench/qat_parts.lua 20 3 100 256 512 1024 tf32 int8 2>&1 | tail -1 >> $P; done
  timeout 25 ncu --clock-control none --metrics gpu__time_duration.sum --csv luajit bench/qat_parts.lua 1 0 100 256 512 1024 tf32 int8 \
    > $OUT/large_bwd2_ncu_tf32.log 2>&1
  timeout 25 ncu --clock-control none -k regex:bwd_step --launch-skip 150 --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    luajit bench/qat_parts.lua 1 1 100 256 512 1024 tf32 int8 > $OUT/large_bwd2_ncu_step.log 2>&1
else
  echo "QGRU_BWD_STEP_MB=6" >> $P; QGRU_BWD_STEP_MB=6 timeout 12 luajit bench/qat_parts.lua 20 3 100 256 512 1024 tf32 int8 2>&1 | tail -1 >> $P
  timeout 60 luajit recipes/bench.lua --name lbwd2 --repeats 20 --paths false --shapes large,medium > $OUT/large_bwd2_bench.log 2>&1
  cp runs/lbwd2/bench.md $OUT/large_bwd2_bench.md 2>/dev/null
  timeout 25 ncu --clock-control none --metrics gpu__time_duration.sum --csv luajit bench/qat_parts.lua 1 0 100 256 512 1024 tf32 int8 \
    > $OUT/large_bwd2_ncu_tf32.log 2>&1
  timeout 20 ncu --clock-control none -k regex:bwd_step --launch-skip 150 --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats luajit bench/qat_parts.lua 1 1 100 256 512 1024 tf32 int8 > $OUT/large_bwd2_ncu_step.log 2>&1
fi
cd $OUT; tail -3 large_bwd2_specs.log; cat large_bwd2_parts.log
[ -f large_bwd2_ncu_tf32.log ] && grep '"gpu__time_duration.sum"' large_bwd2_ncu_tf32.log | awk -F'","' '{v=$NF; gsub(/[",]/,"",v); n[$5]++; s[$5]+=v} END {for (k in n) printf "%s x%d %.1f us avg\n", substr(k,1,60), n[k], s[k]/n[k]/1000}' | sort
grep -E "Registers Per|Achieved Occupancy|Theoretical Occupancy|Duration|DRAM Throughput|Memory Throughput|Block Limit|Warp Cycles Per Issued|^ +Dram|L2 Hit" large_bwd2_ncu_step.log 2>/dev/null | head -30
tail -8 large_bwd2_bench.md 2>/dev/null
