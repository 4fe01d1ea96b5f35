"""Usage over time as the console shows it: the days of a range, a chart of tokens and one of
requests per day stacked by model type, the table of the same numbers, and its CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta

from app.accounts.keystore.usage import DailyTotal, today
from app.console.charts import BarChart, stacked_bars

RANGES = (7, 30, 90)
CSV_HEADER = ("date", "model", "requests", "prompt_tokens", "completion_tokens", "total_tokens")


def last_days(days: int) -> tuple[date, date]:
    """The `days` UTC days up to and including today."""
    end = today()
    return end - timedelta(days=days - 1), end


@dataclass(frozen=True, slots=True)
class UsageOverTime:
    start: date
    end: date
    rows: list[DailyTotal]
    tokens: BarChart
    requests: BarChart

    @property
    def total_requests(self) -> int:
        return sum(row.requests for row in self.rows)

    @property
    def total_tokens(self) -> int:
        return sum(row.total_tokens for row in self.rows)

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        for row in self.rows:
            writer.writerow(
                (
                    row.day.isoformat(),
                    row.model,
                    row.requests,
                    row.prompt_tokens,
                    row.completion_tokens,
                    row.total_tokens,
                )
            )
        return out.getvalue()


def usage_over_time(
    rows: Sequence[DailyTotal],
    start: date,
    end: date,
    model_types: Sequence[str],
) -> UsageOverTime:
    """Charts of `rows` (from `KeyStore.daily_totals`) over every day from `start` to `end`;
    each model type keeps its place in `model_types`, hence its colour."""
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    tokens: dict[str, dict[date, int]] = {}
    requests: dict[str, dict[date, int]] = {}
    for row in rows:
        tokens.setdefault(row.model, {})[row.day] = row.total_tokens
        requests.setdefault(row.model, {})[row.day] = row.requests
    span = f"{start.isoformat()} to {end.isoformat()} (UTC)"
    return UsageOverTime(
        start,
        end,
        list(rows),
        stacked_bars(f"Tokens per day, {span}", days, tokens, "tokens", colours=model_types),
        stacked_bars(f"Requests per day, {span}", days, requests, "requests", colours=model_types),
    )


def model_chart(
    rows: Sequence[DailyTotal],
    start: date,
    end: date,
    model: str,
    model_types: Sequence[str],
) -> BarChart:
    """One model type's tokens per day (the user's plan page draws one per type), its LoRA
    adapters' (`Type:adapter`) stacked on the base model's: they share its plan windows."""
    days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
    tokens: dict[str, dict[date, int]] = {model: {}}
    for row in rows:
        if row.model.partition(":")[0] == model:
            tokens.setdefault(row.model, {})[row.day] = row.total_tokens
    return stacked_bars(
        f"{model}: tokens per day, last {len(days)} days (UTC)",
        days,
        tokens,
        "tokens",
        colours=model_types,
    )
