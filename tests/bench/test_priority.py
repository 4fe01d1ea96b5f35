"""`bench.priority`'s reading of its samples (no server is started)."""

import statistics

from bench.priority import ratio_interval, split, table


def test_the_ratio_interval_holds_the_ratio_of_medians_and_narrows_with_agreeing_samples():
    alone = [20.0 + i % 5 for i in range(30)]  # 20-24 ms
    loaded = [30.0 + i % 9 for i in range(60)]  # 30-38 ms
    low, high = ratio_interval(alone, loaded)
    ratio = statistics.median(loaded) / statistics.median(alone)
    assert low < ratio < high
    assert 1.2 < low and high < 1.9
    # the same samples give the same interval; samples all alike give no spread at all
    assert ratio_interval(alone, loaded) == (low, high)
    assert ratio_interval([10.0] * 30, [15.0] * 60) == (1.5, 1.5)


def test_the_table_shows_each_setups_ratio_with_its_interval():
    alone, loaded = [10.0] * 30, [14.0] * 60
    result = {
        "pro_unloaded": {"p50_ms": 10.0, "p99_ms": 10.0},
        "pro_under_flood": {"p50_ms": 14.0, "p99_ms": 14.0},
        "free_under_flood": {"p50_ms": 3000.0, "p99_ms": 5000.0},
        "free_tokens_per_s_while_pro_ran": 1500.0,
        "phases": [
            {"phase": "alone", "p50_ms": 9.0},
            {"phase": "flood", "p50_ms": 14.0},
            {"phase": "alone", "p50_ms": 11.0},
        ],
        "pro_ms": {"alone": alone, "under_flood": loaded},
    }
    row = table({"priority, 1 slot kept": result}).splitlines()[-1]
    assert row == (
        "| priority, 1 slot kept | 10 (9 / 11) | 14 / 14 | 1.40x (1.40-1.40) | 3000 / 5000 | 1500 |"
    )


def test_requests_split_over_phases_as_evenly_as_they_go():
    assert split(30, 3) == [10, 10, 10]
    assert split(10, 3) == [4, 3, 3]
    assert split(60, 2) == [30, 30]
    assert sum(split(7, 4)) == 7
