set -o pipefail
export QGRU_NO_INSTALL=1 QGRU_ROOT=$PWD QGRU_LIB=$PWD/build/libqgru.so
export LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;$LUA_PATH"
NCU=/usr/local/cuda/bin/ncu; [ -x $NCU ] || NCU=ncu
CS=/usr/local/cuda/bin/compute-sanitizer
(nvidia-smi -L; date) > $OUT/kws_bwd2_d2_kws.log
S=$SECONDS
timeout 30 luajit bench/kws_bwd.lua 20 >> $OUT/kws_bwd2_d2_kws.log 2>&1; echo "[kws $((SECONDS-S)) s]" >> $OUT/kws_bwd2_d2_kws.log
timeout 40 luajit /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu tests/lua/cuda_int_gru_spec.lua tests/lua/cuda_qat_spec.lua tests/lua/cuda_gru_spec.lua > $OUT/specs_full.txt 2>&1; tail -60 $OUT/specs_full.txt > $OUT/kws_bwd2_d2_specs.log; rm -f $OUT/specs_full.txt
echo "[specs $((SECONDS-S)) s]" >> $OUT/kws_bwd2_d2_kws.log
timeout 30 luajit recipes/bench.lua --name kws2 --repeats 20 --paths false --shapes long-kws,seed-qat > $OUT/kws_bwd2_d2_bench.log 2>&1; cp runs/kws2/bench.md $OUT/bench.md
echo "[bench $((SECONDS-S)) s]" >> $OUT/kws_bwd2_d2_kws.log
timeout 30 $NCU --clock-control none -k regex:bwd_ws --launch-count 1 --section SpeedOfLight --section LaunchStats --section WarpStateStats --section InstructionStats --section SchedulerStats luajit bench/qat_parts.lua 1 0 1000 16 40 64 strict int8 > $OUT/kws_bwd2_d2_ncu.log 2>&1
echo "[ncu $((SECONDS-S)) s]" >> $OUT/kws_bwd2_d2_kws.log
for seed in 53 54; do
  timeout 25 $CS --tool racecheck --print-limit 20 luajit -joff /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu --filter "seed $seed:" tests/lua/cuda_int_gru_spec.lua 2>&1 | tail -6 >> $OUT/kws_bwd2_d2_sanitize.log
  timeout 25 $CS --tool memcheck --print-limit 20 luajit -joff /tmp/deps/usr/bin/busted --run=unit -o plainTerminal -t gpu --filter "seed $seed:" tests/lua/cuda_int_gru_spec.lua 2>&1 | tail -6 >> $OUT/kws_bwd2_d2_sanitize.log
done
echo "[all $((SECONDS-S)) s]" >> $OUT/kws_bwd2_d2_kws.log
