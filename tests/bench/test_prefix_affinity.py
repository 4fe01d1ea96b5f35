"""`bench.prefix_affinity`'s plan and table (no server is started)."""

from pathlib import Path
from types import SimpleNamespace

from bench.prefix_affinity import SINGLE, setups, table


def test_the_one_replica_reference_runs_last_and_is_shown_first():
    # a run cut short by a device call's budget keeps the power-of-two / router comparison
    plan = [
        name
        for name, _ in setups(SimpleNamespace(gpu=False), Path("/tmp"), [2], [4], with_ray=False)
    ]
    assert plan == [
        "ServiceAi, 2 replicas, power of two",
        "ServiceAi, 2 replicas, prefix affinity",
        SINGLE,
    ]
    row = {
        "cached_share": 0.5,
        "ttft_p50_ms": 10.0,
        "ttft_p99_ms": 20.0,
        "requests_per_s": 1.0,
        "output_tokens_per_s": 24.0,
    }
    lines = table({plan[0]: row, plan[1]: row, SINGLE: row}).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| " + SINGLE,
        "| " + plan[0],
        "| " + plan[1],
    ]
