#!/usr/bin/env bash
# scripts/sweep_local.sh: runs a sweep (recipes/sweep.lua) as parallel shards on this machine and
# merges them: one shard per visible GPU (each process sees one: CUDA_VISIBLE_DEVICES), or N
# processes on the CPU with the cores split between them. Shards run with --resume, so running
# the same command again after an interruption continues it.
#   scripts/sweep_local.sh [-n N] [--] SWEEP_OPTIONS...
#   scripts/sweep_local.sh --mode sensitivity --name sens          # one shard per GPU, else per core
#   scripts/sweep_local.sh -n 4 -- --mode grid --w_bits 4,8        # 4 CPU processes
# N: the number of shards (default: the visible GPUs; without GPUs, the CPU cores). Never more
# shards than points. --mode mixed is a sequential search: it runs as one process.
# Each shard's output goes to runs/<name>/shard-<i>-of-<N>.out; the merged results to runs/<name>/.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/qgru_env.sh"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
n=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) [ $# -ge 2 ] || { usage >&2; exit 2; }; n="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
if [ -n "$n" ] && ! [[ "$n" =~ ^[1-9][0-9]*$ ]]; then echo "qgru: -n expects a positive integer, got '$n'" >&2; exit 2; fi
qgru_check_args "$@" || exit 2
qgru_build || exit 1

# The visible GPUs: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists.
gpus=()
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  IFS=',' read -r -a gpus <<< "${CUDA_VISIBLE_DEVICES}"
  if [ "${#gpus[@]}" -eq 1 ] && { [ "${gpus[0]}" = "" ] || [ "${gpus[0]}" = "-1" ] || [ "${gpus[0]}" = "NoDevFiles" ]; }; then gpus=(); fi
elif command -v nvidia-smi >/dev/null 2>&1; then
  count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  for ((g = 0; g < count; g++)); do gpus+=("$g"); done
fi
cores=$(nproc 2>/dev/null || echo 1)

# The run folder and the number of points (this also checks the options).
plan=$(qgru_sweep "$@" --plan) || exit $?
dir=${plan%%$'\t'*}
points=${plan##*$'\t'}
if [ -z "$n" ]; then
  if [ "${#gpus[@]}" -gt 0 ]; then n=${#gpus[@]}; else n=$cores; fi
fi
if [ "$points" -eq 0 ]; then n=1; fi             # mixed: one sequential process
if [ "$points" -gt 0 ] && [ "$n" -gt "$points" ]; then n=$points; fi

if [ "$n" -eq 1 ]; then
  echo "qgru: one process: $dir" >&2
  qgru_sweep "$@" --resume
  exit $?
fi

threads=$(( cores / n )); [ "$threads" -lt 1 ] && threads=1
mkdir -p "$dir"
echo "qgru: $points points in $n shards ($([ "${#gpus[@]}" -gt 0 ] && echo "one GPU each" || echo "$threads CPU thread(s) each")): $dir" >&2
pids=()
for ((i = 1; i <= n; i++)); do
  out="$dir/shard-$i-of-$n.out"
  if [ "${#gpus[@]}" -gt 0 ]; then
    CUDA_VISIBLE_DEVICES="${gpus[$(( (i - 1) % ${#gpus[@]} ))]}" qgru_sweep "$@" --shard "$i/$n" --resume > "$out" 2>&1 &
  else
    qgru_sweep "$@" --shard "$i/$n" --resume --threads "$threads" > "$out" 2>&1 &
  fi
  pids+=($!)
done
failed=0
for ((i = 1; i <= n; i++)); do
  if wait "${pids[$((i - 1))]}"; then
    echo "qgru: shard $i/$n finished" >&2
  else
    echo "qgru: shard $i/$n failed; the end of $dir/shard-$i-of-$n.out:" >&2
    tail -n 15 "$dir/shard-$i-of-$n.out" >&2
    failed=1
  fi
done
if [ "$failed" -ne 0 ]; then echo "qgru: some shards failed: fix the cause and run the same command again (finished points are kept)" >&2; exit 1; fi
shards=()
for ((i = 1; i <= n; i++)); do shards+=("$dir/shard-$i-of-$n"); done
qgru_sweep --merge "${shards[@]}" --force
