#!/usr/bin/env bash
# Issue 56, one device call in place of gpu_run.sh, once the parts are in /tmp/parts: bare
# `vllm serve` with one API server (:8100) and with four (:8101), and the service
# (serve_gpu_processes.yaml: ServiceAi-Fast with one serving process, ServiceAi-Pro with four),
# all on the generated 1B model; then bench.sh (`vllm bench serve`, 64 in / 64 out) at CONCS
# against each, the CPU sampled at c >= 128; results and logs in $OUT/gpu.tgz. Run it again on
# the same (warm) machine to resume.
T0=$(date +%s); BUDGET_S=${BUDGET_S:-560}; S=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/logs /tmp/results
elapsed() { echo "t=$(( $(date +%s) - T0 )) s: $1"; }
. "$S/pack.sh"
trap 'elapsed packing; pack' EXIT
export PYTHONPATH=/tmp/site:/tmp/proj HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0
if [ ! -f /tmp/started ]; then
  SERVERS=0 bash "$S/setup.sh" 2>&1 | tee /tmp/logs/setup.txt
  grep -q unpacked /tmp/logs/setup.txt || exit 1
  elapsed "unpacked"
  cd /tmp/proj
  VLLM_CACHE_ROOT=/tmp/vc_ours setsid python3 -c "from app.cli.main import main; main()" \
    run --config "$S/serve_gpu_processes.yaml" > /tmp/logs/ours.log 2>&1 < /dev/null &
  echo $! > /tmp/ours.pid
  BARE="--served-model-name ServiceAi-Fast ServiceAi-Pro --host 127.0.0.1 --max-model-len 2048
    --max-num-seqs 256 --max-num-batched-tokens 8192 --dtype bfloat16
    --gpu-memory-utilization 0.18 --kv-cache-memory-bytes 8589934592 --disable-uvicorn-access-log"
  VLLM_CACHE_ROOT=/tmp/vc_bare setsid python3 -m vllm.entrypoints.cli.main serve /tmp/m1b \
    $BARE --port 8100 > /tmp/logs/bare.log 2>&1 < /dev/null &
  echo $! > /tmp/bare.pid
  VLLM_CACHE_ROOT=/tmp/vc_bare4 setsid python3 -m vllm.entrypoints.cli.main serve /tmp/m1b \
    $BARE --port 8101 --api-server-count 4 > /tmp/logs/bare4.log 2>&1 < /dev/null &
  echo $! > /tmp/bare4.pid
  cd - > /dev/null
  touch /tmp/started
fi
ok() {
  curl -s -m 20 "http://127.0.0.1:$1/v1/chat/completions" -H "Authorization: Bearer $2" \
    -H 'content-type: application/json' \
    -d "{\"model\":\"$3\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":1}" \
    | grep -q chat.completion
}
cli() { (cd /tmp/proj && python3 -c "from app.cli.main import main; main()" "$@"); }
while [ ! -f /tmp/ready ] && [ $(( $(date +%s) - T0 )) -lt $(( BUDGET_S - 60 )) ]; do
  if [ ! -s /tmp/key ]; then
    cli users create --email gpu@example.com > /dev/null 2>> /tmp/logs/key.err
    cli keys create --user gpu@example.com --json 2>> /tmp/logs/key.err \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])' > /tmp/key 2>> /tmp/logs/key.err
  fi
  n=0
  ok 8100 none ServiceAi-Fast && n=$((n+1))
  ok 8101 none ServiceAi-Fast && n=$((n+1))
  [ -s /tmp/key ] && ok 8000 "$(cat /tmp/key)" ServiceAi-Fast && n=$((n+1))
  [ -s /tmp/key ] && ok 8000 "$(cat /tmp/key)" ServiceAi-Pro && n=$((n+1))
  [ $n = 4 ] && { touch /tmp/ready; elapsed "all four ready"; break; }
  for p in ours bare bare4; do
    kill -0 "$(cat /tmp/$p.pid)" 2>/dev/null || { echo "$p exited"; tail -20 /tmp/logs/$p.log; exit 1; }
  done
  sleep 5
done
[ -f /tmp/ready ] || { echo "not ready"; tail -5 /tmp/logs/*.log; exit 1; }
SERVERS="ours4:8000:ServiceAi-Pro bare4:8101:ServiceAi-Fast bare:8100:ServiceAi-Fast \
  ours1:8000:ServiceAi-Fast" CONCS=${CONCS:-256:1536 128:1024 32:320} \
  DEADLINE=$(( T0 + BUDGET_S - 20 )) bash "$S/bench.sh" 2>&1 | tee -a /tmp/logs/bench_summary.txt
