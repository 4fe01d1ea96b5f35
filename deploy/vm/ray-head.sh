#!/bin/bash
# The head's Ray, in the foreground (`--block`): what serviceai-ray-head.service runs and
# restarts, and so what `ray up` starts on the head (cluster.yaml's head_start_ray_commands).
# `ray start --block` exits when any of the head's Ray processes dies; systemd then starts it
# again, and the new GCS reads the cluster back from the GCS Redis while the worker nodes wait.
#
# Ray's token authentication on, and the environment file exported so that the ${VAR}
# references in serve_config.production.yaml resolve. The RAY_SERVE_* and RAY_worker_niceness
# variables are app/serving/ray_runtime.py's SERVE_ENV (a test keeps them equal), as on every
# worker (cluster.yaml says what each does). GCS fault tolerance: Ray's control plane in the GCS
# Redis (SERVICEAI_GCS_REDIS_ADDRESS) under one namespace; workers wait 600 s for its return.
set -euo pipefail
set -a && . ~/serviceai.env && set +a
# Open files: the unit's LimitNOFILE=65536 (cluster.yaml's workers: ulimit -n 65536).
export RAY_AUTH_MODE=token RAY_SERVE_THROUGHPUT_OPTIMIZED=1 RAY_SERVE_ENABLE_HA_PROXY=1 \
  RAY_worker_niceness=0 RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S=620 FORWARDED_ALLOW_IPS= \
  RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=app.observability.request_id:http_middlewares \
  RAY_SERVE_HAPROXY_BINARY_PATH="$(~/venv/bin/python -m app.serving.haproxy_forwarding install ~/haproxy-bin)" \
  RAY_REDIS_ADDRESS="$SERVICEAI_GCS_REDIS_ADDRESS" RAY_external_storage_namespace=serviceai \
  RAY_gcs_rpc_server_reconnect_timeout_s=600
exec ~/venv/bin/ray start --head --block --port=6379 --object-manager-port=8076 \
  --metrics-export-port=8080 \
  ${SERVICEAI_GCS_REDIS_PASSWORD:+--redis-password="$SERVICEAI_GCS_REDIS_PASSWORD"} \
  --autoscaling-config="$HOME/ray_bootstrap_config.yaml"
