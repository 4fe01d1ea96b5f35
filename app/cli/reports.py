"""`serviceai usage` and `serviceai audit`: what keys used, and what operators did."""

from __future__ import annotations

from datetime import date, datetime

import typer

from app.accounts.keystore.audit import LAST_ID
from app.accounts.keystore.schemas import AuditPage, UsageList
from app.cli.common import JsonOption, print_json, table, when, with_store


def usage(
    user: str = typer.Option(None, help="Only this user's keys (id or email)."),
    key: str = typer.Option(None, "--key", help="Only this key (key_...)."),
    start_date: datetime = typer.Option(
        None, formats=["%Y-%m-%d"], help="First UTC day (default: 29 days before the last)."
    ),
    end_date: datetime = typer.Option(
        None, formats=["%Y-%m-%d"], help="Last UTC day (default: today)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """Usage per key, model type and UTC day: requests, prompt and completion tokens.

    Replicas write usage every SERVICEAI_USAGE_FLUSH_S seconds and when they stop.
    """
    start: date | None = start_date.date() if start_date else None
    end: date | None = end_date.date() if end_date else None
    report: UsageList = with_store(
        lambda store: store.usage(user=user, key_id=key, start=start, end=end)
    )
    if as_json:
        print_json(report)
        return
    rows = [
        [
            str(r.date),
            r.user_id,
            r.key_id,
            r.model,
            str(r.requests),
            str(r.prompt_tokens),
            str(r.completion_tokens),
            str(r.total_tokens),
        ]
        for r in report.data
    ]
    table(["DATE", "USER", "KEY", "MODEL", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL"], rows)
    totals = [
        sum(getattr(r, f) for r in report.data)
        for f in ("requests", "prompt_tokens", "completion_tokens", "total_tokens")
    ]
    typer.echo(
        f"{report.start_date} to {report.end_date}: {totals[0]} requests, {totals[1]} prompt + "
        f"{totals[2]} completion = {totals[3]} tokens."
    )
    if report.budget is not None:
        budget = report.budget
        typer.echo(
            f"Monthly budget ({budget.month}, UTC): {budget.used} of {budget.monthly_tokens} "
            f"tokens used, {budget.left} left."
        )


def audit(
    limit: int = typer.Option(50, min=1, max=1000, help="At most this many, newest first."),
    before: int = typer.Option(None, min=1, max=LAST_ID, help="Start before this entry id."),
    as_json: bool = JsonOption,
) -> None:
    """The audit log: every operator action (console, CLI, admin API), newest first."""
    page: AuditPage = with_store(lambda store: store.audit_log(limit=limit, before=before))
    if as_json:
        print_json(page)
        return
    table(
        ["ID", "AT (UTC)", "SOURCE", "ACTOR", "ACTION", "TARGET", "DETAIL"],
        [
            [str(e.id), when(e.at), e.source, e.actor, e.action, e.target, e.detail or "-"]
            for e in page.data
        ],
    )
    if page.has_more:
        typer.echo(f"... more: --before {page.data[-1].id}")
