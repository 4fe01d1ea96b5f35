#!/usr/bin/env bash
# One device call, in the project's root: setup.sh (the first time), wait for both servers,
# bench.sh until BUDGET_S is nearly spent, then pack results and logs into $OUT/gpu.tgz. Run it
# again on the same machine to resume where it stopped. Its siblings are found beside it.
T0=$(date +%s); BUDGET_S=${BUDGET_S:-560}; S=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/logs /tmp/results
elapsed() { echo "t=$(( $(date +%s) - T0 )) s: $1"; }
. "$S/pack.sh"
trap 'elapsed packing; pack' EXIT
if [ ! -f /tmp/started ]; then
  bash "$S/setup.sh" 2>&1 | tee /tmp/logs/setup.txt
  touch /tmp/started
fi
grep -q started /tmp/logs/setup.txt || exit 1
elapsed "servers starting"
if [ ! -f /tmp/ready ]; then
  bash "$S/wait_key.sh" $(( BUDGET_S - 60 - ($(date +%s) - T0) )) 2>&1 | tee -a /tmp/logs/wait.txt
  [ "${PIPESTATUS[0]}" = 0 ] && touch /tmp/ready || exit 1
fi
elapsed "both ready"
DEADLINE=$(( T0 + BUDGET_S - 20 )) bash "$S/bench.sh" 2>&1 | tee -a /tmp/logs/bench_summary.txt
