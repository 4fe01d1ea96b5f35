#!/usr/bin/env bash
# On the GPU machine after setup.sh: make a key for the service (saved in /tmp/key), then wait
# until both servers answer a one-token chat. Argument: how many seconds to wait at most (500).
export PYTHONPATH=/tmp/site:/tmp/proj HF_HUB_OFFLINE=1
ok() {
  curl -s -m 20 "http://127.0.0.1:$1/v1/chat/completions" -H "Authorization: Bearer $2" \
    -H 'content-type: application/json' \
    -d '{"model":"ServiceAi-Fast","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' \
    | grep -q chat.completion
}
cli() { (cd /tmp/proj && python3 -c "from app.cli.main import main; main()" "$@"); }
b=0; o=0; t0=$(date +%s); end=$((t0 + ${1:-500}))
while [ "$(date +%s)" -lt $end ]; do
  if [ ! -s /tmp/key ]; then
    cli users create --email gpu@example.com > /dev/null 2>> /tmp/logs/key.err
    cli keys create --user gpu@example.com --json 2>> /tmp/logs/key.err \
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["key"])' \
      > /tmp/key 2>> /tmp/logs/key.err
  fi
  [ $b = 1 ] || { ok 8100 none && b=1 && echo "bare ready after $(( $(date +%s) - t0 )) s"; }
  [ $o = 1 ] || { [ -s /tmp/key ] && ok 8000 "$(cat /tmp/key)" && o=1 \
    && echo "ours ready after $(( $(date +%s) - t0 )) s"; }
  [ $b = 1 ] && [ $o = 1 ] && break
  # a server that died will not answer: stop waiting
  for n in bare ours; do
    kill -0 "$(cat /tmp/$n.pid)" 2>/dev/null || { echo "$n exited"; end=0; }
  done
  sleep 5
done
echo "bare=$b ours=$o"
tail -5 /tmp/logs/ours.log /tmp/logs/bare.log /tmp/logs/key.err 2>/dev/null
[ $b = 1 ] && [ $o = 1 ]
