#!/usr/bin/env bash
# Recovery from a lost process (commgrid launch --spares, train_gpt --spares) side by side
# with restarting the whole job, at W ranks (tp 2, dp W/2), and the cost of --spares when
# nothing fails. Usage: bench/resilience.sh BUILD_DIR W [REPEATS]   (docs/benchmarks.md)
set -euo pipefail
build=${1:?build dir}; w=${2:?world size}; reps=${3:-3}
cli=$build/tools/commgrid; gpt=$build/examples/train_gpt/commgrid-train-gpt
export COMMGRID_TIMEOUT=60
now() { date +%s.%N; }
run() {  # prints the wall seconds of: commgrid launch ARGS
  local t0 t1; t0=$(now)
  "$cli" launch "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  t1=$(now); echo "$t1 - $t0" | bc -l
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
steps=8
printf "W=%d (tp 2, dp %d), %d steps, %d repeats\n" "$w" $((w / 2)) "$steps" "$reps"
for r in $(seq "$reps"); do
  base=$(run -n "$w" -- "$gpt" --tp 2 --steps "$steps")
  one=$(run -n "$w" -- "$gpt" --tp 2 --steps 1)
  two=$(run -n "$w" -- "$gpt" --tp 2 --steps 2)
  spares=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1)
  failed=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1 --fault-kill 1:4)
  # Recovery as the processes measured it: the slowest one's agreement + groups + model +
  # state, and its parts.
  parts=$(grep -o 'agreement [0-9.]* s, groups [0-9.]* s, model [0-9.]* s, state [0-9.]* s' "$tmp/err" |
        awk '{ t = $2 + $5 + $8 + $11; if (t > m) { m = t; p = sprintf("agreement %.3f, groups %.3f, model %.3f, state %.3f", $2, $5, $8, $11) } } END { print p }')
  rec=$(grep -o 'agreement [0-9.]* s, groups [0-9.]* s, model [0-9.]* s, state [0-9.]* s' "$tmp/err" |
        awk '{ t = $2 + $5 + $8 + $11; if (t > m) m = t } END { printf "%.3f", m }')
  # A restart of the whole job costs at least its start-up (launch, world, groups, model):
  # a 1-step run minus one step. (Reading a checkpoint of this model from disk is not
  # counted, nor the steps lost since the last checkpoint.)
  restart=$(echo "2 * $one - $two" | bc -l)
  printf "run %d: no spares %.2f s | --spares, no failure %.2f s (x%.3f) | a failure at step 4 %.2f s (+%.2f s); recovery %s s vs whole-job restart >= %.2f s (x%.1f)\n" \
    "$r" "$base" "$spares" "$(echo "$spares / $base" | bc -l)" "$failed" "$(echo "$failed - $spares" | bc -l)" \
    "$rec" "$restart" "$(echo "$restart / $rec" | bc -l)"
  echo "       recovery by part (slowest process): $parts"
done
