#!/usr/bin/env bash
# Recovery from a lost process (commgrid launch --spares, train_gpt --spares) side by side
# with restarting the whole job, at W ranks (tp 2, dp W/2): state from a replica, from buddy
# copies, and a shrink without spares; and the cost of --spares when nothing fails. Usage: bench/resilience.sh BUILD_DIR W [REPEATS]   (docs/benchmarks.md)
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
# Recovery as the processes measured it (stderr of a run): the slowest process's agreement
# + groups + model + state, and its parts.
recovery_lines() { grep -o 'agreement [0-9.]* s, groups [0-9.]* s, model [0-9.]* s, state [0-9.]* s' "$1"; }
slowest() { recovery_lines "$1" | awk '{ t = $2 + $5 + $8 + $11; if (t > m) m = t } END { printf "%.3f", m }'; }
parts() {
  recovery_lines "$1" | awk '{ t = $2 + $5 + $8 + $11; if (t > m) { m = t; p = sprintf("agreement %.3f, groups %.3f, model %.3f, state %.3f", $2, $5, $8, $11) } } END { print p }'
}
steps=8
printf "W=%d (tp 2, dp %d), %d steps, %d repeats\n" "$w" $((w / 2)) "$steps" "$reps"
for r in $(seq "$reps"); do
  base=$(run -n "$w" -- "$gpt" --tp 2 --steps "$steps")
  one=$(run -n "$w" -- "$gpt" --tp 2 --steps 1)
  two=$(run -n "$w" -- "$gpt" --tp 2 --steps 2)
  spares=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1)
  failed=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1 --fault-kill 1:4)
  cp "$tmp/err" "$tmp/err.failed"
  # Buddy copies (every rank ships its snapshot each step, K = 1) and a shrink (no spare:
  # dp W/2 -> W/4, the kept replicas take twice the micro-batches).
  buddy=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1 --state-from buddy)
  buddy_failed=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1 --state-from buddy --fault-kill 1:4)
  cp "$tmp/err" "$tmp/err.buddy"
  shrunk=$(run -n "$w" --spares 0 -- "$gpt" --tp 2 --steps "$steps" --spares 0 --snapshot-every 1 --fault-kill 1:4)
  cp "$tmp/err" "$tmp/err.shrink"
  # Kept connections (--keep-connections): the same failure; and the start-up of a job that
  # keeps its connections (every two processes connected once, the groups views over them).
  kept_failed=$(run -n $((w + 1)) --spares 1 -- "$gpt" --tp 2 --steps "$steps" --spares 1 --snapshot-every 1 --keep-connections --fault-kill 1:4)
  cp "$tmp/err" "$tmp/err.kept"
  kept_one=$(run -n "$w" --spares 0 -- "$gpt" --tp 2 --steps 1 --spares 0 --keep-connections)
  kept_two=$(run -n "$w" --spares 0 -- "$gpt" --tp 2 --steps 2 --spares 0 --keep-connections)
  kept_restart=$(echo "2 * $kept_one - $kept_two" | bc -l)
  # A restart of the whole job costs at least its start-up (launch, world, groups, model):
  # a 1-step run minus one step. (Reading a checkpoint of this model from disk is not
  # counted, nor the steps lost since the last checkpoint.)
  restart=$(echo "2 * $one - $two" | bc -l)
  printf "run %d: no spares %.2f s | --spares, no failure %.2f s (x%.3f); with buddy copies %.2f s (x%.3f) | a failure at step 4 %.2f s (+%.2f s); recovery %s s vs whole-job restart >= %.2f s (x%.1f)\n" \
    "$r" "$base" "$spares" "$(echo "$spares / $base" | bc -l)" "$buddy" "$(echo "$buddy / $base" | bc -l)" \
    "$failed" "$(echo "$failed - $spares" | bc -l)" "$(slowest "$tmp/err.failed")" "$restart" \
    "$(echo "$restart / $(slowest "$tmp/err.failed")" | bc -l)"
  echo "       recovery by part (slowest process): $(parts "$tmp/err.failed")"
  echo "       buddy copies: recovery $(slowest "$tmp/err.buddy") s ($(parts "$tmp/err.buddy")); run $(printf %.2f "$buddy_failed") s"
  echo "       shrink (no spare): recovery $(slowest "$tmp/err.shrink") s ($(parts "$tmp/err.shrink")); run $(printf %.2f "$shrunk") s"
  echo "       kept connections: recovery $(slowest "$tmp/err.kept") s ($(parts "$tmp/err.kept")); run $(printf %.2f "$kept_failed") s; vs whole-job restart >= $(printf %.2f "$restart") s (x$(printf %.1f "$(echo "$restart / $(slowest "$tmp/err.kept")" | bc -l)")), a kept-connections job's start-up >= $(printf %.2f "$kept_restart") s (x$(printf %.1f "$(echo "$kept_restart / $(slowest "$tmp/err.kept")" | bc -l)"))"
done
