#!/usr/bin/env bash
# On the GPU machine, in the project's root, once every part and site.sha256 are in /tmp/parts:
# unpack the packages, generate the models, start the service (port 8000) and bare vLLM (port
# 8100) on the same model. PROJ: the project to run, here .gpu/proj (snapshot.sh: patched for
# vLLM 0.26). Packages added after the parts were built may lie in .gpu/extra (pure Python).
# SERVERS=0: unpack and make the models only (cluster_bench.sh starts its own servers).
P=${PROJ:-.}
S=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site /tmp/logs
[ -d /tmp/proj ] || cp -r "$P" /tmp/proj
grep -q "vLLM 0.26" /tmp/proj/deployments/vllm_engine/engine.py \
  || echo "WARNING: $P is not patched for vLLM 0.26 (bench/gpu/snapshot.sh)"
UNPACK="import lzma, sys, tarfile
tar = tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode='r|')
tar.extractall('/tmp/site', filter='fully_trusted')"
if [ ! -f /tmp/site/.done ]; then
  ls /tmp/parts/site.part.* | wc -l
  (cd /tmp/parts && sha256sum -c --quiet site.sha256) || { echo "parts missing or bad"; exit 1; }
  cat /tmp/parts/site.part.* | python3 -c "$UNPACK" && touch /tmp/site/.done
fi
[ -d .gpu/extra ] && cp -r .gpu/extra/. /tmp/site/
# FlashInfer is not carried: vLLM's sampler would import it on CUDA and fail; both servers use
# the PyTorch sampler instead.
export PYTHONPATH=/tmp/site:/tmp/proj HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 RAY_USAGE_STATS_ENABLED=0
# Ray's workers find `serve` and `ray` on the interpreter's PATH
BIN=$(dirname "$(which python3)")
printf '#!%s\nfrom ray.serve.scripts import cli\ncli()\n' "$BIN/python3" > "$BIN/serve"
chmod +x "$BIN/serve"
VERSIONS="import fastapi, pydantic, ray, torch, transformers, vllm
print('versions', *(f'{m.__name__} {m.__version__}' for m in (vllm, ray, fastapi, pydantic,
                                                              torch, transformers)))"
python3 -c "$VERSIONS" 2>&1 | tail -3 | tee /tmp/logs/versions.txt
grep -q "^versions" /tmp/logs/versions.txt || exit 1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
[ -f /tmp/m1b/config.json ] || python3 "$S/make_models.py" /tmp/tiny /tmp/m1b 2>&1 | tail -1
[ "${SERVERS:-1}" = 0 ] && { echo unpacked; exit 0; }
cd /tmp/proj
# Each server its own compile cache: the two compile the same model at the same time. Both start
# at once, so each gets a fixed KV cache (no memory profiling that could count the other's
# allocations); bare's engine args are serve_gpu.yaml's.
VLLM_CACHE_ROOT=/tmp/vc_ours setsid python3 -c "from app.cli.main import main; main()" \
  run --config "$S/serve_gpu.yaml" > /tmp/logs/ours.log 2>&1 < /dev/null &
echo $! > /tmp/ours.pid
VLLM_CACHE_ROOT=/tmp/vc_bare setsid python3 -m vllm.entrypoints.openai.api_server \
  --model /tmp/m1b --served-model-name ServiceAi-Fast --host 127.0.0.1 --port 8100 \
  --max-model-len 2048 --max-num-seqs 256 --max-num-batched-tokens 8192 --dtype bfloat16 \
  --gpu-memory-utilization 0.4 --kv-cache-memory-bytes 17179869184 \
  --disable-uvicorn-access-log > /tmp/logs/bare.log 2>&1 < /dev/null &
echo $! > /tmp/bare.pid
echo started
