# bench/shape_sweep_device.sh: recipes/bench.lua and cuDNN (bench/cudnn_shapes.py, bench_cudnn.py's
# method) on user-like shapes beyond the five, in one device command, then the table
# (bench/shape_sweep_table.py). Run from the project root on the GPU machine after
# `source .device/device-env.sh`, with QGRU_LIB (or QGRU_BUILD_DIR) naming the library:
#   bash bench/shape_sweep_device.sh [SHAPES] [--loop]
# Logs and the table go to $OUT (default /tmp/out).
set -u
OUT=${OUT:-/tmp/out}
SHAPES=${1:-100x1x40x128,100x8x40x64,100x32x40x64,100x128x40x64,100x256x40x64,100x32x40x128,100x128x40x128,100x256x40x128,100x32x40x256,100x128x40x256,100x256x80x256,100x512x40x256,100x1024x40x128,50x512x64x128,200x64x80x384,200x64x80x512,100x128x256x768,100x16x64x1024,30x256x128x512,100x64x40x96,100x64x40x200,500x64x8x32,1000x1x16x64,1000x64x40x64}
LOOP=${2:-}
TOOL=
for c in .device/bench_cudnn.py /work/shared/tools/bench_cudnn.py; do [ -f "$c" ] && TOOL=$c && break; done
export QGRU_ROOT=$PWD LUA_PATH="$PWD/lua/?.lua;$PWD/lua/?/init.lua;${LUA_PATH:-;}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader > "$OUT/sweep_device.log"; uptime >> "$OUT/sweep_device.log"
timeout 300 luajit recipes/bench.lua --name shapes --shapes "$SHAPES" --repeats 20 --paths false > "$OUT/sweep_qgru.log" 2>&1
echo "qgru rc=$?"
cp runs/shapes/bench.json "$OUT/sweep_qgru.json" 2>/dev/null
timeout 260 python3 bench/cudnn_shapes.py --tool "$TOOL" --shapes "$SHAPES" --reps 20 $LOOP > "$OUT/sweep_cudnn.log" 2>&1
echo "cudnn rc=$?"
python3 bench/shape_sweep_table.py "$OUT/sweep_qgru.json" "$OUT/sweep_cudnn.log" "$OUT/sweep_device.log" > "$OUT/sweep_table.md"
cat "$OUT/sweep_table.md"
