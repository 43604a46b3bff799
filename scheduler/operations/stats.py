"""Statistics for operators and the gauges only PostgreSQL and NATS can answer.

`StatsOperations.stats()` is `GET /v1/stats`: pending tasks by subject, what falls due in the
next minutes, recent lateness, unresolved dead letters and leadership, all read from PostgreSQL
so a standby answers too. Counting every pending task is the costly part (a `GROUP BY` over all
of them), so the figures are read once and shared by every caller for `max_age` seconds
(`SCHEDULER_FORECAST_INTERVAL`, or ten times as long as the last read took when that is longer):
however many clients and console tabs poll, one read runs at a time and at most one per
interval; the answer's `at` says when its figures were read.

The leader's gauges from PostgreSQL and the application of operator pauses are the engine's
(`scheduler.daemon.refresher.Refresher`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from scheduler.clock import Clock
from scheduler.operations.history import HealthCheck, HistoryReads
from scheduler.operations.records import Lateness, LeaseHolder, Stats, SubjectCount
from scheduler.operations.shared import SharedRead
from scheduler.operations.stores import WINDOWS, DatabaseTime, DeadLetters, FireHistory, Statistics

log = logging.getLogger(__name__)

OTHER = "other"
LATENESS_WINDOW = timedelta(minutes=5)


MAX_TOP = 100  # the most subjects `/v1/stats?top=` may name


@dataclass(frozen=True, slots=True)
class Figures:
    """What PostgreSQL answered for one round of `/v1/stats`, shared between callers."""

    at: datetime
    pending: int
    by_subject: list[tuple[str, int]]  # the MAX_TOP subjects with most pending tasks
    due: dict[str, int]
    lateness: tuple[int, float | None, float | None]
    dead_letters_unresolved: int
    leadership: dict[str, Any]


class StatsOperations:
    def __init__(
        self,
        overview: Statistics,
        dead_letters: DeadLetters,
        history: FireHistory,
        database_time: DatabaseTime,
        clock: Clock,
        lease: Callable[[], Awaitable[dict[str, Any]]],
        max_age: float = 5.0,
    ) -> None:
        self.overview = overview
        self.dead_letters = dead_letters
        self.clock = clock
        self.lease = lease
        self.shared: SharedRead[Figures] = SharedRead(clock, max_age)
        self.history = HistoryReads(history, overview, clock)
        self.health = HealthCheck(database_time, clock)

    async def figures(self) -> Figures:
        """One round of reads (see the module doc for how rounds are shared)."""
        now = self.clock.now()
        pending, by_subject = await self.overview.pending_by_subject(MAX_TOP)
        due = await self.overview.forecast(now)
        return Figures(
            at=now,
            pending=pending,
            by_subject=by_subject,
            due={label: sum(c[i] for c in due.values()) for i, (label, _) in enumerate(WINDOWS)},
            lateness=await self.overview.lateness(now - LATENESS_WINDOW),
            dead_letters_unresolved=await self.dead_letters.unresolved(),
            leadership=await self.overview.leadership(),
        )

    async def stats(self, top: int) -> Stats:
        f = await self.shared.get(self.figures)
        leadership = f.leadership
        lease = await self.lease()
        by_subject = f.by_subject[:top]
        others = f.pending - sum(n for _, n in by_subject)
        subjects = [SubjectCount(subject=s, pending=n) for s, n in by_subject]
        if others:
            subjects.append(SubjectCount(subject=OTHER, pending=others))
        samples, p50, p99 = f.lateness
        return Stats(
            at=f.at,
            pending=f.pending,
            pending_by_subject=subjects,
            due=dict(f.due),
            lateness_ms=Lateness(
                window_seconds=int(LATENESS_WINDOW.total_seconds()),
                samples=samples,
                p50=p50,
                p99=p99,
            ),
            dead_letters_unresolved=f.dead_letters_unresolved,
            leader=LeaseHolder(
                instance=lease.get("instance"),
                epoch=lease.get("epoch"),
                since=lease.get("since"),
            ),
            epoch=leadership["epoch"],
            epoch_taken_by=leadership["instance"],
            epoch_taken_at=leadership["since"],
            instance=lease.get("self", {}),
        )
