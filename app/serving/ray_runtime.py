"""How Ray Serve itself runs this service: the environment of the Ray cluster.

These variables are read by Ray's own processes (controller, replicas, HAProxy manager) when
they start, so they belong to whatever starts Ray: `serviceai run`, the test session, the
benchmark, and `ray start` in cluster.yaml. Measured effect: bench/NOTES.md.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path

from app.serving import haproxy_forwarding

SERVE_ENV: dict[str, str] = {
    # User code and the handle router on the replica's own event loop (no cross-thread hop
    # per streamed chunk), gRPC between deployments, GC frozen after start-up.
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # HAProxy forwards HTTP straight to the ingress replicas' own servers: no Python proxy
    # actor re-streaming every chunk through a Ray generator.
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # Ray starts workers at nice 15; on a serving node the engines are the work.
    "RAY_worker_niceness": "0",
    # HAProxy drops a client connection idle this long (Ray's default: an hour); just past the
    # load balancer's 600 s idle timeout, so the balancer closes first. A body that trickles in
    # is not idle: the ingress cuts it off itself (SERVICEAI_BODY_READ_TIMEOUT_S, 408).
    "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "620",
    # uvicorn in each replica trusts X-Forwarded-For from 127.0.0.1 by default and would put
    # the client's claim in place of the peer; the console reads the header itself, from
    # SERVICEAI_TRUSTED_PROXIES only (HAProxy appends the address it saw).
    "FORWARDED_ALLOW_IPS": "",
    # A client's x-request-id is checked (length, characters) before Serve adopts it.
    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "app.observability.request_id:http_middlewares",
}


ONE_MACHINE_ENV: dict[str, str] = {
    # A stopping ingress replica stays reachable this long before it closes its listener (Ray's
    # default: 30 s, for balancers elsewhere that need time to drop it; production keeps it).
    # On one machine the HAProxy in front of it hears from Serve's controller within a second,
    # and one that still routes to it after that is refused and retries another replica. Ray's
    # 30 s made every stop of `serviceai run` take 34 s (bench/NOTES.md, "The ingress drain").
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
}


# Ports free_port has handed out in this process: never the same one twice.
_HANDED_OUT: set[int] = set()
# Ray's worker processes take ports from 10002-19999 (its default range); free ports start above.
FIRST_FREE_PORT = 20000
# Serve's replicas bind their own HTTP servers (HAProxy sends requests straight to them) on the
# first free port from 30000 to 31000 of their machine (RAY_SERVE_DIRECT_INGRESS_MIN/MAX_HTTP_PORT;
# gRPC 40000-41000 is inside the ephemeral range): a port handed out there can be a replica's
# before its own server binds it. Seen: a rehearsal node's HAProxy stats port, 30001.
SERVE_REPLICA_PORTS = range(30000, 31001)
# Its own generator: a test that seeds `random` must not make two processes pick alike.
_PICK = random.Random()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a server started next (a Ray node, Serve's proxies, a
    test's database).

    Chosen below the kernel's ephemeral range where it can be: a port from that range can be
    taken as the local end of some outgoing connection between now and the server's own bind,
    which made a rehearsal node's `ray start` fail on a busy machine; never one of the ports
    Serve's replicas take for their own servers. Never the same port twice
    in one process, where two components asked for at once would otherwise share one.
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        if ephemeral_low > FIRST_FREE_PORT + 1000:
            port = _PICK.randrange(FIRST_FREE_PORT, ephemeral_low)
        else:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
        if port in _HANDED_OUT or port in SERVE_REPLICA_PORTS:
            continue
        try:
            with socket.socket() as sock:
                sock.bind((host, port))
        except OSError:
            continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port found in 1000 tries")


MAX_STATE_DIR_CHARS = 28
PER_MACHINE_PORTS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)


def cluster_env(state_dir: Path, free_port: Callable[[], int] | None = None) -> dict[str, str]:
    """SERVE_ENV and ONE_MACHINE_ENV for one Ray cluster on this machine whose HAProxy keeps its
    files in `state_dir`.

    HAProxy's files default to /tmp/haproxy-serve, and Serve fixes four ports per machine:
    HAProxy's stats and metrics (8404, 9101) and the fallback proxy that HAProxy sends requests
    to while no ingress replica is up (8500, gRPC 9500). Two clusters on one machine (a test
    session beside `make run`) need their own: with `free_port`, each of those is a port it
    returns. The fallback proxy binds with SO_REUSEPORT, so a second cluster on 8500 does not
    fail: the kernel shares out the connections, and one cluster's clients reach the other's
    service (the keys of another key store, 401).

    Ray puts a 56-character folder under `state_dir` and HAProxy caps its socket path at 97
    characters, so `state_dir` must be short.
    """
    if len(str(state_dir)) > MAX_STATE_DIR_CHARS:
        raise ValueError(
            f"HAProxy state dir {state_dir} is longer than {MAX_STATE_DIR_CHARS} characters; "
            "HAProxy's socket path under it would exceed 97"
        )
    env = SERVE_ENV | ONE_MACHINE_ENV
    env |= {
        # HAProxy with X-Forwarded-For (app/serving/haproxy_forwarding.py).
        "RAY_SERVE_HAPROXY_BINARY_PATH": haproxy_forwarding.install(state_dir / "bin"),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(state_dir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(state_dir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(state_dir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(state_dir / "server-state"),
    }
    if free_port is not None:
        env |= {name: str(free_port()) for name in PER_MACHINE_PORTS}
    return env
