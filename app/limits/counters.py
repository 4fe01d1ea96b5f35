"""Where the plans' counters live: one interface, in process memory or in Redis.

A request's counters are fixed windows (a minute of requests, a minute of tokens, a UTC day of
tokens; each window starts with its first hit and expires with it) and its concurrency slot,
a lease: a member of a set per user and model type whose score is its expiry. Taking a slot
drops the expired members first, so a count can neither drift past the leases that are alive
nor go below zero, whatever order releases arrive in.

Admission checks and takes in one step that nothing can interleave with (`admit`: a Lua
script in Redis, a lock in memory): it counts the request, takes its slot, and reserves the
most its reply may generate in the minute's and the day's token windows, so that requests
admitted side by side cannot together pass the plan. Settling (`settle`) replaces the
reservation by the tokens the engine counted, prompt included, and frees the slot; a
reservation whose window has ended by then went with it, and the tokens are charged to the
window of the moment. A refused request reserves nothing and holds no slot.

`MemoryCounters` holds them for one ingress replica (`limits`' memory storage); `RedisCounters`
for every replica alike, in one round trip per step (a script, or MULTI/EXEC; redis-py):
through `limits`, one call per counter, the same work took about twice the CPU and latency
(bench/NOTES.md).
Expiry times of leases are Unix times of the replica that wrote them (hosts keep time by NTP).
"""

from __future__ import annotations

from app.limits.memory_counters import MemoryCounters
from app.limits.redis_counters import RedisCounters
from app.limits.windows import (
    LEASE_TTL_S,
    Ask,
    Budget,
    CounterKeys,
    Counters,
    Lease,
    Snapshot,
    reservation,
)

__all__ = [
    "LEASE_TTL_S",
    "Ask",
    "Budget",
    "CounterKeys",
    "Counters",
    "Lease",
    "MemoryCounters",
    "RedisCounters",
    "Snapshot",
    "open_counters",
    "reservation",
]


def open_counters(
    redis_url: str | None, *, key_prefix: str = "serviceai", timeout_s: float = 2.0
) -> Counters:
    """Process memory without a URL; Redis with one (shared by every ingress replica)."""
    if redis_url is None:
        return MemoryCounters()
    return RedisCounters(redis_url, key_prefix=key_prefix, timeout_s=timeout_s)
