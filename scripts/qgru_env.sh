# scripts/qgru_env.sh: sourced by the sweep launchers (sweep_local.sh, sweep_slurm.sh and the
# Slurm batch scripts). It sets what ./qgru sets for a recipe (QGRU_ROOT, QGRU_LIB, LUA_PATH) so
# that many shards run luajit directly on one finished build, instead of each shard starting its
# own (concurrent) build through ./qgru.
#   QGRU_HOME   the repository (default: the folder above this file)
#   QGRU_LIB    the library to use; when unset, qgru_build builds it with ./qgru build
qgru_home="${QGRU_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"

# Builds libqgru once (unless QGRU_LIB names an existing library) and exports the environment.
qgru_build() {
  if [ -z "${QGRU_LIB:-}" ] || [ ! -f "$QGRU_LIB" ]; then
    "$qgru_home/qgru" build >&2 || return 1
    QGRU_LIB="${QGRU_BUILD_DIR:-$qgru_home/build}/libqgru.so"
  fi
  qgru_export
}

# Exports the environment of a recipe (no build).
qgru_export() {
  export QGRU_HOME="$qgru_home"
  export QGRU_ROOT="$qgru_home"
  export QGRU_LIB="${QGRU_LIB:-${QGRU_BUILD_DIR:-$qgru_home/build}/libqgru.so}"
  export LUA_PATH="$qgru_home/lua/?.lua;$qgru_home/lua/?/init.lua;;"
}

# Runs recipes/sweep.lua with the given arguments.
qgru_sweep() {
  luajit "$qgru_home/recipes/sweep.lua" "$@"
}

# Fails when the sweep options already name a shard or a merge (the launchers add those).
qgru_check_args() {
  local a
  for a in "$@"; do
    case "$a" in
      --shard|--shard=*|--merge|--merge=*|--plan|--plan=*)
        echo "qgru: $a is set by the launcher: give only the sweep's options" >&2; return 2 ;;
    esac
  done
}
