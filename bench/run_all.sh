#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md and leaves one JSON file per run in OUT.
# Usage: bench/run_all.sh BUILD_DIR OUT_DIR [--with-64]
# Open MPI needs --oversubscribe to start more ranks than cores (and --allow-run-as-root
# as root); set MPIRUN to change the launcher line.
set -euo pipefail
build=${1:?build dir}; out=${2:?output dir}; with64=${3:-}
cg=$build/tools/commgrid
mpirun=${MPIRUN:-mpirun --oversubscribe $( [ "$(id -u)" = 0 ] && echo --allow-run-as-root )}
mkdir -p "$out"
run() { local name=$1; shift; echo "+ $*" >&2; "$@" > "$out/$name.json"; }

run layout_warm "$cg" bench layout --format json
run layout_cold "$cg" bench layout --memory cold --query-worlds none --repeats 3 --format json
for n in 4 8 16; do
  run init_mpi_$n $mpirun -np $n "$cg" bench init --tp 2 --pp 2 --repeats 3 --format json
  run init_gloo_$n "$cg" bench init --backend gloo --local $n --tp 2 --pp 2 --repeats 3 --format json
done
if [ "$with64" = --with-64 ]; then
  run init_mpi_64 $mpirun -np 64 "$cg" bench init --tp 2 --pp 2 --repeats 1 --format json
fi
for n in 2 4; do
  run coll_mpi_$n $mpirun -np $n "$cg" bench collectives --format json
  run coll_mpi_nb_$n $mpirun -np $n "$cg" bench collectives --direct nonblocking --format json
  run coll_gloo_$n "$cg" bench collectives --backend gloo --local $n --format json
done
