#!/usr/bin/env bash
# The long fault campaign. Runs the fault tests over and over until the time is up, each round
# with a new seed (which shuffles the faults' order and seeds the KV clients), every fault held
# longer than in CI, and writes a table of operations, faults injected and anomalies found:
#
#   tests/blackbox/faults_netns.rs  nodes in network namespaces: the leader isolated, a follower
#                                   isolated, the leader muted one way, a bridge, SIGSTOP, 10%
#                                   packet loss, 30-70 ms random delays (reordering), a slow
#                                   link, kill -9; checkers for the log, the consumer
#                                   group, KV linearizability, dead letters and the lake
#   tests/blackbox/faults_disk.rs   a follower's and the leader's disk filled to the last byte
#   tests/blackbox/faults_clock.rs  a leader's clock ahead, inside and past the skew bound
#   adapters/raft/src/sim           the deterministic simulation of the replicated log, over
#                                   SIM_SEEDS new seeds (about 0.45 s each), before the runs
#
# Usage (as root, like the tests):  bench/faults.sh [MINUTES=60] [HOLD_SECONDS=10] [ROUNDS=2] [SIM_SEEDS=500]
# Output: target/faults-campaign/<time>/table.md and one log per run beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-60}
hold=${2:-10}
rounds=${3:-2}
sim_seeds=${4:-500}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="target/faults-campaign/$stamp"
mkdir -p "$out"
table="$out/table.md"

echo "== building the fault tests"
cargo test -q -p queen --test faults_netns --test faults_disk --test faults_clock --no-run

# A figure of a run's log: the number before $2 on the first line matching $1 (field), or the
# number after the word $1 on the checker's summary line (after).
field() { grep -m1 -E "$1" "$3" | grep -oE "[0-9]+ $2" | head -1 | grep -oE "^[0-9]+" || echo "?"; }
after() { grep -m1 -E "^acknowledged " "$2" | grep -oE "$1 [0-9]+" | grep -oE "[0-9]+" || echo "?"; }

{
  echo "# Fault campaign $stamp: ${minutes} min, faults held ${hold} s, ${rounds} rounds of the list per run"
  echo
  echo "| run | seed | result | faults | writes acked | lost | doubled | reordered | unexpected | group deliveries | inside a valid lease | KV ops | not linearizable | dead letters | their anomalies | lake | longest wait for a write (s) | disk | clock | seconds |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$table"
cat "$table"

deadline=$(( $(date +%s) + minutes * 60 ))
run=0
failed=0

# The simulation first, from a first seed that differs per campaign (its line names it).
sim_first=$(( (RANDOM << 15 | RANDOM) + 1000 ))
sim_log="$out/simulation.log"
echo "== simulation: $sim_seeds seeds from $sim_first"
sim=pass
QUEEN_RAFT_SIM_FIRST=$sim_first QUEEN_RAFT_SIM_SEEDS=$sim_seeds \
  timeout 3600 cargo test -q -p queen-raft --lib sim::tests::every -- --nocapture > "$sim_log" 2>&1 || sim=FAIL
[ "$sim" = pass ] || failed=$((failed + 1))
sim_line="Simulation ($sim, seeds $sim_first to $(( sim_first + sim_seeds - 1 ))): $(grep -m1 -oE '^all seeds .*' "$sim_log" || grep -m1 -E 'replay:' "$sim_log" || echo '?')"
echo "$sim_line"
while [ "$(date +%s)" -lt "$deadline" ] && [ "$run" -lt 500 ]; do
  run=$((run + 1))
  seed=$(( (RANDOM << 15 | RANDOM) + 1 ))
  log="$out/run-$run-netns.log"
  started=$(date +%s)
  result=pass
  QUEEN_FAULTS_SEED=$seed QUEEN_FAULTS_HOLD_S=$hold QUEEN_FAULTS_ROUNDS=$rounds QUEEN_FAULTS_KEEP=1 \
    timeout 1800 cargo test -q -p queen --test faults_netns -- --nocapture > "$log" 2>&1 || result=FAIL
  # The nodes' directories (data, logs, lake) are kept for a failed run, or one where writes
  # waited longer than 10 s (an outage to explain).
  wait=$(grep -oE "longest wait between acknowledgements [0-9.]+" "$log" | grep -oE "[0-9.]+$" | sort -n | tail -1 || true)
  kept=$(grep -m1 -oE "keeping the nodes' directories in .*" "$log" | sed 's/.* in //' || true)
  if [ -n "$kept" ] && [ -d "$kept" ]; then
    if [ "$result" = pass ] && awk -v w="${wait:-0}" 'BEGIN { exit !(w <= 10) }'; then
      rm -rf "$kept"
    else
      mv "$kept" "$out/run-$run-dirs"
    fi
  fi
  grep -q "SKIPPED" "$log" && result=skipped
  # Every run also fills disks and skews a clock (both take seconds).
  disk=pass; clock=pass
  timeout 600 cargo test -q -p queen --test faults_disk -- --nocapture > "$out/run-$run-disk.log" 2>&1 || disk=FAIL
  timeout 600 cargo test -q -p queen --test faults_clock -- --nocapture > "$out/run-$run-clock.log" 2>&1 || clock=FAIL
  grep -q "SKIPPED" "$out/run-$run-disk.log" && disk=skipped
  grep -q "SKIPPED" "$out/run-$run-clock.log" && clock=skipped
  [ "$result$disk$clock" = "passpasspass" ] || failed=$((failed + 1))
  faults=$(grep -cE "^[. ]*[0-9.]+ s  under " "$log" || true)
  acked=$(grep -m1 -oE "^acknowledged [0-9]+" "$log" | grep -oE "[0-9]+" || echo "?")
  lake=$(grep -q "^lake: verify clean" "$log" && echo clean || echo "?")
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' \
    "$run" "$seed" "$result" "$faults" "$acked" \
    "$(after lost "$log")" "$(after doubled "$log")" "$(after reordered "$log")" \
    "$(after unexpected "$log")" \
    "$(field '^group ' 'deliveries' "$log")" \
    "$(field '^group ' 'inside a valid lease' "$log")" \
    "$(field '^KV: ' 'operations answered' "$log")" \
    "$(field '^KV: ' 'not linearizable' "$log")" \
    "$(field '^dead letters: ' 'dead-lettered' "$log")" "$(field '^dead letters: ' 'anomalies' "$log")" \
    "$lake" "${wait:-?}" "$disk" "$clock" "$(( $(date +%s) - started ))" | tee -a "$table"
done
{ echo; echo "$sim_line"; } >> "$table"
echo
echo "$sim_line"
echo "$run runs, $failed with a failure; table: $table"
[ "$failed" -eq 0 ]
