"""Charts drawn by the server: usage per UTC day as stacked SVG bars, one colour per model type.

The console's pages embed the SVG that `templates/chart.html` draws from a `BarChart`: no script,
no third-party origin, readable with JavaScript off (every bar has a <title>, and every chart
has a table of the same numbers beside it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date

WIDTH = 720
HEIGHT = 220
LEFT = 64  # room for the axis labels
RIGHT = 24  # room for the last day's label
BOTTOM = 24
TOP = 8


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: int
    title: str


@dataclass(frozen=True, slots=True)
class Label:
    at: float
    text: str


@dataclass(frozen=True, slots=True)
class BarChart:
    """What the template draws: bars, the y axis's ticks and a few day labels."""

    title: str
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_bottom: int
    bars: list[Bar]
    ticks: list[Label]
    days: list[Label]
    series: list[tuple[int, str]]
    """The legend: each series drawn, with its colour's index."""


def nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is >= value (at least 1)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    raise AssertionError("unreachable")


def compact(value: float) -> str:
    """12,345 as '12.3k', 4,500,000 as '4.5M': axis labels stay short."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:g}"


def stacked_bars(
    title: str,
    days: Sequence[date],
    series: Mapping[str, Mapping[date, int]],
    unit: str,
    *,
    colours: Sequence[str] | None = None,
) -> BarChart:
    """One bar per day, stacked by series (e.g. model types), scaled to the tallest day.

    `colours` names the series in a fixed order (so a model type keeps its colour from chart
    to chart); series not in it follow.
    """
    names = list(colours or [])
    names += [name for name in series if name not in names]
    top = nice_ceiling(
        max((sum(values.get(day, 0) for values in series.values()) for day in days), default=0)
    )
    plot_width = WIDTH - LEFT - RIGHT
    plot_height = HEIGHT - BOTTOM - TOP
    slot = plot_width / max(len(days), 1)
    bars: list[Bar] = []
    for index, day in enumerate(days):
        y = float(HEIGHT - BOTTOM)
        for name, values in series.items():
            value = values.get(day, 0)
            if value <= 0:
                continue
            height = value / top * plot_height
            y -= height
            bars.append(
                Bar(
                    x=LEFT + index * slot + slot * 0.15,
                    y=y,
                    width=slot * 0.7,
                    height=height,
                    series=names.index(name),
                    title=f"{day.isoformat()} {name}: {value:,} {unit}",
                )
            )
    ticks = [
        Label(HEIGHT - BOTTOM - share * plot_height, compact(top * share))
        for share in (0, 0.25, 0.5, 0.75, 1)
    ]
    every = max(1, math.ceil(len(days) / 8))
    labels = [
        Label(LEFT + index * slot + slot / 2, day.strftime("%m-%d"))
        for index, day in enumerate(days)
        if (len(days) - 1 - index) % every == 0
    ]
    legend = [(names.index(name), name) for name in series]
    return BarChart(
        title, WIDTH, HEIGHT, LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, bars, ticks, labels, legend
    )
