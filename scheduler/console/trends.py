"""What the overview and a job's page show of the API's history and health answers: the
charts (`charts.bars`), the abnormal fires, the parts' health and a summary of the schedules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from markupsafe import Markup

from scheduler.console.charts import Bar, bars
from scheduler.console.display import instant, ms
from scheduler.cron.expression import CronExpr, CronSyntaxError, NoOccurrenceError, next_after

WINDOWS = {"1h": "last hour", "1d": "last day"}


@dataclass(frozen=True, slots=True)
class Charts:
    lateness: Markup
    deliveries: Markup
    dead: Markup | None
    abnormal: int  # buckets holding a fire at least `abnormal_ms` late


def charts(history: dict[str, Any]) -> Charts:
    """Lateness p99, deliveries per minute and dead letters per bucket, as three charts."""
    buckets = history["buckets"]
    day = history["window"] == "1d"
    late, rate, dead = [], [], []
    for b in buckets:
        when = _label(b["start"], day)
        n = b["deliveries"]
        p99 = b["p99_ms"] if n else n  # an empty bucket is on time (0), one not read unknown
        late.append(Bar(p99, _late_label(when, b), b["abnormal"]))
        rate.append(Bar(b["per_minute"], f"{when}: {_count(n)} deliveries", False))
        dead.append(Bar(b["dead_letters"], f"{when}: {_count(b['dead_letters'])} dead letters"))
    span = WINDOWS[history["window"]]
    dead_chart = None
    if any(b["dead_letters"] is not None for b in buckets):
        dead_chart = bars(dead, f"Dead letters per {'hour' if day else 'minute'}, {span}")
    return Charts(
        lateness=bars(late, f"Lateness p99 per {'hour' if day else 'minute'}, {span}"),
        deliveries=bars(rate, f"Deliveries per minute, {span}"),
        dead=dead_chart,
        abnormal=sum(1 for b in buckets if b["abnormal"]),
    )


def _label(start: str, day: bool) -> str:
    at = instant(start)
    if at is None:
        return str(start)
    return at.strftime("%b %d %H:%M UTC" if day else "%H:%M UTC")


def _late_label(when: str, b: dict[str, Any]) -> str:
    if not b["deliveries"]:
        return f"{when}: no deliveries" if b["deliveries"] == 0 else f"{when}: not read"
    return (
        f"{when}: p50 {ms(b['p50_ms'])}, p99 {ms(b['p99_ms'])}, max {ms(b['max_ms'])} "
        f"over {_count(b['deliveries'])} deliveries"
    )


def _count(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


# -- schedules summary ---------------------------------------------------------------------------
@dataclass
class Summary:
    """How many jobs are active, paused and failed, and the next occurrence of an active one."""

    active: int = 0
    paused: int = 0
    failed: int = 0
    next_job: str | None = None
    next_at: datetime | None = None
    partial: bool = False  # more jobs than were read


def state_of(job: dict[str, Any]) -> str:
    """active, paused or failed (a job removed from YAML is not listed)."""
    if job.get("failed"):
        return "failed"
    if job.get("paused"):
        return "paused"
    return "active"


@lru_cache(maxsize=4096)
def _parsed(cron: str) -> CronExpr | None:
    try:
        return CronExpr.parse(cron)
    except CronSyntaxError:
        return None


def next_occurrence(job: dict[str, Any], now: datetime) -> datetime | None:
    """The job's next occurrence after `now` in its zone (None if it cannot be computed)."""
    expr = _parsed(job["cron"])
    if expr is None:
        return None
    try:
        return next_after(expr, now, ZoneInfo(job["timezone"]))
    except (NoOccurrenceError, ValueError, KeyError):
        return None


def summarize(jobs: list[dict[str, Any]], now: datetime, partial: bool) -> Summary:
    summary = Summary(partial=partial)
    for job in jobs:
        state = state_of(job)
        setattr(summary, state, getattr(summary, state) + 1)
        if state != "active":
            continue
        at = next_occurrence(job, now)
        if at is not None and (summary.next_at is None or at < summary.next_at):
            summary.next_job, summary.next_at = job["name"], at
    return summary
