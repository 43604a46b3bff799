"""Which cron occurrences fire at a tick, and when to wake for the next ones. No I/O.

`scheduler.cron.misfire.plan` decides one job's occurrences from its cursor;
`OccurrencePlanner` applies it to every job at a tick and turns the result into cursor moves
(`Advance`) and occurrences to publish. While idle it computes each job's next occurrence ahead
(the tick's fast path), builds its message and has the term's broker prepare it
(`message.Prepared`), so that at the instant little is left to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from scheduler.cron.jobs import Concurrency, Job
from scheduler.cron.misfire import ON_TIME, Plan, next_fire, plan
from scheduler.engine.cron.message import Prepared
from scheduler.engine.ports import Broker
from scheduler.records import Advance

Moves = dict[str, Advance]  # job name -> its cursor move at this tick
Firing = list[tuple[Job, datetime]]  # (job, occurrence) to publish, oldest first per job


class OccurrencePlanner:
    """Plans ticks, and keeps what was computed ahead for the next one."""

    def __init__(self) -> None:
        # job -> (cursor it was computed from, next fire time): the tick's fast path
        self._upcoming: dict[str, tuple[datetime, datetime]] = {}
        # job -> that next occurrence's message, built while idle (see `Prepared`)
        self._prepared: dict[str, Prepared] = {}

    def forget(self) -> None:
        """Drop what was computed ahead (the jobs or this term's publisher changed)."""
        self._upcoming, self._prepared = {}, {}

    def take_prepared(
        self, jobs: Iterable[Job], cursors: Mapping[str, datetime], now: datetime
    ) -> list[tuple[Job, Prepared]]:
        """The prepared messages whose occurrence is due and on time at `now`, built from the
        cursor still in force; every prepared message is dropped (used, or stale)."""
        prepared, self._prepared = self._prepared, {}
        due = []
        for job in jobs:
            ready = prepared.get(job.name)
            if ready is None or ready.cursor != cursors.get(job.name):
                continue
            if ready.at <= now < ready.at + ON_TIME:
                due.append((job, ready))
        return due

    def plan_tick(
        self,
        jobs: Iterable[Job],
        cursors: Mapping[str, datetime],
        now: datetime,
        start: datetime,
        done: set[str],
        backing_off: Callable[[str], bool],
    ) -> tuple[Moves, Firing]:
        """The cursor moves and the occurrences to publish at `now`.

        `done`: jobs whose prepared occurrence is already out (their move is completed by its
        ack); `backing_off(name)`: jobs not planned before their retry time; a job without a
        cursor starts at `start` (its sync: no back-fill, and no gap between the sync that
        schedule_history records and this tick). A paused job's cursor moves past what it
        would have fired, counted as skipped."""
        moves: Moves = {}
        firing: Firing = []
        for job in jobs:
            if job.name in done:
                moves[job.name] = Advance(job.name, job.subject, cursors[job.name])
                continue
            if backing_off(job.name):
                continue  # its target keeps failing: nothing is planned until the retry time
            cursor = cursors.get(job.name)
            if cursor is None:
                cursor = start
                moves[job.name] = Advance(job.name, job.subject, cursor)
            p = self._plan(job, cursor, now)
            if job.paused:
                if p.cursor != cursor:
                    moves[job.name] = Advance(
                        job.name, job.subject, p.cursor, skipped=len(p.fire) + p.skipped
                    )
                continue
            if p.cursor != cursor:
                moves[job.name] = Advance(job.name, job.subject, p.cursor, skipped=p.skipped)
            firing.extend((job, occurrence) for occurrence in p.fire)
        return moves, firing

    def _plan(self, job: Job, cursor: datetime, now: datetime) -> Plan:
        """`plan()`, with a fast path for the common case computed while idle: exactly the
        occurrence we slept for is due and on time (no jitter, so nothing else can be due)."""
        upcoming = self._upcoming.get(job.name)
        if (
            upcoming is not None
            and upcoming[0] == cursor
            and not job.jitter
            and upcoming[1] <= now < upcoming[1] + ON_TIME
        ):
            return Plan((upcoming[1],), 0, upcoming[1])
        return plan(job, cursor, now)

    def ahead(
        self,
        jobs: Iterable[Job],
        cursors: Mapping[str, datetime],
        now: datetime,
        retry_at: Mapping[str, datetime],
        publisher: Broker | None,
    ) -> list[datetime]:
        """Each active job's next fire time (a backing-off job's not before `retry_at`), and,
        for the jobs whose next occurrence is plain, its fast path and prepared message."""
        self.forget()
        nexts = []
        for job in jobs:
            if job.paused:
                continue
            cursor = cursors.get(job.name, now)
            retry = retry_at.get(job.name)
            if retry is not None:  # backing off: wake at its retry time, not before
                nexts.append(max(next_fire(job, cursor), retry))
                continue
            at = next_fire(job, cursor)
            self._upcoming[job.name] = (cursor, at)
            nexts.append(at)
            if not job.jitter and job.concurrency is not Concurrency.FORBID and job.name in cursors:
                if (ready := Prepared.build(job, cursor, at, publisher)) is not None:
                    self._prepared[job.name] = ready
        return nexts
