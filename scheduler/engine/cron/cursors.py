"""Where each cron job stands after a tick: cursors moved from the acks, fenced, and mirrored.

A job's cursor advances to its last delivered occurrence, never past one whose publish failed;
a failing job backs off (jittered, doubling, capped) before it is planned again. A permanent
failure (a message that can never be published, such as one larger than the server's
`max_payload`) is not retried: the job is marked failed (`ScheduleRepository.fail`), logged once,
counted, and stops firing until its definition changes or an operator resumes it. The moves are
written in one statement fenced by the epoch (`ScheduleRepository.advance`: a deposed leader
records nothing), then copied to KV `scheduler_state` (`cron.<job>`) for standbys and dashboards.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from scheduler.backoff import backoff_seconds
from scheduler.clock import Clock, to_rfc3339
from scheduler.cron.jobs import Job
from scheduler.engine.cron.events import CronEvents
from scheduler.engine.cron.message import failure_text
from scheduler.engine.ports import Broker, ScheduleRepository
from scheduler.records import Advance, CronFailure, PubAck, PublishError
from scheduler.settings import Settings

log = logging.getLogger(__name__)

MIRROR_EVERY = 0.9

Result = tuple[Job, datetime, PubAck | PublishError | None]  # None: skipped (forbid)


def _delivery(
    delivered: tuple[datetime, Advance],
) -> tuple[datetime, datetime, str | None, int | None]:
    """An occurrence delivered earlier in the tick, as `Advance.earlier` keeps it (its own
    occurrence, not the cursor's)."""
    occurrence, move = delivered
    assert move.fired_at is not None
    return (occurrence, move.fired_at, move.stream, move.stream_seq)


class CursorBook:
    """The cursor bookkeeping of one leader: `fold` a tick's outcomes, `record` the moves,
    and which jobs are `backing_off`. With `mirror`, recorded cursors are copied to KV."""

    def __init__(
        self,
        settings: Settings,
        store: ScheduleRepository,
        clock: Clock,
        events: CronEvents,
        mirror: bool = True,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self._events = events
        self.mirror = mirror
        # job -> (publishes failed in a row, monotonic time before which it is not retried)
        self._failing: dict[str, tuple[int, float]] = {}
        # jobs whose publish failed for good this tick, recorded (and stopped) by `record`
        self._stopping: list[tuple[Job, datetime, PublishError]] = []
        self._dirty: set[str] = set()
        self._mirroring: asyncio.Task[None] | None = None
        self._mirrored_at = float("-inf")

    def backing_off(self, name: str) -> bool:
        """True while the job's retry time has not come."""
        failing = self._failing.get(name)
        return failing is not None and self.clock.monotonic() < failing[1]

    def retry_times(self, now: datetime) -> dict[str, datetime]:
        """Each failing job's retry time, on the wall clock of `now`."""
        mono = self.clock.monotonic()
        return {
            name: now + timedelta(seconds=max(until - mono, 0.0))
            for name, (_, until) in self._failing.items()
        }

    def fold(self, results: Sequence[Result], moves: dict[str, Advance]) -> None:
        """Fold publish outcomes (oldest occurrence first per job) into the cursor moves.

        A job's cursor advances to its last delivered occurrence before the first one that
        failed, never past a failure: the failed occurrence and everything after it are
        published again after the job's backoff (the later ones with the same ids, dropped by
        the target stream's duplicate window)."""
        delivered: dict[str, tuple[datetime, Advance]] = {}  # job -> last occurrence, move
        failed: set[str] = set()
        for job, occurrence, result in results:
            if job.name in failed or result is None:
                continue
            if isinstance(result, PubAck):
                plan = moves[job.name]
                before = delivered.get(job.name)
                earlier = (*before[1].earlier, _delivery(before)) if before else ()
                moves[job.name] = move = Advance(
                    job.name,
                    job.subject,
                    max(occurrence, plan.scheduled_for),
                    self.clock.now(),
                    result.stream,
                    result.seq,
                    skipped=plan.skipped,
                    earlier=earlier,
                )
                delivered[job.name] = (occurrence, move)
                continue
            failed.add(job.name)
            if job.name in delivered:  # up to the last delivered occurrence, not past it
                last, move = delivered[job.name]
                moves[job.name] = replace(move, scheduled_for=last)
            else:
                moves.pop(job.name, None)
            if result.permanent:  # never worth a retry: stopped by `record`
                self._failing.pop(job.name, None)
                self._stopping.append((job, occurrence, result))
            else:
                self._failed(job, result)
        for name in delivered.keys() - failed:
            self._failing.pop(name, None)
        self._events.cron_backoff_count(len(self._failing))

    def _failed(self, job: Job, error: PublishError) -> None:
        """Back off: the job is not planned again before a jittered, doubling, capped wait."""
        failures = self._failing.get(job.name, (0, 0.0))[0] + 1
        wait = backoff_seconds(self.settings.backoff.total_seconds(), failures)
        self._failing[job.name] = (failures, self.clock.monotonic() + wait)
        self._events.cron_publish_failed()
        log.warning(
            "cron.publish_failed job=%s failures=%d retry_in=%.2fs error=%s",
            job.name,
            failures,
            wait,
            error,
        )

    async def record(
        self,
        epoch: int,
        moves: dict[str, Advance],
        cursors: dict[str, datetime],
        publisher: Broker,
    ) -> frozenset[str]:
        """Write the failures and the moves (fenced: FencedError once a newer epoch exists),
        update `cursors`, and start a mirror of the changed ones unless one is running. Returns
        the jobs marked failed: the caller stops firing them."""
        stopped = await self._stop(epoch, publisher)
        if not moves:
            return stopped
        await self.store.advance(epoch, list(moves.values()), self.settings.instance_id)
        for m in moves.values():
            cursors[m.name] = max(cursors.get(m.name, m.scheduled_for), m.scheduled_for)
        if not self.mirror:
            return stopped
        self._dirty.update(m.name for m in moves.values())
        if self._mirroring is None or self._mirroring.done():
            mirror = self._mirror(epoch, cursors, publisher)
            self._mirroring = asyncio.create_task(mirror, name="mirror")
        return stopped

    async def _stop(self, epoch: int, publisher: Broker) -> frozenset[str]:
        """Mark the jobs whose publish failed for good as failed, log each once, count them."""
        stopping, self._stopping = self._stopping, []
        if not stopping:
            return frozenset()
        now = self.clock.now()
        failures = [
            CronFailure(
                job.name,
                job.fingerprint(),
                error.reason,
                failure_text(job, occurrence, error, publisher.max_payload),
                now,
                occurrence,
            )
            for job, occurrence, error in stopping
        ]
        await self.store.fail(epoch, failures)
        for f in failures:
            self._events.cron_job_stopped(f.reason)
            log.error(
                "cron.job_failed job=%s occurrence=%s reason=%s error=%r (not retried: it "
                "fires again once its definition changes or an operator resumes it)",
                f.name,
                to_rfc3339(f.scheduled_for),
                f.reason,
                f.error,
            )
        return frozenset(f.name for f in failures)

    async def close(self) -> None:
        """Stop a mirror in progress (the term ended)."""
        if self._mirroring is not None:
            self._mirroring.cancel()
            await asyncio.gather(self._mirroring, return_exceptions=True)

    async def _mirror(self, epoch: int, cursors: dict[str, datetime], publisher: Broker) -> None:
        """Copy changed cursors to KV at most every MIRROR_EVERY seconds, started right after a
        tick's cursor write (so for jobs firing every second it runs mid-second, clear of the
        next tick). Each write is a publish through the pipelined publisher (`Broker.kv_put`):
        a thousand jobs cost a few milliseconds, not a thousand requests."""
        wait = self._mirrored_at + MIRROR_EVERY - self.clock.monotonic()
        if wait > 0:
            await self.clock.sleep(wait)
        self._mirrored_at = self.clock.monotonic()
        names, self._dirty = self._dirty, set()
        sent = []
        for name in names:
            if name not in cursors:
                continue
            doc = {
                "last_scheduled_for": to_rfc3339(cursors[name]),
                "epoch": epoch,
                "instance": self.settings.instance_id,
            }
            body = json.dumps(doc).encode()
            sent.append(await publisher.kv_put(self.settings.state_bucket, f"cron.{name}", body))
        for fut in sent:
            try:
                await fut
            except PublishError as exc:  # a convenience copy: PostgreSQL holds the cursor
                log.warning("cron.mirror_failed error=%s", exc)
                break
