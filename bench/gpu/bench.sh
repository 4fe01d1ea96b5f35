#!/usr/bin/env bash
# On the GPU machine once wait_key.sh has seen both servers answer: `vllm bench serve` against
# bare (:8100) and the service (:8000) in turn at each concurrency. JSON results to $RES (default
# /tmp/results); a run already there is skipped, so a later call picks up where one ran out of
# time. DEADLINE: epoch seconds after which no run starts; ROUNDS: interleaved repetitions;
# CONCS: concurrency:prompts pairs; SERVERS: label:port:model triples (default bare vLLM on
# :8100 and the service on :8000, both ServiceAi-Fast). Runs at c >= 128 also sample CPU per
# process (cpu_snap.py).
export PYTHONPATH=/tmp/site:/tmp/proj HF_HUB_OFFLINE=1
S=$(cd "$(dirname "$0")" && pwd)
KEY=$(cat /tmp/key); M=${MODEL:-/tmp/m1b}; IN=${IN:-64}; OUTL=${OUTL:-64}; TAG=${TAG:-m1b}
RES=${RES:-/tmp/results}; DEADLINE=${DEADLINE:-$(( $(date +%s) + 3600 ))}
mkdir -p "$RES" /tmp/logs
SHOW="import json, sys
d = json.load(open(sys.argv[1]))
print(sys.argv[2], d['completed'], '/', d['num_prompts'], 'tok/s %.0f req/s %.1f ttft50 %.1f '
      'ttft99 %.1f itl50 %.2f itl99 %.1f' % tuple(d[k] for k in (
          'output_throughput', 'request_throughput', 'median_ttft_ms', 'p99_ttft_ms',
          'median_itl_ms', 'p99_itl_ms')))"
for r in $(seq 1 "${ROUNDS:-1}"); do
for cn in ${CONCS:-1:32 32:320 128:1024 256:1536}; do c=${cn%%:*}; n=${cn##*:}
 for s in ${SERVERS:-bare:8100:ServiceAi-Fast ours:8000:ServiceAi-Fast}; do
  IFS=: read -r lab port model <<< "$s"; name=${TAG}_${lab}_c${c}_r${r}
  [ -f "$RES/$name.json" ] && continue
  left=$(( DEADLINE - $(date +%s) ))
  [ $left -lt 45 ] && { echo "SKIP $name (time)"; continue; }
  [ $left -gt 240 ] && left=240
  cpid=
  if [ "$c" -ge 128 ]; then
    python3 "$S/cpu_snap.py" 0.5 > /tmp/logs/cpu_$name.txt 2>/dev/null & cpid=$!
  fi
  OPENAI_API_KEY=$KEY timeout $left python3 -m vllm.entrypoints.cli.main bench serve \
   --backend openai-chat --base-url http://127.0.0.1:$port --endpoint /v1/chat/completions \
   --model $model --tokenizer $M --dataset-name random --random-input-len $IN \
   --random-output-len $OUTL --ignore-eos --num-prompts $n --max-concurrency $c --num-warmups 8 \
   --seed 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 --save-result \
   --result-dir "$RES" --result-filename $name.json --disable-tqdm > /tmp/logs/b_$name.txt 2>&1 \
   || { echo "FAIL $name"; tail -3 /tmp/logs/b_$name.txt; }
  [ -n "$cpid" ] && { kill $cpid 2>/dev/null; wait $cpid 2>/dev/null; }
  python3 -c "$SHOW" "$RES/$name.json" "$name" 2>&1 | tail -1
 done; done; done
