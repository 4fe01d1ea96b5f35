#!/usr/bin/env bash
# One device call, in the project's root, once the parts are in /tmp/parts (README.md, calls
# 1-4): issue 32's benchmarks on the GPU. setup.sh unpacks and makes the models (no servers);
# then, on the generated 1B model, `bench.prefix_affinity` (REPLICAS of ServiceAi-Fast sharing
# the GPU: the power of two against the service's router; then the 1-replica reference) and
# `bench.priority` (one slot kept for pro, priority with no reserve, fcfs: the goal's setup
# first, as a run cut short loses the last; vLLM 0.26 streams every request token by token, so
# the busy-engine chunks are 0.32's alone), each cut short before BUDGET_S is spent.
# STEPS: which of the two (default "affinity priority"); PRIORITY_SETUPS: the priority
# setups, ";"-separated (default: all three); AFFINITY_ARGS: more of
# bench.prefix_affinity's flags (e.g. "--think-s 1 --open 16", users who pause between turns).
# Everything comes back in one file, $OUT/gpu.tgz (the device tool returns at most 8): each
# benchmark's output, its new JSON results and its servers' logs. Outputs also stay in /tmp/out,
# so a later call on the same (warm) machine can pack them again.
T0=$(date +%s); BUDGET_S=${BUDGET_S:-540}; S=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/logs /tmp/out
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
# A benchmark cut short by its timeout stops its servers (SIGINT); whatever is left of them
# would hold GPU memory the next one needs. (Bracketed: pkill must not match this shell.)
sweep() { pkill -9 -f "[s]erve run|[r]ay::|[r]aylet|[g]cs_server|[E]ngineCore"; sleep 2; }
pack() {
  echo "t=$(( $(date +%s) - T0 )) s: packing"
  nvidia-smi > /tmp/logs/nvidia-smi.txt 2>&1
  mkdir -p /tmp/out/logs
  find /tmp/proj/bench/results -name '*.json' -newer /tmp/out/started -exec cp {} /tmp/out/ \;
  for f in /tmp/logs/* /tmp/sai-*/*; do
    [ -f "$f" ] && tail -c 400000 "$f" > "/tmp/out/logs/$(basename "$(dirname "$f")")_$(basename "$f")"
  done
  tar -C /tmp/out -czf "$OUT/gpu.tgz" . && ls -la "$OUT"
}
trap pack EXIT
if [ ! -f /tmp/site/.done ] || [ ! -f /tmp/m1b/config.json ]; then
  SERVERS=0 bash "$S/setup.sh" 2>&1 | tee /tmp/logs/setup.txt
fi
grep -q unpacked /tmp/logs/setup.txt || exit 1
# after setup.sh: its copy of the project into /tmp/proj makes every tracked result look new
[ -f /tmp/out/started ] || touch /tmp/out/started
export PYTHONPATH=/tmp/site:/tmp/proj HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0
cd /tmp/proj
# MODEL: m1b (default) or m8b, a Llama 3 8B's shape (make_models.py; 14 GB, made in ~35 s;
# give each replica the memory, e.g. gpu_memory_utilization 0.45 at 2 replicas)
MODEL=${MODEL:-m1b}
if [ ! -f "/tmp/$MODEL/config.json" ]; then
  python3 "$S/make_models.py" /tmp/tiny "/tmp/$MODEL" "${MODEL#m}" 2>&1 | tail -1
fi
# Every engine the same: eager (no torch.compile or CUDA graphs: an engine starts in ~50 s with
# Ray's, not ~90), a fixed 4 GiB KV cache (131k tokens of this model: one replica holds about
# every conversation of the run) in a fifth of the GPU, so that four fit beside each other.
EA=${EA:-'{"max_model_len": 2048, "dtype": "bfloat16", "enforce_eager": true,
  "gpu_memory_utilization": 0.2, "kv_cache_memory_bytes": 4294967296}'}
STEPS=${STEPS:-affinity priority}
quiet() { grep --line-buffered -v "^\(INFO\|DEBUG\|WARNING\) "; }
if [[ $STEPS == *affinity* ]]; then
  echo "t=$(( $(date +%s) - T0 )) s: affinity"
  # each setup takes 60-150 s here (Ray and the engines start, 64 conversations, stop)
  RESERVE=0; [[ $STEPS == *priority* ]] && RESERVE=${PRIORITY_S:-200}
  timeout -s INT -k 20 $(( $(left) - RESERVE )) python3 -m bench.prefix_affinity \
    --model "/tmp/$MODEL" --engine-args "$EA" --replicas "${REPLICAS:-2}" --without-ray-llm \
    ${AFFINITY_ARGS:-} 2>&1 \
    | quiet | tee -a /tmp/out/affinity.txt
  sweep
fi
if [[ $STEPS == *priority* ]]; then
  echo "t=$(( $(date +%s) - T0 )) s: priority"
  # The eager 1B model decodes 8 streams at ~6 ms a step: 300-token free requests keep a fcfs
  # pro request waiting ~5 s, and 20 of them outlast the budget (2026-11-26).
  # PRIORITY_SETUPS: bench.priority's setups to run, ";"-separated, in this order
  IFS=';' read -ra PS <<< "${PRIORITY_SETUPS:-priority, 1 slot kept for pro, free streams token;priority, no reserve;fcfs}"
  SETUP_ARGS=(); for p in "${PS[@]}"; do SETUP_ARGS+=(--setup "$p"); done
  timeout -s INT -k 10 $(( $(left) - 25 )) python3 -m bench.priority --model "/tmp/$MODEL" \
    --engine-args "$EA" --flood-tokens 100 --pro-requests 10 "${SETUP_ARGS[@]}" 2>&1 \
    | quiet | tee -a /tmp/out/priority.txt
fi
