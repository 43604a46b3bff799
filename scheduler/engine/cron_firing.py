"""Cron jobs from YAML, fired by the leader through the same publisher as delayed tasks.

Each term: sync `schedules/*.yaml` into PostgreSQL, read the cursors, then loop: plan every
job (downtime policies in `engine.misfire`), publish what is due as a fresh `hanzo.mq.v1`
envelope with `Nats-Msg-Id` `<job>@<occurrence>`, and only after the acks advance the cursors in
one fenced statement (plus `fire_log` rows). A restart or failover in the middle of an occurrence
re-publishes it with the same id, which the target stream drops: never twice, never skipped.
Reload on SIGHUP or when a YAML file changes; a job removed from YAML stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduler.aio import first_of
from scheduler.backoff import backoff_seconds
from scheduler.bus.frames import kv_subject
from scheduler.clock import Clock, to_rfc3339
from scheduler.core import Advance, PubAck, PublishError
from scheduler.engine.misfire import ON_TIME, Plan, next_fire, plan
from scheduler.engine.office import Office
from scheduler.engine.ports import Broker, ScheduleRepository
from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.schedules import Concurrency, Job, load_dir, occurrence_key, schedule_files
from scheduler.settings import Settings

log = logging.getLogger("scheduler.cron")

RELOAD_CHECK = 2.0
MIRROR_EVERY = 0.9
# Publishing many jobs at one instant: hand the socket each batch of this many as it is built,
# so nats-server stores the first ones while the rest are still being framed.
FLUSH_EVERY = 50
# After a long idle sleep the first wake-up here often comes 10-30 ms late (the loop and the
# host are cold); waking this much before an occurrence and sleeping the short rest measured
# 10-15 ms closer to the instant with 1,000 jobs (bench/cron.py, per-second first arrivals).
PRE_WAKE = 0.03


class CronEngine:
    """Fires the YAML's cron jobs while this instance holds office."""

    def __init__(
        self,
        settings: Settings,
        store: ScheduleRepository,
        office: Office,
        clock: Clock,
        metrics: Metrics,
        js: Any = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.office = office
        self.clock = clock
        self.metrics = metrics
        self.js = js
        self.jobs: tuple[Job, ...] = ()
        self.errors: list[str] = []
        self.paused_by_operator: frozenset[str] = frozenset()  # applied at the last sync
        self.reload_requested = asyncio.Event()
        self._stamp: tuple[tuple[str, float], ...] = ()
        self._streams: dict[str, str | None] = {}
        # job -> (cursor it was computed from, next fire time): the tick's fast path
        self._upcoming: dict[str, tuple[datetime, datetime]] = {}
        # job -> that next occurrence's message, built while idle (see `Prepared`)
        self._prepared: dict[str, Prepared] = {}
        self._dirty: set[str] = set()
        self._mirroring: asyncio.Task[None] | None = None
        self._mirrored_at = float("-inf")
        self._publisher: Broker | None = None  # this term's, for messages framed ahead
        self._synced_at: datetime | None = None  # a new job's cursor starts here
        # job -> (publishes failed in a row, monotonic time before which it is not retried)
        self._failing: dict[str, tuple[int, float]] = {}

    def request_reload(self) -> None:
        """Ask for a YAML reload (SIGHUP)."""
        self.reload_requested.set()

    def _files_stamp(self) -> tuple[tuple[str, float], ...]:
        try:
            return tuple(
                (str(p), p.stat().st_mtime) for p in schedule_files(self.settings.schedules_dir)
            )
        except (NotADirectoryError, FileNotFoundError, OSError):
            return ()

    async def sync(self) -> None:
        """Load the YAML (keeping the valid jobs, logging the errors) and sync it to PostgreSQL."""
        self._stamp = self._files_stamp()
        loaded_jobs, self.errors = self._load()
        for error in self.errors:
            log.error("cron.yaml_error %s", error)
        synced_at = self.clock.now()
        changed, removed = await self.store.sync(loaded_jobs, synced_at)
        self._synced_at = synced_at
        self.paused_by_operator = await self.store.operator_paused()
        self.jobs = operator_paused(loaded_jobs, self.paused_by_operator)
        self._upcoming, self._prepared = {}, {}  # computed from the jobs as they were
        log.info(
            "cron.synced jobs=%d changed=%d removed=%d errors=%d",
            len(loaded_jobs),
            changed,
            removed,
            len(self.errors),
        )

    def _load(self) -> tuple[tuple[Job, ...], list[str]]:
        directory = Path(self.settings.schedules_dir)
        if not directory.is_dir():
            return (), [f"{directory}: not a directory"]
        loaded = load_dir(directory)
        return loaded.jobs, [str(e) for e in loaded.errors]

    async def run(self, epoch: int, publisher: Broker, stop: asyncio.Event) -> None:
        """Fire due occurrences until `stop` is set or office is lost."""
        self._publisher, self._prepared = publisher, {}
        try:
            await self._loop(epoch, publisher, stop)
        finally:
            if self._mirroring is not None:
                self._mirroring.cancel()
                await asyncio.gather(self._mirroring, return_exceptions=True)

    async def _loop(self, epoch: int, publisher: Broker, stop: asyncio.Event) -> None:
        await self.sync()
        cursors = await self.store.cursors()
        while not stop.is_set() and self.office.may_act():
            if self.reload_requested.is_set() or self._files_stamp() != self._stamp:
                self.reload_requested.clear()
                await self.sync()
            if not publisher.may_send():  # the link came back but is not revalidated yet
                await first_of(self.clock.sleep(0.05), stop.wait())
                continue
            try:
                await self.tick(epoch, publisher, cursors)
            except FencedError:
                depose = getattr(self.office, "depose", None)
                if depose is not None:
                    depose()
                return
            except Exception as exc:  # PostgreSQL or NATS trouble: cursors unchanged, retry soon
                log.warning("cron.tick_failed error=%r", exc)
                await self.clock.sleep(1.0)
                cursors = await self.store.cursors()
                continue
            await self._sleep_until_next(cursors, stop)

    async def tick(self, epoch: int, publisher: Broker, cursors: dict[str, datetime]) -> None:
        """Plan every job, publish what is due, then advance cursors in one statement.

        Jobs whose message was prepared while idle and whose occurrence is due on time are
        published first, straight from the prepared bytes; everything else is planned after."""
        now = self.clock.now()
        fired_at = to_rfc3339(now)
        early: list[tuple[Job, datetime, asyncio.Future[PubAck]]] = []
        framed: list[tuple[Job, datetime]] = []
        frames: list[tuple[str, str, bytes]] = []
        stamp = fired_at.encode()
        prepared = self._prepared
        for job in self.jobs:
            ready = prepared.get(job.name)
            if ready is None or ready.cursor != cursors.get(job.name):
                continue
            if ready.at <= now < ready.at + ON_TIME:
                if ready.frame_parts and ready.publisher is publisher:
                    framed.append((job, ready.at))
                    frames.append((job.subject, ready.reply, ready.frame(stamp)))
                    continue
                body, headers = ready.message(fired_at)
                early.append((job, ready.at, await publisher.publish(job.subject, body, headers)))
                if len(early) % FLUSH_EVERY == 0:
                    await asyncio.sleep(0)  # let the client write what is built so far
        if frames:
            futures = await publisher.publish_frames(frames)
            early += [(j, at, f) for (j, at), f in zip(framed, futures, strict=True)]
        self._prepared = {}
        done = {job.name for job, _, _ in early}
        firing: list[tuple[Job, datetime]] = []
        moves: dict[str, Advance] = {}
        for job in self.jobs:
            if job.name in done:
                moves[job.name] = Advance(job.name, job.subject, cursors[job.name])
                continue
            if self._backing_off(job.name):
                continue  # its target keeps failing: nothing is planned until the retry time
            cursor = cursors.get(job.name)
            if cursor is None:  # a new job starts from its sync (no back-fill, and no gap
                # between the sync that schedule_history records and this tick)
                cursor = min(self._synced_at or now, now)
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
            for occurrence in p.fire:
                firing.append((job, occurrence))
        results = await self._settle(early) + await self._fire(publisher, firing, now)
        self._outcomes(results, moves)
        if moves:
            await self.store.advance(epoch, list(moves.values()), self.settings.instance_id)
            for m in moves.values():
                cursors[m.name] = max(cursors.get(m.name, m.scheduled_for), m.scheduled_for)
            self._dirty.update(m.name for m in moves.values())
            if self._mirroring is None or self._mirroring.done():
                mirror = self._mirror(epoch, cursors, publisher)
                self._mirroring = asyncio.create_task(mirror, name="mirror")

    def _outcomes(
        self,
        results: list[tuple[Job, datetime, PubAck | PublishError | None]],
        moves: dict[str, Advance],
    ) -> None:
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
                moves[job.name] = move = Advance(
                    job.name,
                    job.subject,
                    max(occurrence, plan.scheduled_for),
                    self.clock.now(),
                    result.stream,
                    result.seq,
                    skipped=plan.skipped,
                )
                delivered[job.name] = (occurrence, move)
                continue
            failed.add(job.name)
            if job.name in delivered:  # up to the last delivered occurrence, not past it
                last, move = delivered[job.name]
                moves[job.name] = replace(move, scheduled_for=last)
            else:
                moves.pop(job.name, None)
            self._failed(job, result)
        for name in delivered.keys() - failed:
            self._failing.pop(name, None)
        self.metrics.cron_backing_off.set(len(self._failing))

    def _failed(self, job: Job, error: PublishError) -> None:
        """Back off: the job is not planned again before a jittered, doubling, capped wait."""
        failures = self._failing.get(job.name, (0, 0.0))[0] + 1
        wait = backoff_seconds(self.settings.backoff.total_seconds(), failures)
        self._failing[job.name] = (failures, self.clock.monotonic() + wait)
        self.metrics.cron_failures.inc()
        log.warning(
            "cron.publish_failed job=%s failures=%d retry_in=%.2fs error=%s",
            job.name,
            failures,
            wait,
            error,
        )

    def _backing_off(self, name: str) -> bool:
        failing = self._failing.get(name)
        return failing is not None and self.clock.monotonic() < failing[1]

    async def _fire(
        self, publisher: Broker, firing: list[tuple[Job, datetime]], now: datetime
    ) -> list[tuple[Job, datetime, PubAck | PublishError | None]]:
        sent: list[tuple[Job, datetime, asyncio.Future[PubAck] | None]] = []
        for job, occurrence in firing:
            if job.concurrency is Concurrency.FORBID and await self._busy(job):
                log.info("cron.skipped_busy job=%s occurrence=%s", job.name, occurrence.isoformat())
                self.metrics.cron_skipped.labels("busy").inc()
                sent.append((job, occurrence, None))
                continue
            body, headers = envelope(job, occurrence, now)
            sent.append((job, occurrence, await publisher.publish(job.subject, body, headers)))
        return await self._settle(sent)

    async def _settle(
        self, sent: Sequence[tuple[Job, datetime, asyncio.Future[PubAck] | None]]
    ) -> list[tuple[Job, datetime, PubAck | PublishError | None]]:
        """Await each publish: its PubAck, its PublishError, or None for a skipped occurrence."""
        out: list[tuple[Job, datetime, PubAck | PublishError | None]] = []
        for job, occurrence, fut in sent:
            result: PubAck | PublishError | None = None
            if fut is not None:
                try:
                    result = await fut
                    late = (self.clock.now() - occurrence).total_seconds()
                    self.metrics.fired.labels("cron").inc()
                    self.metrics.lateness.labels("cron").observe(max(late, 0.0))
                except PublishError as exc:  # logged with its backoff in `_failed`
                    result = exc
            out.append((job, occurrence, result))
        return out

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

    async def _mirror(self, epoch: int, cursors: dict[str, datetime], publisher: Broker) -> None:
        """Copy changed cursors to KV `scheduler_state` (`cron.<job>`) for standbys and
        dashboards, at most every MIRROR_EVERY seconds, started right after a tick's cursor
        write (so for jobs firing every second it runs mid-second, clear of the next tick). Each
        write is a publish to the bucket's `$KV.<bucket>.cron.<job>` subject through the
        pipelined publisher: a thousand jobs cost a few milliseconds, not a thousand requests."""
        if self.js is None:
            return
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
            subject = kv_subject(self.settings.state_bucket, f"cron.{name}")
            sent.append(await publisher.publish(subject, body, {}))
        for fut in sent:
            try:
                await fut
            except PublishError as exc:  # a convenience copy: PostgreSQL holds the cursor
                log.warning("cron.mirror_failed error=%s", exc)
                break

    async def _busy(self, job: Job) -> bool:
        """True while the job's subject still holds an unacknowledged message in its stream."""
        if self.js is None:
            return False
        try:
            if job.subject not in self._streams:
                self._streams[job.subject] = await self.js.find_stream_name_by_subject(job.subject)
            stream = self._streams[job.subject]
            info = await self.js.stream_info(stream, subjects_filter=job.subject)
        except Exception as exc:  # no stream or NATS trouble: do not block the job on a guess
            log.warning("cron.busy_check_failed job=%s error=%r", job.name, exc)
            return False
        return bool((info.state.subjects or {}).get(job.subject))

    async def _sleep_until_next(self, cursors: dict[str, datetime], stop: asyncio.Event) -> None:
        now = self.clock.now()
        self._upcoming = {}
        self._prepared = {}
        nexts = []
        for job in self.jobs:
            if job.paused:
                continue
            cursor = cursors.get(job.name, now)
            failing = self._failing.get(job.name)
            if failing is not None:  # backing off: wake at its retry time, not before
                retry = now + timedelta(seconds=max(failing[1] - self.clock.monotonic(), 0.0))
                nexts.append(max(next_fire(job, cursor), retry))
                continue
            at = next_fire(job, cursor)
            self._upcoming[job.name] = (cursor, at)
            nexts.append(at)
            if not job.jitter and job.concurrency is not Concurrency.FORBID and job.name in cursors:
                if (ready := Prepared.build(job, cursor, at, self._publisher)) is not None:
                    self._prepared[job.name] = ready
        now = self.clock.now()  # again: computing the next occurrences of many jobs takes time
        wait = min([RELOAD_CHECK, *[(n - now).total_seconds() for n in nexts]])
        if wait <= 0:
            return
        if wait > 2 * PRE_WAKE:  # wake a little early, then sleep the short rest
            await first_of(
                self.clock.sleep(wait - PRE_WAKE), self.reload_requested.wait(), stop.wait()
            )
            wait = min([RELOAD_CHECK, *[(n - self.clock.now()).total_seconds() for n in nexts]])
        await first_of(self.clock.sleep(wait), self.reload_requested.wait(), stop.wait())


_STAMP = datetime(1999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)  # never a real firing time
_STAMP_TEXT = to_rfc3339(_STAMP)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One job's next message, built while idle: only the firing time is filled in when due.

    Built by `envelope()` with a placeholder time that is then cut out, so it is byte for byte
    what `envelope()` would give at the firing time."""

    cursor: datetime
    at: datetime
    head: bytes
    tail: bytes
    headers: dict[str, str]
    # With a publisher: the whole wire frame, cut at the two places the firing time goes (the
    # body's `timestamp` and the `Mq-Fired-At` header; same length as the placeholder, so the
    # frame's sizes hold), for the reply subject reserved on that publisher.
    publisher: Broker | None = None
    reply: str = ""
    frame_parts: tuple[bytes, ...] = ()

    @classmethod
    def build(
        cls, job: Job, cursor: datetime, at: datetime, publisher: Broker | None = None
    ) -> Prepared | None:
        """None when the job's own data contains the placeholder (then it takes the slow path)."""
        body, headers = envelope(job, at, _STAMP)
        stamp = _STAMP_TEXT.encode()
        head, sep, tail = body.partition(stamp)
        if not sep or stamp in tail:
            return None
        if publisher is None:
            return cls(cursor, at, head, tail, headers)
        reply = publisher.reserve()
        parts = publisher.frame_parts(
            job.subject, body, reply, {**headers, "Mq-Fired-At": _STAMP_TEXT}, stamp
        )
        if len(parts) != 3:  # no raw framing, or the placeholder also sits in a header
            return cls(cursor, at, head, tail, headers)
        return cls(cursor, at, head, tail, headers, publisher, reply, parts)

    def message(self, fired_at: str) -> tuple[bytes, dict[str, str]]:
        return self.head + fired_at.encode() + self.tail, {**self.headers, "Mq-Fired-At": fired_at}

    def frame(self, fired_at: bytes) -> bytes:
        return fired_at.join(self.frame_parts)


def operator_paused(jobs: tuple[Job, ...], names: frozenset[str]) -> tuple[Job, ...]:
    """The jobs with those an operator paused (management API) marked paused."""
    return tuple(replace(j, paused=True) if j.name in names else j for j in jobs)


def envelope(job: Job, occurrence: datetime, now: datetime) -> tuple[bytes, dict[str, str]]:
    """The fresh `hanzo.mq.v1` envelope and headers of one occurrence."""
    key = occurrence_key(job.name, occurrence)
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": key,
        "type": job.type,
        "source": "scheduler",
        "timestamp": to_rfc3339(now),
        "priority": job.priority,
        "data": job.data,
    }
    if job.ttl_seconds is not None:
        doc["ttl_seconds"] = job.ttl_seconds
    headers = {
        "Nats-Msg-Id": key,
        "Mq-Scheduled-For": to_rfc3339(occurrence),
        "Mq-Fired-At": to_rfc3339(now),
        "Mq-Attempt": "1",
        "Mq-Schedule": job.name,
    }
    return json.dumps(doc, separators=(",", ":")).encode(), headers
