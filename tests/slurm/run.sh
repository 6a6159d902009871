#!/usr/bin/env bash
# tests/slurm/run.sh: integration test of the sweep on a real Slurm. It installs slurm-wlm and
# munge (Debian packages) when they are missing, starts a private single-node cluster (munged on
# its own socket, slurmctld and slurmd with a slurm.conf in a temporary folder: localhost,
# proctrack/linuxproc, task/none, select/cons_tres, no accounting, random ports), submits a tiny
# grid sweep with scripts/sweep_slurm.sh as a job array (3 tasks) plus its merge job, waits,
# and compares the merged result files with an unsharded run of the same sweep, byte for byte.
# The local launcher (scripts/sweep_local.sh, 2 CPU processes) is checked the same way.
# Every daemon it started is stopped on exit (by pid file), and the folder is removed.
#
# Skips (exit 77, which ctest reports as skipped) with the reason when it cannot run: not asked
# to (QGRU_SLURM_TEST=1 asks; .ci/run sets it), no root and no passwordless sudo, packages that
# cannot be installed, daemons that do not start.
#   QGRU_SLURM_TEST=1 tests/slurm/run.sh          # or: cd build && QGRU_SLURM_TEST=1 ctest -R slurm
# QGRU_SLURM_KEEP=1 keeps the temporary folder (logs, runs) for a look after a failure.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SKIP=77
skip() { echo "SKIPPED: tests/slurm/run.sh: $*"; exit $SKIP; }
fail() { echo "FAILED: tests/slurm/run.sh: $*" >&2; exit 1; }
say() { echo "slurm test: $*"; }

[ "${QGRU_SLURM_TEST:-0}" = "1" ] || skip "set QGRU_SLURM_TEST=1 to run it (.ci/run does): it installs slurm-wlm and munge and starts daemons"
[ "$(uname -s)" = "Linux" ] || skip "needs Linux"
sudo=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; else skip "needs root or passwordless sudo (to install packages and run the daemons)"; fi
fi

# ---- packages -----------------------------------------------------------------------------
need_install=0
for b in slurmctld slurmd sbatch squeue sinfo munged mungekey; do command -v "$b" >/dev/null 2>&1 || need_install=1; done
[ -x /usr/sbin/slurmctld ] || need_install=1
if [ "$need_install" = 1 ]; then
  command -v apt-get >/dev/null 2>&1 || skip "slurm-wlm and munge are missing and there is no apt-get"
  say "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null 2>&1 || true
  $sudo apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || skip "apt-get could not install slurm-wlm and munge"
fi
PATH="$PATH:/usr/sbin:/sbin"
for b in slurmctld slurmd sbatch squeue sinfo scancel munged mungekey munge unmunge; do
  command -v "$b" >/dev/null 2>&1 || skip "$b is missing after the installation"
done
id munge >/dev/null 2>&1 || skip "the munge user does not exist"

# ---- a private cluster ----------------------------------------------------------------------
tmp=$(mktemp -d /tmp/qgru-slurm.XXXXXX) || fail "mktemp"
chmod 755 "$tmp"
cleanup() {
  local rc=$?
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$SLURM_CONF" ]; then
    scancel --quiet --user="$(id -un)" >/dev/null 2>&1 || true
  fi
  for p in "$tmp/slurmd.pid" "$tmp/slurmctld.pid" "$tmp/munge/munged.pid"; do
    if [ -f "$p" ]; then
      pid=$(cat "$p" 2>/dev/null)
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        $sudo kill "$pid" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && $sudo kill -9 "$pid" 2>/dev/null
      fi
    fi
  done
  if [ "${QGRU_SLURM_KEEP:-0}" = "1" ]; then echo "slurm test: kept $tmp"; else $sudo rm -rf "$tmp"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# munged as the munge user, on its own socket, key, pid, log and seed files
m="$tmp/munge"
mkdir -p "$m" && chmod 711 "$m"
$sudo mungekey --create --keyfile="$m/munge.key" >/dev/null 2>&1 || skip "mungekey could not create a key"
$sudo chown -R munge:munge "$m" && $sudo chmod 400 "$m/munge.key"
$sudo chmod 711 "$m"
runas_munge() {
  if command -v runuser >/dev/null 2>&1; then $sudo runuser -u munge -- "$@"; else $sudo su -s /bin/sh munge -c "$(printf '%q ' "$@")"; fi
}
runas_munge munged --socket="$m/munge.socket" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
  --log-file="$m/munged.log" --seed-file="$m/munged.seed" --num-threads=2 \
  || { cat "$m/munged.log" 2>/dev/null; skip "munged did not start"; }
for _ in $(seq 1 50); do [ -S "$m/munge.socket" ] && break; sleep 0.1; done
munge -S "$m/munge.socket" -n 2>/dev/null | unmunge -S "$m/munge.socket" >/dev/null 2>&1 || skip "munge credentials do not round-trip"

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 - 1024}' /proc/meminfo)
[ "$mem" -lt 512 ] && mem=512
port=$(( 20000 + RANDOM % 20000 ))
mkdir -p "$tmp/state" "$tmp/spool"
export SLURM_CONF="$tmp/slurm.conf"
cat > "$SLURM_CONF" <<CONF
ClusterName=qgrutest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$m/munge.socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
$sudo env SLURM_CONF="$SLURM_CONF" slurmctld -f "$SLURM_CONF" || { tail -n 20 "$tmp/slurmctld.log" 2>/dev/null; skip "slurmctld did not start"; }
$sudo env SLURM_CONF="$SLURM_CONF" slurmd -f "$SLURM_CONF" || { tail -n 20 "$tmp/slurmd.log" 2>/dev/null; skip "slurmd did not start"; }
state=""
for _ in $(seq 1 150); do
  state=$(sinfo -h -o '%T' 2>/dev/null | head -n 1)
  [ "$state" = "idle" ] && break
  sleep 0.2
done
if [ "$state" != "idle" ]; then
  tail -n 20 "$tmp/slurmctld.log" "$tmp/slurmd.log" 2>/dev/null
  skip "the node did not become idle (state '$state')"
fi
say "cluster up: $host, $cpus CPUs, port $port"

# ---- the sweep ------------------------------------------------------------------------------
. "$root/scripts/qgru_env.sh"
qgru_build >/dev/null || fail "build"
work="$tmp/work"
mkdir -p "$work" && cd "$work" || fail "cd $work"
export OPENBLAS_NUM_THREADS=1
luajit "$root/recipes/train_float.lua" --name float --hidden 8 --epochs 3 --lr 0.01 --train_limit 3000 --threads 1 > train.log 2>&1 \
  || { cat train.log; fail "training the tiny float model"; }
opts=(--weights runs/float/model.safetensors --w_bits 3,8 --a_bits 6,8 --train_limit 1000 --test_limit 200
      --calib_batches 1 --calib_batch_size 128 --method minmax --passes 1)
qgru_sweep "${opts[@]}" --name ref --threads 1 > ref.log 2>&1 || { cat ref.log; fail "the unsharded sweep"; }

say "submitting the array"
"$root/scripts/sweep_slurm.sh" -n 3 --wait 240 -- "${opts[@]}" --name arr > submit.log 2>&1 || {
  cat submit.log; tail -n 30 "$tmp/slurmctld.log" "$tmp/slurmd.log"; fail "the Slurm job array"; }
cat submit.log
ntask=$(ls runs/arr/slurm-*_*.out 2>/dev/null | wc -l)
[ "$ntask" -eq 3 ] || fail "expected 3 array task logs in runs/arr, found $ntask"
for i in 1 2 3; do
  grep -q "shard $i/3 on " runs/arr/slurm-*_$((i - 1)).out || fail "array task $((i - 1)) did not run shard $i/3"
  [ -s "runs/arr/shard-$i-of-3/points.jsonl" ] || fail "shard $i/3 wrote no points"
done
for f in results.jsonl results.csv results.md accuracy_vs_bits.svg; do
  cmp "runs/ref/$f" "runs/arr/$f" || fail "runs/arr/$f (Slurm array, merged) differs from the unsharded runs/ref/$f"
done
say "the merged Slurm array equals the unsharded run (results.jsonl, results.csv, results.md, accuracy_vs_bits.svg)"

"$root/scripts/sweep_local.sh" -n 2 -- "${opts[@]}" --name loc > local.log 2>&1 || { cat local.log; fail "scripts/sweep_local.sh"; }
for f in results.jsonl results.csv results.md accuracy_vs_bits.svg; do
  cmp "runs/ref/$f" "runs/loc/$f" || fail "runs/loc/$f (local launcher, 2 shards) differs from runs/ref/$f"
done
say "the local launcher (2 processes) equals the unsharded run"
cat runs/arr/results.md
echo "PASSED: tests/slurm/run.sh"
