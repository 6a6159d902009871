#!/bin/bash
# (device command 3 of branch gpu-large-fwd2, staged per DEVICE.md under .stage/gpu-large-fwd2 with main's library as build/libqgru_base.so; logs: bench/gpu_runs/large_fwd2_call3.log)
# device call 3 of gpu-large-fwd2
source .device/device-env.sh
cd .stage/gpu-large-fwd2
export QGRU_NO_INSTALL=1 QGRU_ROOT=$PWD LUA_PATH="lua/?.lua;lua/?/init.lua;$LUA_PATH"
B=$PWD/build
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/bench.log
for r in 1 2; do
  for lib in libqgru_base.so libqgru.so; do
    echo "== $lib (round $r)" >> $OUT/bench.log
    QGRU_LIB=$B/$lib timeout 20 luajit bench/int_gru_large.lua 20 3 100 256 512 1024 grid >> $OUT/bench.log 2>&1
  done
done
export QGRU_LIB=$B/libqgru.so
timeout 45 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua tests/lua/cuda_qat_spec.lua > $OUT/specs_full.txt 2>&1
tail -40 $OUT/specs_full.txt > $OUT/specs.log; rm -f $OUT/specs_full.txt
for lib in libqgru_base.so libqgru.so; do
  echo "== $lib" >> $OUT/recipe.log
  QGRU_LIB=$B/$lib timeout 40 luajit recipes/bench.lua --name b_$lib --device cuda --shapes large,medium --repeats 20 --paths false > /dev/null 2>> $OUT/recipe.log
  cat runs/b_$lib/bench.md >> $OUT/recipe.log 2>/dev/null
done
QGRU_LIB=$B/libqgru.so timeout 20 ncu --clock-control none --metrics gpu__time_duration.sum -k regex:"x_quant|gemm|tc_grid|planes|cell32|quantize_w|sm90" luajit bench/int_gru_large.lua 1 0 100 256 512 1024 grid infer 2>&1 | grep -E "^  [a-zA-Z_]|gpu__time_duration" | grep -v "gemmSN\|sm80_" > $OUT/ncu.log
for c in "5 33 37 1030" "3 65 64 1030"; do
  QGRU_LIB=$B/libqgru.so timeout 18 /usr/local/cuda/bin/compute-sanitizer --tool memcheck luajit bench/int_gru_large.lua 1 0 $c grid 2>&1 | tail -4 >> $OUT/memcheck.log
done
echo done >> $OUT/memcheck.log
