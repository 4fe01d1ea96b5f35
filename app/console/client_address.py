"""The address of the browser behind the console's sign-in limits.

Behind a load balancer every request reaches the ingress from a proxy, so the peer's address is
the same for everyone. `X-Forwarded-For` names the browser, but anyone can send one: it is read
only when the peer is a configured trusted proxy (SERVICEAI_TRUSTED_PROXIES), and then from the
right, where each trusted proxy appended the address it saw, to the first hop that is not one
of them. Without trusted proxies the header is ignored. A request from a trusted proxy that
names no other hop has an address nobody can know: it is counted as SHARED, whose sign-in
limit is sized to the password hashing a replica can afford (app.console.sign_in_limit).

Ray's HAProxy, on the same machine as the ingress, connects from loopback and appends the address
it saw (app/serving/haproxy_forwarding.py): with loopback trusted (serve_config.yaml does), each
browser behind it is its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network

from starlette.requests import Request

UNKNOWN = "unknown"
SHARED = "shared"
"""The address of a request whose client cannot be told apart from others."""


class ClientAddress:
    def __init__(self, trusted_proxies: Sequence[str] = ()) -> None:
        self._trusted: list[IPv4Network | IPv6Network] = [
            ip_network(proxy, strict=False) for proxy in trusted_proxies
        ]

    def of(self, request: Request) -> str:
        if request.client is None:
            return SHARED
        peer = request.client.host
        if not self._is_trusted(peer):
            return peer
        hops = [
            hop.strip()
            for header in request.headers.getlist("x-forwarded-for")
            for hop in header.split(",")
        ]
        for hop in reversed(hops):
            if not self._is_trusted(hop):
                return hop if _is_address(hop) else SHARED
        return SHARED if not hops else hops[0]

    def _is_trusted(self, address: str) -> bool:
        if not self._trusted or not _is_address(address):
            return False
        parsed = ip_address(address)
        return any(parsed in network for network in self._trusted)


def _is_address(text: str) -> bool:
    try:
        ip_address(text)
    except ValueError:
        return False
    return True
