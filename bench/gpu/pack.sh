# Sourced by gpu_run.sh and processes_bench.sh: `pack` puts the results and logs of a device call
# into $OUT/gpu.tgz (the JSON results, the CPU samples whole, the other logs' last 300 kB).
pack() {
  nvidia-smi > /tmp/logs/nvidia-smi.txt 2>&1
  mkdir -p /tmp/pack/logs
  cp /tmp/results/*.json /tmp/pack/ 2>/dev/null
  for f in /tmp/logs/*; do
    case "$f" in
      */cpu_*) cp "$f" /tmp/pack/logs/ ;;
      *) tail -c 300000 "$f" > "/tmp/pack/logs/$(basename "$f")" ;;
    esac
  done
  for f in /tmp/ray/session_latest/logs/serve/*.log /tmp/ray/session_latest/logs/*.err; do
    [ -s "$f" ] && tail -c 200000 "$f" > "/tmp/pack/logs/ray_$(basename "$f")"
  done
  tar -C /tmp/pack -czf "$OUT/gpu.tgz" . && ls -la "$OUT"
}
