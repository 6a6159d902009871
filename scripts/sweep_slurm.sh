#!/usr/bin/env bash
# scripts/sweep_slurm.sh: submits a sweep (recipes/sweep.lua) to Slurm as a job array, one shard
# per array task (scripts/slurm/sweep_shard.sbatch), and a merge job that runs once every task
# has succeeded (scripts/slurm/sweep_merge.sbatch, --dependency=afterok). Results land in
# runs/<name>/ (shards in runs/<name>/shard-<i>-of-<N>/, task logs in runs/<name>/slurm-*.out).
#   scripts/sweep_slurm.sh [-n N] [-c CPUS] [--gpus auto|0|1] [-p PARTITION] [-t TIME]
#                          [--wait SECONDS] [--sbatch "EXTRA ARGS"] [--] SWEEP_OPTIONS...
#   scripts/sweep_slurm.sh -n 8 -- --mode sensitivity --name sens
# N: shards (default 4; never more than points). CPUS: cores per task (default 1; passed as
# --threads). --gpus: one GPU per task (--gres=gpu:1) when 1, or with auto (the default) when the
# cluster reports GPUs (sinfo %G). --wait: block until the merge job ends (at most SECONDS) and
# fail unless the merged results exist. The repository must be on a file system the nodes share;
# it is built once here before submitting. --mode mixed is sequential: submit it as one job.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/qgru_env.sh"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
n=4; cpus=1; gpus=auto; partition=""; timelimit=""; wait_s=""; extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="${2:-}"; shift 2 ;;
    -c) cpus="${2:-}"; shift 2 ;;
    --gpus) gpus="${2:-}"; shift 2 ;;
    -p) partition="${2:-}"; shift 2 ;;
    -t) timelimit="${2:-}"; shift 2 ;;
    --wait) wait_s="${2:-}"; shift 2 ;;
    --sbatch) extra="${2:-}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "qgru: -n expects a positive integer, got '$n'" >&2; exit 2; }
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || { echo "qgru: -c expects a positive integer, got '$cpus'" >&2; exit 2; }
case "$gpus" in auto|0|1) ;; *) echo "qgru: --gpus expects auto, 0 or 1, got '$gpus'" >&2; exit 2 ;; esac
[ -z "$wait_s" ] || [[ "$wait_s" =~ ^[1-9][0-9]*$ ]] || { echo "qgru: --wait expects seconds, got '$wait_s'" >&2; exit 2; }
command -v sbatch >/dev/null 2>&1 || { echo "qgru: sbatch not found (is this a Slurm login node?)" >&2; exit 2; }
qgru_check_args "$@" || exit 2
qgru_build || exit 1

plan=$(qgru_sweep "$@" --plan) || exit $?
dir=${plan%%$'\t'*}
points=${plan##*$'\t'}
if [ "$points" -eq 0 ]; then
  echo "qgru: --mode mixed is a sequential search: submit it as one job, e.g. sbatch --wrap '$qgru_home/qgru $qgru_home/recipes/sweep.lua ...'" >&2
  exit 2
fi
[ "$n" -gt "$points" ] && n=$points
if [ "$gpus" = auto ]; then
  if sinfo -h -o '%G' 2>/dev/null | grep -q 'gpu'; then gpus=1; else gpus=0; fi
fi
mkdir -p "$dir"
common=(--parsable --chdir="$PWD" --cpus-per-task="$cpus" --export="ALL,QGRU_HOME=$qgru_home,QGRU_LIB=$QGRU_LIB,QGRU_SWEEP_SHARDS=$n")
[ -n "$partition" ] && common+=(--partition="$partition")
[ -n "$timelimit" ] && common+=(--time="$timelimit")
gres=(); [ "$gpus" = 1 ] && gres=(--gres=gpu:1)
# shellcheck disable=SC2206
extra_args=($extra)
array=$(sbatch "${common[@]}" "${gres[@]}" "${extra_args[@]}" --array="0-$((n - 1))" --output="$dir/slurm-%A_%a.out" \
        "$qgru_home/scripts/slurm/sweep_shard.sbatch" "$@") || { echo "qgru: sbatch of the array failed" >&2; exit 1; }
array=${array%%;*}
merge=$(sbatch "${common[@]}" "${extra_args[@]}" --dependency="afterok:$array" --kill-on-invalid-dep=yes --output="$dir/slurm-merge-%j.out" \
        "$qgru_home/scripts/slurm/sweep_merge.sbatch" "$dir" "$n") || { echo "qgru: sbatch of the merge job failed" >&2; exit 1; }
merge=${merge%%;*}
echo "qgru: submitted $points points as job array $array ($n tasks$([ "$gpus" = 1 ] && echo ", one GPU each")) and merge job $merge: results in $dir"
[ -z "$wait_s" ] && exit 0

deadline=$(( $(date +%s) + wait_s ))
while squeue -h -j "$array,$merge" 2>/dev/null | grep -q .; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "qgru: jobs $array and $merge still queued or running after $wait_s s" >&2
    exit 1
  fi
  sleep 1
done
if [ ! -f "$dir/results.md" ]; then
  echo "qgru: the merge did not produce $dir/results.md; task logs:" >&2
  for f in "$dir"/slurm-*.out; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
fi
echo "qgru: merged: $dir/results.md"
