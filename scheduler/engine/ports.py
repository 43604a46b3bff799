"""The engine's two ports: what it needs from PostgreSQL and from NATS, documented once here.

The engine (`scheduler.engine`) never imports nats-py, asyncpg or SQLAlchemy (import-linter
checks it: pyproject.toml, tests/unit/test_layers.py). It speaks to

- a `TaskRepository` (delayed tasks) and a `ScheduleRepository` (cron state): every SQL
  statement it needs, written once in `scheduler.store.postgres` (`tasks.TaskStore`,
  `cron_jobs.ScheduleStore`; the fencing SQL in `epoch`);
- a `Broker`: what the engine sends, in its own terms (claimed tasks, a message prepared ahead
  for its firing time, a single message, a KV key, acks) behind the fence of the term; every
  NATS byte (headers, frames, reply subjects, KV subjects) lives in the adapters,
  `scheduler.bus.nats.publisher.Publisher` (the wire path) and
  `scheduler.bus.nats.plain.PlainPublisher` (nats-py's public API; `SCHEDULER_PUBLISH_PATH`),
  and the twin `scheduler.bus.memory.MemoryBroker`;
- a `Bus` that opens one broker per term and answers the JetStream questions the engine asks
  (`scheduler.bus.nats.connection.NatsBus`, twin `scheduler.bus.memory.MemoryBus`), and the
  delay lane's `Source` of `Delivery`s (`scheduler.bus.nats.puller.Puller`, whose messages are
  `nats.aio.msg.Msg` or `scheduler.bus.nats.wire.RawMsg`).

Each port has a contract suite run over every implementation, the twins and the real servers
(tests/contracts/), and tests/contracts/conformance.py holds each to its port under mypy.

Contract common to every state-changing repository method taking an `epoch`: it runs fenced.
It commits only while `epoch` is the current fencing epoch, and raises `FencedError` otherwise
(a newer leader has taken office: the caller stops acting). Once a newer epoch has been taken,
no write fenced by an older one can commit any more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from scheduler.messages.prepared import PreparedMessage, StampedMessage
from scheduler.records import (
    Advance,
    Claimed,
    ClaimedTask,
    CronFailure,
    Done,
    Fired,
    Insertion,
    Key,
    NewTask,
    PubAck,
    TaskRef,
)


class TaskRepository(Protocol):
    """Delayed tasks at rest: stored at intake, read in firing order, claimed, booked.

    Statuses: `pending` (waiting), `in_doubt` (published, ack never came: due again after a
    backoff and republished with the same `Nats-Msg-Id`), `claimed` (by a leader's epoch, being
    published), then one of `fired`, `expired`, `dead`, `cancelled`. A fired task's row is
    deleted; a tombstone keeps its id refused at intake (as `resent` or `taken`, as for a
    stored task) and answers `get`, cancel and reschedule. Firing order is (due time,
    priority, intake sequence). A claim takes only tasks due within a minute of the store's
    clock (the engine asks a fraction of a second ahead)."""

    async def insert_batch(self, tasks: Sequence[NewTask]) -> Insertion:
        """Store new tasks (idempotent by id: the same id with the same target and bytes is
        `resent`, with others `taken`; a row the database refuses is `refused`, the rest
        stored) and return what became of each."""
        ...

    async def record_bad_intake(self, rows: Sequence[dict[str, Any]]) -> None:
        """Keep a row per refused intake message (dead letters), once per lane message."""
        ...

    async def load_page(
        self, after: Key, until: datetime, limit: int, partitions: Collection[int] | None = None
    ) -> list[TaskRef]:
        """Up to `limit` ready tasks due by `until` after key `after`, in firing order: of
        the office's partitions, or of `partitions` when given (a term's gain read back)."""
        ...

    async def overdue(self, before: datetime, limit: int) -> list[TaskRef]:
        """Ready tasks due before `before` (the sweep for tasks the horizon missed)."""
        ...

    async def claim_within(
        self, epoch: int, ids: Sequence[str], until: datetime, budget: int
    ) -> Claimed:
        """Fenced: claim those of `ids` still ready and due by `until`; payloads up to
        `budget` bytes in all (the rest `parked`, claimed without their payload)."""
        ...

    async def load_claimed(self, epoch: int, ids: Sequence[str], budget: int) -> Claimed:
        """The payloads of parked tasks still claimed by `epoch`, up to `budget` bytes."""
        ...

    async def reclaim_orphans(
        self,
        epoch: int,
        stale: timedelta | None = None,
        limit: int = 1000,
        budget: int = 2**62,
        partitions: Collection[int] | None = None,
    ) -> Claimed:
        """Fenced: take over tasks claimed by earlier epochs (or claimed longer than `stale`)
        and never booked, a page at a time, to publish them again; those of the office's
        partitions, or of `partitions` when given (a term that gives some back)."""
        ...

    async def current_epoch(self) -> int:
        """The fencing epoch now in force."""
        ...

    async def mark_fired(self, epoch: int, fired: Sequence[Fired], instance: str) -> None:
        """Fenced, idempotent: claimed tasks' rows are deleted, each leaving a tombstone
        (status `fired`) and one fire-log row."""
        ...

    async def retry_later(
        self, epoch: int, items: Sequence[tuple[ClaimedTask, datetime, str, bool]]
    ) -> None:
        """Fenced: (task, due again at, error, in doubt) back to `pending` or `in_doubt`."""
        ...

    async def expire(self, epoch: int, ids: Sequence[str]) -> None:
        """Fenced: claimed tasks past their `expires_at` become `expired`."""
        ...

    async def kill(self, epoch: int, items: Sequence[tuple[ClaimedTask, str, str]]) -> None:
        """Fenced: (task, reason, error) become `dead`, with a dead-letter row each."""
        ...

    async def analyze_if_stale(self) -> bool:
        """Refresh the planner's statistics after a burst; whether it did."""
        ...

    async def pending_count(self) -> int:
        """How many tasks are ready (pending or in doubt)."""
        ...

    async def pending_by_org(self) -> dict[str | None, int]:
        """Unfinished tasks (pending, in doubt or claimed) per `org_id` (None: no org)."""
        ...


class ScheduleRepository(Protocol):
    """Cron jobs' state at rest: the YAML's jobs, their cursors and the fire log."""

    async def sync(self, jobs: Sequence[Any], at: datetime | None = None) -> tuple[int, int]:
        """Upsert the YAML's jobs, deactivate the rest; (changed, removed)."""
        ...

    async def operator_paused(self) -> frozenset[str]:
        """Names of the jobs an operator paused."""
        ...

    async def cursors(self) -> dict[str, datetime]:
        """Each job's last scheduled occurrence."""
        ...

    async def advance(self, epoch: int, moves: Sequence[Advance], instance: str) -> None:
        """Fenced, idempotent: move cursors and log the deliveries in one statement."""
        ...

    async def fail(self, epoch: int, failures: Sequence[CronFailure]) -> None:
        """Fenced: mark jobs failed (stopped) with their error, each only while its stored
        definition still has the failure's fingerprint. A sync that changes a job's definition
        (or re-adds it), and an operator's resume, clear the mark."""
        ...

    async def failed(self) -> frozenset[str]:
        """Names of the active jobs marked failed (they do not fire)."""
        ...


class Broker(Protocol):
    """One term's JetStream publisher (the leader's, discarded when office ends).

    Every message carries `Nats-Msg-Id`: a republish within the target stream's duplicate
    window is stored once (the PubAck says `duplicate`). Nothing is sent once `may_send()` is
    false (office ended, or the link dropped and the epoch is not revalidated yet); what was
    handed over but not yet written is taken back then. An outcome is a `PubAck`, or a
    `PublishError` that says whether the message may be stored all the same (`in_doubt`), or
    that it can never be stored (`permanent`, reason `too_large`: over `max_payload`). The
    NATS bytes (headers, frames, replies, KV subjects) are the adapter's: the engine hands
    over tasks, messages and keys."""

    timeout: float  # seconds an ack is waited for

    @property
    def max_payload(self) -> int:
        """The server's largest message, control line and headers included."""
        ...

    def may_send(self) -> bool:
        """True while a publish may leave now."""
        ...

    def refusal(self) -> str | None:
        """Why nothing may be sent now, or None."""
        ...

    def release(self) -> None:
        """Allow sending again after a reconnect, once the owner revalidated its epoch."""
        ...

    def on_link_lost(self) -> None:
        """The connection dropped: hold every send, take back what is unsent."""
        ...

    def on_office_lost(self) -> None:
        """Office ended: nothing handed over but unsent may go out any more."""
        ...

    async def publish(
        self, subject: str, payload: bytes, headers: Mapping[str, str]
    ) -> asyncio.Future[PubAck]:
        """Send one message (its `headers` carry its `Nats-Msg-Id`); the future gives its
        PubAck or raises PublishError."""
        ...

    async def publish_tasks(
        self, tasks: Sequence[ClaimedTask], done: Sequence[Done], fired_at: datetime
    ) -> None:
        """Deliver claimed tasks to their targets, all at once, each with its delivery headers
        (docs/producers.md, "What arrives at the target": the producer's, then `Nats-Msg-Id` =
        the task id, `Mq-Scheduled-For`, `Mq-Fired-At` = `fired_at`, `Mq-Attempt`); `done[i]`
        gets task i's outcome exactly once. The engine's firing path: the broker builds every
        byte."""
        ...

    def prepare(self, message: StampedMessage) -> PreparedMessage:
        """`message` made ready ahead of its firing time (while idle), so that sending it at
        the instant costs as little as this broker can make it."""
        ...

    async def publish_prepared(
        self, messages: Sequence[PreparedMessage], fired_at: datetime
    ) -> list[asyncio.Future[PubAck]]:
        """Send prepared messages fired at `fired_at`, all at once; a future per message, in
        order, as `publish` gives. Each arrives exactly as `publish` of
        `message.at(to_rfc3339(fired_at))` would have sent it."""
        ...

    async def kv_put(self, bucket: str, key: str, value: bytes) -> asyncio.Future[PubAck]:
        """Write `key` of KV bucket `bucket` as a publish through this broker (pipelined and
        fenced like any message); the future gives the bucket stream's PubAck."""
        ...

    async def ack(self, replies: Iterable[str]) -> None:
        """Acknowledge JetStream deliveries by their reply subjects."""
        ...

    async def close(self) -> None:
        """Fail what is unacknowledged (in doubt) and stop listening for acks; nothing is
        sent afterwards."""
        ...


class Delivery(Protocol):
    """A message taken from the delay lane (a JetStream delivery)."""

    subject: str
    reply: str
    data: bytes
    headers: dict[str, str] | None

    @property
    def metadata(self) -> Any:
        """JetStream's delivery metadata, as nats-py names it: `stream`, `sequence.stream`
        (the lane's sequence), `num_delivered` and `timestamp` (when the lane stored it)."""
        ...

    async def in_progress(self) -> None:
        """Ask for more time before redelivery."""
        ...

    async def term(self) -> None:
        """Refuse the message for good (never redelivered)."""
        ...


class Source(Protocol):
    """The delay lane's durable consumer, pulled in batches."""

    async def start(self) -> Any:
        """Subscribe and ask for the first batch."""
        ...

    async def take(
        self, timeout: float, linger: float = 0.002, limit: int | None = None
    ) -> Sequence[Delivery]:
        """The next deliveries, at most a batch (and at most `limit`): wait up to `timeout` s
        for one, then gather more until the oldest has waited `linger` s (or that many are
        in). Those past `limit` stay for the next `take`, in order."""
        ...

    def interrupt(self) -> None:
        """Wake a `take` in progress (stopping)."""
        ...

    def reread(self) -> None:
        """Read back, once and soon, what the consumer handed out and nobody acknowledged, as
        a new puller does at its start: a term that grew in place took partitions of an
        engine that may have died with a batch in flight (intake stores a task once, so what
        is read twice is harmless)."""
        ...

    async def close(self) -> None:
        """Stop pulling; unacknowledged deliveries come back after the ack wait."""
        ...


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


class Bus(Protocol):
    """The NATS connection as a term of office uses it (`scheduler.bus.nats.connection.NatsBus`)."""

    # called with False when the link drops, True when it is back
    link_listeners: list[Callable[[bool], None]]

    @property
    def max_payload(self) -> int:
        """The server's largest message."""
        ...

    async def open_publisher(self, timeout: float, fence: Callable[[], bool]) -> Broker:
        """A started `Broker` for one term, sending only while `fence()` holds, waiting
        `timeout` seconds for each ack (the adapter `SCHEDULER_PUBLISH_PATH` names)."""
        ...

    def intake_source(self, stream: str, consumer: str, batch: int) -> Source:
        """The delay lane's consumer."""
        ...

    async def listen(
        self, subject: str, handler: Callable[[bytes], Awaitable[None]]
    ) -> Subscription:
        """Call `handler` with the payload of every core message on `subject`."""
        ...

    async def notify(self, subject: str, data: bytes) -> None:
        """Send a core message (no stream, no acknowledgement) on `subject`: a notice to
        whoever listens. Raises when it cannot be handed to the connection (the link is
        down); a notice may be lost all the same, so nothing may depend on it."""
        ...

    async def duplicate_window(self, stream: str) -> float:
        """A stream's duplicate window in seconds (0 without one)."""
        ...

    async def messages_held(self, subject: str) -> int:
        """How many messages the stream that captures `subject` still holds on that subject
        (on a work-queue stream: those no worker has acknowledged yet). Raises when no stream
        captures `subject` or the server cannot be asked."""
        ...
