"""Backfill: fire a cron job's occurrences over a past window, each once.

The occurrences are the daemon's own (`scheduler.cron.expression.occurrences_between`, in the job's
time
zone, DST rules included) in `[from, to)`; `to` may not lie in the future and a window may hold
at most `MAX_BACKFILL` occurrences (past it: 422 naming the bound). Each is published as the
cron envelope of that occurrence (`Mq-Scheduled-For` the occurrence, `Mq-Manual` and
`Mq-Backfill: true`) with its own `Nats-Msg-Id` `<job>@backfill-<occurrence>`, so a retry
inside the stream's duplicate window is dropped there; what makes it once for good is
`backfill_fires` in PostgreSQL (`scheduler.store.postgres.backfill`): an occurrence a backfill
already
fired is not published again (`already_fired`), nor one another backfill is publishing now
(`in_flight`).
Each publish writes a `fire_log` row marked manual whose `scheduled_for` is the occurrence:
the drift audit counts it under `manual`, never as doubled, early or late.

Like a manual trigger it publishes from the instance that received it, leader or standby,
on its own: one message at a time, at most `RATE` per second, one backfill per instance at a
time, so it never holds up the leader's firing. A `forbid` job is refused while its subject
still holds a message (its previous run), as the leader's firing checks before each run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from typing import Any

from scheduler.clock import Clock, rfc3339
from scheduler.cron.expression import occurrences_between
from scheduler.cron.jobs import Concurrency, Job
from scheduler.engine.cron.message import envelope
from scheduler.errors import RequestError
from scheduler.messages.headers import block_size
from scheduler.operations import Outcome
from scheduler.operations.backlog import TRANSIENT, WriteBacklog
from scheduler.operations.ports import PUBLISH_TIMEOUT, BusWriter, NoAnswer, NoStream, Refused
from scheduler.operations.stores import BackfillLog
from scheduler.settings import Settings

log = logging.getLogger(__name__)

MAX_BACKFILL = 1000  # occurrences per backfill (docs/operations.md)
RATE = 500  # publishes per second, at most
PACE_EVERY = 50  # publishes between two pauses of PACE_EVERY / RATE seconds
STALE = timedelta(seconds=60)  # an unconfirmed claim older than this may be taken again
CONFIRM_TIMEOUT = 2.0
HEADER_RESERVE = 4096  # as for every delivery: room for the headers the daemon adds


@dataclass(slots=True)
class Run:
    """One backfill's progress: what was published and what was not."""

    items: list[dict[str, Any]] = field(default_factory=list)
    fired: int = 0


class Backfiller:
    def __init__(
        self,
        bus: BusWriter,
        settings: Settings,
        store: BackfillLog,
        clock: Clock,
        backlog: WriteBacklog,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.store = store
        self.clock = clock
        self.backlog = backlog
        self._busy = asyncio.Lock()

    def window(self, job: Job, start: datetime, end: datetime) -> list[datetime]:
        """The occurrences of `job` in `[start, end)`; RequestError (422) naming the field when
        the window is empty, reaches the future or holds more than MAX_BACKFILL."""
        if start >= end:
            raise RequestError("validation", "from: must be before `to`", "from")
        now = self.clock.now()
        if end > now:
            detail = f"to: {rfc3339(end)} is in the future (now {rfc3339(now)}); backfill past time"
            raise RequestError("validation", detail, "to")
        found = list(
            islice(occurrences_between(job.cron, start, end, job.timezone), MAX_BACKFILL + 1)
        )
        if len(found) > MAX_BACKFILL:
            detail = (
                f"to: the window holds more than {MAX_BACKFILL} occurrences of {job.name!r}, the "
                "bound of one backfill; split it into smaller windows"
            )
            raise RequestError("too_many_occurrences", detail, "to")
        return found

    async def plan(self, job: Job, found: list[datetime]) -> Outcome:
        """What a backfill of `found` would do, firing nothing."""
        done = await self.store.fired(job.name, found)
        items = [_item(job, at, "already_fired" if at in done else "planned") for at in found]
        return _outcome("planned", job, found, Run(items), len(done))

    async def fire(self, job: Job, found: list[datetime]) -> Outcome:
        """Publish the occurrences of `found` no backfill fired yet, each once."""
        if job.concurrency is Concurrency.FORBID and await self._held(job.subject):
            detail = (
                f"job {job.name!r} is concurrency: forbid and {job.subject} still holds its "
                "previous run; backfill once a worker has taken it"
            )
            return Outcome("previous_run_held", job.name, detail)
        if self._busy.locked():
            detail = "another backfill runs on this instance; retry when it is done"
            return Outcome("backfill_running", job.name, detail)
        async with self._busy:
            return await self._fire(job, found)

    async def _fire(self, job: Job, found: list[datetime]) -> Outcome:
        now = self.clock.now()
        ids = [msg_id(job.name, at) for at in found]
        mine = await self.store.claim(
            job.name, found, ids, self.settings.instance_id, now, now - STALE
        )
        others = [at for at in found if at not in mine]
        done = await self.store.fired(job.name, others) if others else set()
        run = Run([_item(job, at, "already_fired" if at in done else "in_flight") for at in others])
        problem = await self._publish(job, [at for at in found if at in mine], run)
        run.items.sort(key=lambda item: item["scheduled_for"])
        if problem is not None:
            return Outcome(problem.status, job.name, problem.detail, {"fired": run.fired})
        return _outcome("backfilled", job, found, run, len(done))

    async def _publish(self, job: Job, todo: list[datetime], run: Run) -> Outcome | None:
        """Publish the claimed `todo` in order, paced; on a refusal give back the claims not
        published (an unanswered publish keeps its own: it may have been stored)."""
        for i, at in enumerate(todo):
            problem = await self._one(job, at, run)
            if problem is not None:
                kept = 1 if problem.status == "publish_failed" else 0  # in doubt: keep its claim
                await self._release(job.name, todo[i + kept :])
                return problem
            if (i + 1) % PACE_EVERY == 0:
                await asyncio.sleep(PACE_EVERY / RATE)  # real seconds: a bound on wire load
        return None

    async def _one(self, job: Job, at: datetime, run: Run) -> Outcome | None:
        """Publish one occurrence and confirm it; an Outcome says why the backfill stops."""
        body, headers = backfill_message(job, at, self.clock.now())
        if (
            len(job.subject) + block_size(headers) + len(body)
            > self.bus.max_payload - HEADER_RESERVE
        ):
            detail = f"data: the envelope of {job.name!r} does not fit max_payload"
            return Outcome("too_large", job.name, detail)
        try:
            ack = await self.bus.store(job.subject, body, headers, PUBLISH_TIMEOUT)
        except NoStream:
            detail = f"no stream captures {job.subject}: create one, then backfill again"
            return Outcome("no_stream", job.name, detail)
        except Refused as exc:
            return Outcome("publish_refused", job.name, f"{job.subject} refused it: {exc}")
        except NoAnswer as exc:
            detail = (
                f"publishing {headers['Nats-Msg-Id']} got no answer ({exc}): it "
                "may have been delivered; the same backfill after a minute publishes it again "
                "under the same message id"
            )
            return Outcome("publish_failed", job.name, detail)
        await self._confirm(job, at, ack.stream, ack.seq)
        run.items.append(_item(job, at, "fired", ack.stream, ack.seq))
        run.fired += 1
        return None

    async def _confirm(self, job: Job, at: datetime, stream: str, seq: int) -> None:
        write = functools.partial(
            self.store.confirm,
            job.name,
            job.subject,
            at,
            self.clock.now(),
            stream,
            seq,
            self.settings.instance_id,
        )
        try:
            async with asyncio.timeout(CONFIRM_TIMEOUT):
                await write()
            return
        except TRANSIENT as exc:
            log.warning("schedule.backfill_confirm_deferred job=%s error=%r", job.name, exc)
        self.backlog.add(f"backfill_fires confirm job={job.name} at={rfc3339(at)}", write)

    async def _release(self, name: str, occurrences: list[datetime]) -> None:
        if not occurrences:
            return
        try:
            await self.store.release(name, occurrences)
        except TRANSIENT as exc:  # the claims lapse by themselves after STALE
            log.warning("schedule.backfill_release_failed job=%s error=%r", name, exc)

    async def _held(self, subject: str) -> bool:
        """Whether the stream capturing `subject` still holds a message on it (as the leader's
        `forbid` check asks); unknown (no stream, NATS trouble) counts as not held."""
        return (await self.bus.held(subject) or 0) > 0


def msg_id(job: str, at: datetime) -> str:
    """A backfilled occurrence's `Nats-Msg-Id` (and envelope id): `<job>@backfill-<at>`."""
    return f"{job}@backfill-{rfc3339(at)}"


def backfill_message(job: Job, at: datetime, now: datetime) -> tuple[bytes, dict[str, str]]:
    """The cron envelope of occurrence `at`, fired at `now`, under the backfill id."""
    body, headers = envelope(job, at, now)
    doc = json.loads(body)
    doc["id"] = key = msg_id(job.name, at)
    headers = {**headers, "Nats-Msg-Id": key, "Mq-Manual": "true", "Mq-Backfill": "true"}
    return json.dumps(doc, separators=(",", ":")).encode(), headers


def _item(
    job: Job, at: datetime, status: str, stream: str | None = None, seq: int | None = None
) -> dict[str, Any]:
    item = {"scheduled_for": at, "msg_id": msg_id(job.name, at), "status": status}
    return item | ({"stream": stream, "seq": seq} if stream is not None else {})


def _outcome(status: str, job: Job, found: list[datetime], run: Run, already: int) -> Outcome:
    data = {
        "occurrences": len(found),
        "fired": run.fired,
        "already_fired": already,
        "in_flight": sum(item["status"] == "in_flight" for item in run.items),
        "items": run.items,
    }
    return Outcome(status, job.name, data=data)
