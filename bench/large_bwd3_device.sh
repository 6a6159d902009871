#!/bin/bash
# bench/large_bwd3_device.sh CALL: one device call of branch gpu-large-bwd3 (run from the root of
# the checkout the device receives, the branch staged as .stage/gpu-large-bwd3 with its build and
# main's library as build/libqgru_base.so). Logs to $OUT as large_bwd3_*.log. Experiment knobs of
# the calls' builds (removed after call 2; the knobs no longer exist, so those lines repeat the
# default): QGRU_BWD_PDL=0 launched bwd_step1_kernel without PDL (call 1; PDL was dropped after
# it), QGRU_BWD_STEP1_MB=6 its 40-register build (default 8: 32 registers).
source .device/device-env.sh
R=$PWD; S=$R/.stage/gpu-large-bwd3
export QGRU_NO_INSTALL=1
export LUA_PATH="$S/lua/?.lua;$S/lua/?/init.lua;$LUA_PATH"
cd $S; export QGRU_ROOT=$S
NEW=$S/build/libqgru.so; BASE=$S/build/libqgru_base.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $OUT/large_bwd3_env.log
T0=$(date +%s)
QGRU_LIB=$NEW timeout 45 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua \
  tests/lua/cuda_qat_spec.lua > $OUT/large_bwd3_specs.log 2>&1; echo "rc $? after $(( $(date +%s) - T0 )) s" >> $OUT/large_bwd3_specs.log
P=$OUT/large_bwd3_parts.log
q() { echo "== $1 $2 ${3:-}" >> $P; env $3 QGRU_LIB=$1 timeout 14 luajit bench/qat_parts.lua 20 3 $2 int8 2>&1 | tail -n +3 >> $P; }
if [ "$1" = 1 ]; then
  for L in $BASE $NEW; do q $L "100 256 512 1024 tf32,strict"; done
  q $NEW "100 256 512 1024 tf32" QGRU_BWD_PDL=0
  q $NEW "100 256 512 1024 tf32" QGRU_BWD_STEP1_MB=6
  q $BASE "100 256 512 1024 tf32"
  q $NEW "100 256 512 1024 tf32"
  for L in $BASE $NEW; do q $L "100 64 256 512 tf32"; done
  QGRU_LIB=$NEW timeout 25 ncu --clock-control none -k regex:bwd_step --launch-skip 150 --launch-count 1 --set full \
    luajit bench/qat_parts.lua 1 1 100 256 512 1024 tf32 int8 > $OUT/large_bwd3_ncu_step.log 2>&1
else
  for L in $BASE $NEW; do q $L "100 256 512 1024 tf32,strict"; done
  q $NEW "100 256 512 1024 tf32" QGRU_BWD_STEP1_MB=6
  for L in $BASE $NEW; do q $L "100 256 512 1024 tf32"; done
  q $NEW "100 256 512 1024 tf32" QGRU_BWD_STEP1_MB=6
  for L in $BASE $NEW; do q $L "100 64 256 512 tf32"; done
  for L in $BASE $NEW; do
    QGRU_LIB=$L timeout 40 luajit recipes/bench.lua --device cuda --name lbwd3 --repeats 20 --paths false --shapes large,medium \
      > $OUT/large_bwd3_bench_$(basename $L .so).log 2>&1
    cat runs/lbwd3/bench.md >> $OUT/large_bwd3_bench_$(basename $L .so).log 2>/dev/null
  done
  QGRU_LIB=$NEW timeout 20 ncu --clock-control none -k regex:bwd_step --launch-skip 150 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section InstructionStats --section Occupancy luajit bench/qat_parts.lua 1 1 100 256 512 1024 tf32 int8 \
    > $OUT/large_bwd3_ncu_step.log 2>&1
fi
cd $OUT; tail -n 3 large_bwd3_specs.log; cat large_bwd3_parts.log
grep -E "Registers Per|Achieved Occupancy|Duration|DRAM Throughput|Memory Throughput|Warp Cycles Per Issued|Issue Slots|L1TEX Hit|L2 Hit|Executed Ipc|Local" large_bwd3_ncu_step.log 2>/dev/null | head -30
for f in large_bwd3_bench_*.log; do [ -f $f ] && tail -n 6 $f; done
