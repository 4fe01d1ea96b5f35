"""The server's SVG bar charts: scaled to a round top, stacked per day, every bar titled."""

from datetime import date, timedelta

from app.console.charts import BOTTOM, HEIGHT, TOP, compact, nice_ceiling, stacked_bars

DAYS = [date(2026, 11, 1) + timedelta(days=n) for n in range(3)]


def test_the_top_of_the_axis_is_a_round_number_at_or_above_the_tallest_day():
    assert [nice_ceiling(v) for v in (0, 1, 2, 3, 7, 10, 11, 260, 5001)] == [
        1,
        1,
        2,
        5,
        10,
        10,
        20,
        500,
        10000,
    ]
    assert [compact(v) for v in (0, 950, 1500, 2_000_000, 3e9)] == ["0", "950", "1.5k", "2M", "3G"]


def test_bars_stack_per_day_in_the_colour_of_their_series():
    chart = stacked_bars(
        "t",
        DAYS,
        {"B": {DAYS[0]: 30, DAYS[2]: 5}, "A": {DAYS[0]: 20}},
        "tokens",
        colours=["A", "B", "C"],
    )
    assert [(b.title, b.series) for b in chart.bars] == [
        ("2026-11-01 B: 30 tokens", 1),
        ("2026-11-01 A: 20 tokens", 0),
        ("2026-11-03 B: 5 tokens", 1),
    ]
    plot = HEIGHT - BOTTOM - TOP
    first, second, _ = chart.bars
    assert (first.height, second.height) == (plot * 30 / 50, plot * 20 / 50)  # top: 50
    assert second.y + second.height == first.y  # stacked
    assert chart.series == [(1, "B"), (0, "A")]  # the legend: what is drawn
    assert chart.ticks[-1].text == "50" and [d.text for d in chart.days] == [
        "11-01",
        "11-02",
        "11-03",
    ]


def test_a_range_without_usage_draws_an_empty_axis():
    chart = stacked_bars("t", DAYS, {}, "requests")
    assert chart.bars == [] and chart.ticks[-1].text == "1"
