"""The pace of CPython's cyclic garbage collector in a replica on the request path.

CPython collects its youngest generation every 700 net allocations of container objects, and
the middle one every tenth time. A replica allocates thousands of them per request (ASGI
scopes, pydantic models, Serve's and Ray's messages) and almost none become cyclic garbage:
at that pace the ingress spent ~10% of its CPU under load in the collector, as much in
middle-generation passes of ~4 ms each as in the youngest ones (bench/NOTES.md, "The garbage
collector's pace").
Serve freezes what start-up created (`RAY_SERVE_FREEZE_GC_ON_STARTUP`, on in the
throughput-optimized runtime), so a rarer collection still scans only what requests left.
"""

from __future__ import annotations

import gc

YOUNGEST_THRESHOLD = 50_000
"""Net container allocations between two collections of the youngest generation."""


def collect_less_often() -> None:
    """Collect the youngest generation every YOUNGEST_THRESHOLD allocations; the older
    generations keep Python's ratios to it."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNGEST_THRESHOLD, middle, oldest)
