#!/usr/bin/env bash
# tests/with_services.sh COMMAND...: run COMMAND (the test suite) with a PostgreSQL and a Redis.
#
# The tests use postgresql://postgres@127.0.0.1:5432/test (trust) and redis://127.0.0.1:6379/0
# unless SERVICEAI_TEST_POSTGRES / SERVICEAI_TEST_REDIS name others. Where one of them does not
# answer (or SERVICEAI_TEST_OWN_SERVICES=1), Debian's postgresql / redis-server are installed if
# missing, and a throw-away server is started in a temporary folder on a free port, handed to
# COMMAND through that variable, and stopped (its folder removed) when COMMAND ends, even on
# failure. No system service is started, stopped or reconfigured by this script.
set -euo pipefail

PYTHON=${PYTHON:-python3}
OWN=${SERVICEAI_TEST_OWN_SERVICES:-0}
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
WORK=""
PG_CTL=""
REDIS_PID=""

log() { echo "with_services: $*" >&2; }

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Whether the tests could use this server (connects and answers), not merely whether a port is open.
postgres_answers() {
  "$PYTHON" - "$1" <<'EOF' 2>/dev/null
import asyncio, sys
import asyncpg
async def main():
    connection = await asyncpg.connect(sys.argv[1], timeout=3)
    await connection.close()
asyncio.run(main())
EOF
}

redis_answers() {
  "$PYTHON" -c 'import sys, redis; redis.Redis.from_url(sys.argv[1], socket_timeout=3).ping()' "$1" 2>/dev/null
}

install() {  # Debian packages, as `make browser` installs Chromium
  log "installing $*"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

stop_all() {
  if [ -n "$PG_CTL" ]; then
    as_postgres "$PG_CTL" -D "$WORK/pg" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  if [ -n "$REDIS_PID" ]; then
    kill "$REDIS_PID" 2>/dev/null || true
    while kill -0 "$REDIS_PID" 2>/dev/null; do sleep 0.1; done
  fi
  [ -z "$WORK" ] || rm -rf "$WORK"
}
trap stop_all EXIT

work_dir() {
  [ -n "$WORK" ] || WORK=$(mktemp -d /tmp/sai-services-XXXXXX)
}

# PostgreSQL refuses to run as root: there, the server runs as the `postgres` user the package made.
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_postgres() {
  local bin port
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$bin" ]; then
    install postgresql
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  work_dir
  port=$(free_port)
  mkdir "$WORK/pg"
  [ "$(id -u)" != 0 ] || chown postgres "$WORK" "$WORK/pg"
  as_postgres "$bin/initdb" -D "$WORK/pg" -U postgres --auth=trust -E UTF8 >/dev/null
  PG_CTL="$bin/pg_ctl"
  # Listens on 127.0.0.1 only; its socket in its own folder; fsync off: the data is thrown away.
  as_postgres "$PG_CTL" -D "$WORK/pg" -l "$WORK/pg/server.log" -w \
    -o "-h 127.0.0.1 -p $port -k $WORK/pg -c fsync=off -c max_connections=200" start >/dev/null
  as_postgres "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres test
  export SERVICEAI_TEST_POSTGRES="postgresql://postgres@127.0.0.1:$port/test"
  log "throw-away PostgreSQL on 127.0.0.1:$port ($WORK/pg)"
}

start_redis() {
  local port
  command -v redis-server >/dev/null || install redis-server
  work_dir
  port=$(free_port)
  redis-server --bind 127.0.0.1 --port "$port" --dir "$WORK" --save '' --appendonly no \
    --logfile "$WORK/redis.log" --daemonize no &
  REDIS_PID=$!
  for _ in $(seq 100); do redis_answers "redis://127.0.0.1:$port/0" && break; sleep 0.1; done
  redis_answers "redis://127.0.0.1:$port/0" || { log "Redis did not start; see $WORK/redis.log"; exit 1; }
  export SERVICEAI_TEST_REDIS="redis://127.0.0.1:$port/0"
  log "throw-away Redis on 127.0.0.1:$port (pid $REDIS_PID)"
}

if [ "$OWN" = 1 ] || ! postgres_answers "${SERVICEAI_TEST_POSTGRES:-postgresql://postgres@127.0.0.1:5432/test}"; then
  start_postgres
fi
if [ "$OWN" = 1 ] || ! redis_answers "${SERVICEAI_TEST_REDIS:-redis://127.0.0.1:6379/0}"; then
  start_redis
fi
"$@"
