"""The in-memory twin of the fire log's history (`scheduler.operations.stores.FireHistory`),
over the engine's twins: the delayed tasks' fire log (`MemoryTaskStore.fire_log`), cron fire
logs beside it, and the dead letters (`MemoryDeadLetterStore`).

It keeps the rules of `scheduler.store.postgres.history`'s two statements: the newest `cap`
deliveries fired in [since, until), manual ones left out (for one cron job, only its own, due
at most a day before the window), each late by `fired_at - scheduled_for` in milliseconds (an
early one 0); per bucket of the window the count, p50/p99 (`percentile_cont`) and max; the same
over the window; each epoch's instance (the least name) and first and last delivery; the
`WORST` deliveries at or above the abnormal threshold, latest first; and the newest `cap` dead
letters that last failed in the window, per bucket (none for one job). What PostgreSQL builds
as JSON is shaped as it writes it: buckets and epochs in order, instants as `to_json` writes a
`timestamptz` in a UTC session (the test databases'; another session time zone writes another
offset for the same instant), whole numbers without a fraction, and an epoch's least instance
by code point (a `C` collation's order). tests/contracts/test_fire_history.py
holds the twin and PostgreSQL to the same answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.operations.stores import Window
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.memory_dead_letters import MemoryDeadLetterStore
from scheduler.store.memory_statistics import percentile_cont

WORST = 10  # history.WORST
JOB_SLACK = timedelta(days=1)  # a cron job's occurrence fires within a day of being due
MS = timedelta(milliseconds=1)
Fire = dict[str, Any]


class MemoryFireHistory:
    def __init__(
        self,
        tasks: MemoryTaskStore,
        dead: MemoryDeadLetterStore,
        cron_logs: Sequence[list[dict[str, Any]]] = (),
    ) -> None:
        self.tasks, self.dead = tasks, dead
        self.cron_logs = cron_logs  # cron fire logs (the engine's, manual rows)

    async def read(self, window: Window) -> dict[str, Any]:
        fires = [f for f in self._fires() if _counted(f, window)]
        fires = sorted(fires, key=lambda f: f["fired_at"], reverse=True)[: window.cap]
        late = sorted(f["late_ms"] for f in fires)
        worst = sorted(
            (f for f in fires if f["late_ms"] >= window.abnormal_ms),
            key=lambda f: f["late_ms"],
            reverse=True,
        )
        return {
            "deliveries": len(fires),
            "oldest": min((f["fired_at"] for f in fires), default=None),
            "p50": percentile_cont(late, 0.5) if late else None,
            "p99": percentile_cont(late, 0.99) if late else None,
            "max": late[-1] if late else None,
            "buckets": _buckets(fires, window),
            "epochs": _epochs(fires),
            "worst": [_worst(f) for f in worst[:WORST]],
            "dead": None if window.job is not None else self._dead(window),
        }

    def _fires(self) -> Iterator[Fire]:
        """Every delivery of the fire logs with its kind and lateness."""
        logs = [(self.tasks.fire_log, "delayed"), *((log, "cron") for log in self.cron_logs)]
        for log, kind in logs:
            for f in log:
                late = max((f["fired_at"] - f["scheduled_for"]) / MS, 0.0)
                yield f | {"kind": f.get("kind", kind), "late_ms": late}

    def _dead(self, window: Window) -> dict[int, int]:
        failed = sorted(
            (r["last_failed"] for r in self.dead.held()),
            reverse=True,
        )
        counts: dict[int, int] = {}
        for at in [a for a in failed if window.since <= a < window.until][: window.cap]:
            i = _bucket(at, window)
            counts[i] = counts.get(i, 0) + 1
        return counts


def _counted(fire: Fire, window: Window) -> bool:
    fired: datetime = fire["fired_at"]
    due: datetime = fire["scheduled_for"]
    if not window.since <= fired < window.until or fire.get("manual", False):
        return False
    if window.job is None:
        return True
    mine = fire["kind"] == "cron" and fire["key"] == window.job
    return mine and window.since - JOB_SLACK <= due < window.until


def _bucket(at: datetime, window: Window) -> int:
    return math.floor((at - window.since).total_seconds() / window.bucket.total_seconds())


def _buckets(fires: list[Fire], window: Window) -> list[dict[str, Any]]:
    by: dict[int, list[float]] = {}
    for f in fires:
        by.setdefault(_bucket(f["fired_at"], window), []).append(f["late_ms"])
    shown = []
    for i, late in sorted(by.items()):
        late.sort()
        q = [_number(percentile_cont(late, 0.5)), _number(percentile_cont(late, 0.99))]
        shown.append({"i": i, "n": len(late), "q": q, "mx": _number(late[-1])})
    return shown


def _epochs(fires: list[Fire]) -> list[dict[str, Any]]:
    by: dict[int, list[Fire]] = {}
    for f in fires:
        by.setdefault(f["epoch"], []).append(f)
    return [
        {"epoch": epoch, "instance": min(f["instance"] for f in mine)}
        | {"first_at": _time(min(f["fired_at"] for f in mine))}
        | {"last_at": _time(max(f["fired_at"] for f in mine))}
        for epoch, mine in sorted(by.items())
    ]


def _worst(f: Fire) -> dict[str, Any]:
    shown = {c: f[c] for c in ("kind", "key", "subject")}
    shown |= {"scheduled_for": _time(f["scheduled_for"]), "fired_at": _time(f["fired_at"])}
    shown |= {c: f[c] for c in ("attempt", "epoch", "instance")}
    return shown | {"late_ms": _number(f["late_ms"])}


def _time(at: datetime) -> str:
    """A `timestamptz` as PostgreSQL's `to_json` writes it in UTC: the fraction's trailing
    zeros dropped (none without one), `+00:00`."""
    u = at.astimezone(UTC)
    text = f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}"
    fraction = f".{u.microsecond:06d}".rstrip("0") if u.microsecond else ""
    return f"{text}{fraction}+00:00"


def _number(value: float) -> float | int:
    """A float8 as it reads back from PostgreSQL's JSON: a whole number without a fraction."""
    return int(value) if value.is_integer() and abs(value) < 1e15 else value
