# bench/kws_fwd2_device.sh: one device command of branch gpu-kws-fwd2 (the integer forward at
# long-kws, the small-H kernel's two-role variant). Run from the staged tree with $OUT set and
# RUN (d1, d2, ...) naming the logs; build/libqgru_base.so: main's library for the same-run
# "before". Specs, the layer forward (bench/int_gru_small.lua quick), recipes/bench.lua with both
# libraries, racecheck + memcheck on two two-role spec cases.
set -o pipefail
export QGRU_NO_INSTALL=1 QGRU_ROOT=$PWD QGRU_LIB=$PWD/build/libqgru.so
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$LUA_PATH"
CS=/usr/local/cuda/bin/compute-sanitizer
L=$OUT/kws_fwd2_${RUN}_kws.log
(nvidia-smi -L; date) > $L
S=$SECONDS
timeout 45 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua tests/lua/cuda_qat_spec.lua > $OUT/specs_full.txt 2>&1
tail -40 $OUT/specs_full.txt > $OUT/kws_fwd2_${RUN}_specs.log; rm -f $OUT/specs_full.txt
echo "[specs $((SECONDS-S)) s]" >> $L
for sh in long-kws seed-qat; do
  echo "== base $sh" >> $L; QGRU_LIB=$PWD/build/libqgru_base.so timeout 15 luajit bench/int_gru_small.lua 20 $sh quick >> $L 2>&1
  echo "== branch $sh" >> $L; timeout 15 luajit bench/int_gru_small.lua 20 $sh quick >> $L 2>&1
done
echo "[layer $((SECONDS-S)) s]" >> $L
QGRU_LIB=$PWD/build/libqgru_base.so timeout 30 luajit recipes/bench.lua --name fwd2base --repeats 20 --paths false --shapes long-kws,seed-qat > $OUT/kws_fwd2_${RUN}_bench_base.log 2>&1
echo "[bench base $((SECONDS-S)) s]" >> $L
timeout 30 luajit recipes/bench.lua --name fwd2 --repeats 20 --paths false --shapes long-kws,seed-qat > $OUT/kws_fwd2_${RUN}_bench.log 2>&1
echo "[bench $((SECONDS-S)) s]" >> $L
for seed in 80 85; do
  timeout 20 $CS --tool racecheck --print-limit 20 luajit -joff /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu --filter "seed $seed:" tests/lua/cuda_int_gru_spec.lua 2>&1 | tail -5 >> $OUT/kws_fwd2_${RUN}_sanitize.log
done
timeout 15 $CS --tool memcheck --print-limit 20 luajit -joff /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu --filter "seed 86:" tests/lua/cuda_int_gru_spec.lua 2>&1 | tail -5 >> $OUT/kws_fwd2_${RUN}_sanitize.log
echo "[all $((SECONDS-S)) s]" >> $L
# ncu (NCU=1): per-kernel times of one auto inference forward at long-kws (clocks not locked),
# then the two-role kernel with the full set
if [ -n "$NCU" ]; then
  N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
  timeout 40 $N --clock-control none --launch-count 12 --section SpeedOfLight luajit bench/int_gru_small.lua 1 long-kws auto > $OUT/ncu_all.txt 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|==PROF==|Error" $OUT/ncu_all.txt > $OUT/kws_fwd2_${RUN}_ncu_kernels.log; rm -f $OUT/ncu_all.txt
  timeout 40 $N --set full -k regex:ws_kernel --launch-count 1 luajit bench/int_gru_small.lua 1 long-kws auto > $OUT/kws_fwd2_${RUN}_ncu_ws.log 2>&1
  echo "[ncu $((SECONDS-S)) s]" >> $L
fi
# RACE=1: racecheck with the hazards printed (first lines), two-role case 80 and the one-role
# kernel's case 61 (same shape, storage 2) as a control; per-kernel times of the long-kws layer
# forward after the calibration's launches
if [ -n "$RACE" ]; then
  for seed in 80 61; do
    echo "== racecheck seed $seed" >> $OUT/kws_fwd2_${RUN}_race.log
    timeout 25 $CS --tool racecheck --print-limit 4 luajit -joff /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu --filter "seed $seed:" tests/lua/cuda_int_gru_spec.lua 2>&1 | grep -v "^=========     at \|^=========         \|^\s*$" | head -40 >> $OUT/kws_fwd2_${RUN}_race.log
  done
  N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
  timeout 40 $N --clock-control none --launch-skip 12 --launch-count 16 --section SpeedOfLight luajit bench/int_gru_small.lua 1 long-kws auto > $OUT/ncu_all.txt 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|Error" $OUT/ncu_all.txt > $OUT/kws_fwd2_${RUN}_ncu_kernels.log; rm -f $OUT/ncu_all.txt
  echo "[race+ncu $((SECONDS-S)) s]" >> $L
fi
