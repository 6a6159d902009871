#!/bin/bash
# Device command of branch gpu-grid2 (staged per DEVICE.md under .stage/gpu-grid2 with main's
# library as build/libqgru_base.so): the GPU specs, bench/int_gru_large.lua grid infer/train for
# base and branch (two rounds), recipes/bench.lua large+medium (branch, base), ncu of the kernels.
# Logs under $OUT (bench/gpu_runs/grid2_*.log).
source .device/device-env.sh
cd .stage/gpu-grid2
export QGRU_NO_INSTALL=1 QGRU_ROOT=$PWD LUA_PATH="lua/?.lua;lua/?/init.lua;$LUA_PATH"
B=$PWD/build
LIBS=${LIBS:-"libqgru_base.so libqgru.so"}
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/bench.log
export QGRU_LIB=$B/libqgru.so
timeout 50 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua tests/lua/cuda_qat_spec.lua > $OUT/specs_full.txt 2>&1
tail -30 $OUT/specs_full.txt > $OUT/specs.log; rm -f $OUT/specs_full.txt
for lib in $LIBS; do
  echo "== $lib (round 1)" >> $OUT/bench.log
  QGRU_LIB=$B/$lib timeout 15 luajit bench/int_gru_large.lua 20 3 100 256 512 1024 grid >> $OUT/bench.log 2>&1
done
for lib in ${RLIBS:-libqgru.so libqgru_base.so}; do
  echo "== $lib" >> $OUT/recipe.log
  QGRU_LIB=$B/$lib timeout 30 luajit recipes/bench.lua --name b_$lib --device cuda --shapes large,medium --repeats 20 --paths false > /dev/null 2>> $OUT/recipe.log
  cat runs/b_$lib/bench.md >> $OUT/recipe.log 2>/dev/null
done
for lib in libqgru_base.so libqgru.so; do
  echo "== $lib (round 2)" >> $OUT/bench.log
  QGRU_LIB=$B/$lib timeout 15 luajit bench/int_gru_large.lua 20 3 100 256 512 1024 grid >> $OUT/bench.log 2>&1
done
QGRU_LIB=$B/libqgru.so timeout 20 ncu --clock-control none --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active -k regex:"tc_grid|sm90" luajit bench/int_gru_large.lua 1 0 100 256 512 1024 grid infer 2>&1 | grep -E "^  [a-zA-Z_]|gpu__time|inst_exec|issue_active" > $OUT/ncu.log
echo done >> $OUT/ncu.log
