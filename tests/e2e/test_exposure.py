"""What the local profile exposes: Serve's HTTP port on 127.0.0.1 only, and the service's
answers carry no internals."""

from __future__ import annotations

from urllib.parse import urlsplit

import psutil

from tests.conftest import Stack


def stack_processes(stack: Stack) -> list[psutil.Process]:
    """Every process of this session's Ray cluster (its command line or an ancestor's names
    the cluster's own temp folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            chain = [proc, *proc.parents()]
            if any(str(stack.ray_dir) in " ".join(p.cmdline()) for p in chain):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def listening(processes: list[psutil.Process]) -> dict[int, set[tuple[str, str]]]:
    """Listening TCP sockets: port -> (address bound, process name)."""
    ports: dict[int, set[tuple[str, str]]] = {}
    for proc in processes:
        try:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    ports.setdefault(conn.laddr.port, set()).add((conn.laddr.ip, proc.name()[:40]))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ports


def test_serve_http_listens_on_localhost_only(stack: Stack):
    ports = listening(stack_processes(stack))
    # Ray's own services (GCS, raylet, workers' gRPC) bind wider; that is Ray's to configure.
    print("listening:", {p: sorted(a) for p, a in sorted(ports.items())})
    assert {ip for ip, _ in ports[urlsplit(stack.origin).port]} == {"127.0.0.1"}
