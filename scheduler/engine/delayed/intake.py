"""The intake loop: the delay lane into PostgreSQL, acked only after the commit.

Fetch a batch from the durable pull consumer (gathered for 10 ms, and up to 50 ms while every
task in it is due more than a second ahead: `Intake.gather`), judge each message alone
(decodable subject and headers, target, header rules, size, envelope, TTL, max delay), store
the good ones in one round trip, put those inside the loaded horizon straight onto the heap,
then ack. A task id already stored is a no-op when the message repeats that task exactly (same
target, same bytes: a redelivery or a resend) and `duplicate_id` otherwise; an exact copy of a
task committed lately is known as one before it is validated and acked without a round trip
(`engine.delayed.repeats`: after an outage most of a lane's backlog can be producers' resends).
Bad input is dead-lettered (table `dead_letters`, then a copy on stream `MQ_DLQ` with an
`Mq-Error` header naming the field and the problem) and termed, so it never blocks the lane nor
fails its batch neighbours.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from scheduler.clock import Clock
from scheduler.engine.delayed import trace
from scheduler.engine.delayed.dead_budget import DeadLetterBudget, budget_key
from scheduler.engine.delayed.dead_letters import DeadLetter, DeadLetterCopies
from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.delayed.quota import OrgLedger, quota_error
from scheduler.engine.delayed.repeats import Key, Repeats, key_of
from scheduler.engine.delayed.stored import StoredNotices
from scheduler.engine.ports import Broker, Delivery, Source, TaskRepository
from scheduler.errors import EnvelopeError, TargetRefusedError
from scheduler.messages.envelope import Envelope, Limits, check_org, check_size, parse_envelope
from scheduler.messages.headers import block_size, forwarded, printable, producer_msg_id
from scheduler.messages.subjects import check_target, delay_lane_prefix, target_from_rest
from scheduler.records import Insertion, NewTask, TaskRef, ceil_ms, to_ms
from scheduler.settings import Settings

T = TypeVar("T")
Keys = dict[int, Key | None]  # a message's repeat key, by the message's id()

log = logging.getLogger(__name__)

# A small batch waits this long for more: one insert per 10 ms instead of one per message or
# two at low rates (each statement costs a round trip); tasks are due later than that anyway.
INTAKE_LINGER = 0.01
# A batch whose every task is due more than FAR_DUE from now goes on gathering, chunk by chunk
# (each taken with INTAKE_LINGER), until GATHER_FOR after its first chunk came in or a whole
# batch is in: a fifth of the inserts at a steady rate, each insert's fixed cost (its round
# trip, PostgreSQL's statement) shared by five times the tasks. A chunk holding a task due
# sooner, or a message that is no task, ends it at once; FAR_DUE is far more than the wait.
GATHER_FOR = 0.05
FAR_DUE = timedelta(seconds=1)
YIELD_EVERY = 100  # messages validated between two yields to the event loop
# While the batch before commits, the next one goes on taking what the lane hands over (it
# could not commit sooner anyway), polling this often for the end of that commit, up to a
# whole batch of tasks and COPIES_PER_BATCH batches of exact copies: a backlog then drains in
# a commit per batch, not per chunk. After a frozen lane leader resumed with 16,000 messages,
# most of them a producer's resends, chunks of 1,000 each waited for an insert of ~130 tasks:
# ~7,000 messages/s, the tasks behind them up to 1.5 s late (bench/cluster_faults.py).
BUSY_POLL = 0.002
COPIES_PER_BATCH = 8
# After a failed commit (PostgreSQL away, the link down for the acks) the next one waits until
# this long after the failure, so a store that refuses every statement is not asked in a loop.
FAILED_PAUSE = 1.0
Failure = tuple[float, Exception]  # a failed commit: when (the clock's monotonic time) and why

DUPLICATE_ID = (
    "id: already taken by another task (another target or other bytes); ids must be unique, "
    "and a resend must repeat its task exactly"
)


@dataclass(frozen=True, slots=True)
class Rejected:
    """An intake message that is not a valid task, with why; `target` is None when its
    subject could not even be decoded."""

    msg: Delivery
    target: str | None
    reason: str
    error: str


class Intake:
    """Moves tasks from the delay lane into PostgreSQL and the heap: the lane loop (`run`)
    around two steps, `validate_all` and `accept`."""

    def __init__(
        self,
        *,
        settings: Settings,
        horizon: Horizon,
        tasks: TaskRepository,
        publisher: Broker,
        clock: Clock,
        events: DelayedEvents,
        limits: Limits,
        dead: DeadLetterCopies | None = None,
        ledger: OrgLedger | None = None,
        notices: StoredNotices | None = None,
    ) -> None:
        self.settings = settings
        self.dead = dead or DeadLetterCopies(publisher, settings.dlq_subject_prefix, events)
        self.horizon = horizon
        self.tasks = tasks
        self.publisher = publisher
        self.clock = clock
        self._events = events
        self.limits = limits
        self.lane = delay_lane_prefix(settings.intake_subject)
        self._may_act: Callable[[], bool] = lambda: True
        self.ledger = ledger  # per-org quotas (engine/delayed/quota.py), when on
        # refusals stored per organisation or subject and minute (engine/delayed/dead_budget.py)
        self.budget = DeadLetterBudget.of(settings, clock, events)
        self.repeats = Repeats()  # tasks committed lately: their exact resends are acked at once
        # P > 1: the owners of stored tasks of other partitions due soon are told at once
        self.notices = notices

    async def run(self, puller: Source, stop: asyncio.Event, may_act: Callable[[], bool]) -> None:
        """Handle batches as they arrive until `stop` is set or `may_act()` turns false.

        Two stages: while one batch commits, the next is gathered (`gather`) and validated.
        Commits stay one at a time, in order, so intake order (the tie-break among tasks due
        together) holds.
        """
        self._may_act = may_act
        await puller.start()
        committing: tuple[asyncio.Task[Failure | None], int] | None = None
        stopping = asyncio.create_task(stop.wait(), name="intake-stop")
        stopping.add_done_callback(lambda _: puller.interrupt())
        try:
            while not stop.is_set() and may_act():
                busy = committing[0] if committing is not None else None
                msgs, results, repeats, keys = await self.gather(puller, stop, busy)
                if not msgs and not repeats:
                    continue
                if committing is not None:
                    await self._settle(*committing)
                task = asyncio.create_task(
                    self._commit(msgs, results, repeats, keys), name="intake-commit"
                )
                committing = (task, len(msgs) + len(repeats))
        finally:
            stopping.cancel()
            # The puller first: until it unsubscribes, the server keeps handing this instance
            # the lane's messages (its pull requests live on), and once out of office nothing
            # here would take them: they would come back only after the ack wait. A cancel
            # (the term ended) lands in `_settle`'s pause, so nothing may be left after it.
            await puller.close()
            if committing is not None:
                await self._settle(*committing)

    async def gather(
        self, puller: Source, stop: asyncio.Event, busy: asyncio.Future[Any] | None = None
    ) -> tuple[list[Delivery], list[NewTask | Rejected], list[Delivery], Keys]:
        """The next batch, validated: a chunk taken with `INTAKE_LINGER`, then, while every
        message so far is a task due more than `FAR_DUE` ahead, more chunks until `GATHER_FOR`
        after the first came in or a whole batch (`batch`) is in. No task due sooner waits
        longer than a chunk's linger (or than the commit before, `busy`, which it waits for
        anyway: until then more chunks join, see `BUSY_POLL`), and the messages keep the
        lane's order.

        Exact copies (`engine.delayed.repeats`) of a task committed lately, or of a message
        earlier in the batch, are set apart unvalidated: the third list. The fourth holds each
        message's repeat key, for `accept`: a payload is hashed once."""
        seen: set[Key] = set()
        keys: Keys = {}
        taken = list(await puller.take(timeout=0.5, linger=INTAKE_LINGER))
        if not taken:
            return [], [], [], keys
        until = self.clock.monotonic() + GATHER_FOR - INTAKE_LINGER  # the first waited a linger
        msgs, repeats = self._set_apart(taken, seen, keys)
        results = await self.validate_all(msgs)
        chunk = results
        while self._all_far(chunk) and not stop.is_set() and self._may_act():
            room = self.settings.batch - len(msgs) - len(repeats)
            left = until - self.clock.monotonic()
            if room <= 0 or left <= 0:
                break
            more = await puller.take(timeout=left, linger=min(INTAKE_LINGER, left), limit=room)
            if not more:
                break
            fresh, copies = self._set_apart(more, seen, keys)
            msgs += fresh
            repeats += copies
            chunk = await self.validate_all(fresh)
            results += chunk
        copies_most = COPIES_PER_BATCH * self.settings.batch
        while busy is not None and not busy.done() and not stop.is_set() and self._may_act():
            room = min(self.settings.batch - len(msgs), copies_most - len(repeats))
            if room <= 0:
                break
            more = await puller.take(timeout=BUSY_POLL, linger=0, limit=room)
            if more:
                fresh, copies = self._set_apart(more, seen, keys)
                msgs += fresh
                repeats += copies
                results += await self.validate_all(fresh)
        if trace.on():
            trace.step("taken", _lane_marks(msgs, results), repeats=len(repeats))
        return msgs, results, repeats, keys

    def _set_apart(
        self, msgs: Sequence[Delivery], seen: set[Key], keys: Keys
    ) -> tuple[list[Delivery], list[Delivery]]:
        """(the messages to judge, the exact copies of a task committed lately or of one of
        `seen`, the keys of this batch so far, which the first gain); each message's key is
        noted in `keys`."""
        fresh, copies = [], []
        known = self.repeats.known
        for msg in msgs:
            key = keys[id(msg)] = key_of(msg)
            if key is not None and (key in seen or known(key)):
                copies.append(msg)
                continue
            if key is not None:
                seen.add(key)
            fresh.append(msg)
        return fresh, copies

    def _all_far(self, results: Sequence[NewTask | Rejected]) -> bool:
        """Whether every result is a task due more than `FAR_DUE` from now."""
        soon = self.clock.now() + FAR_DUE
        return all(isinstance(r, NewTask) and r.due_at > soon for r in results)

    async def _settle(self, committing: asyncio.Task[Failure | None], count: int) -> None:
        """Wait for the commit before; when it failed, pause until `FAILED_PAUSE` after its
        failure (not after this call: on a lane that went quiet through an outage the next
        batch may come seconds after the failure, and it waited a whole pause on CI, 1 s late,
        for an ack the link had refused six seconds before)."""
        failure = await committing
        if failure is not None:  # unacked messages come back after the ack wait
            failed_at, exc = failure
            log.warning("intake.failed count=%d error=%r", count, exc)
            await self.clock.sleep(failed_at + FAILED_PAUSE - self.clock.monotonic())

    async def _commit(
        self, msgs: Sequence[Delivery], results: list[NewTask | Rejected],
        repeats: Sequence[Delivery], keys: Keys,
    ) -> Failure | None:  # fmt: skip
        """`accept`; when it fails, when it failed and why (for `_settle`)."""
        try:
            await self.accept(msgs, results, repeats, keys)
        except Exception as exc:
            return self.clock.monotonic(), exc
        return None

    async def validate_all(self, msgs: Sequence[Delivery]) -> list[NewTask | Rejected]:
        """Validate a batch, each message alone (`validate`), in order."""
        now = self.clock.now()
        results: list[NewTask | Rejected] = []
        for i, msg in enumerate(msgs):
            results.append(self.validate(msg, now))
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # let the dispatcher publish on time during a big batch
        return results

    def validate(self, msg: Delivery, now: datetime) -> NewTask | Rejected:
        """Validate one message into a NewTask, or say precisely why it is rejected."""
        defect: tuple[str, str] | None = getattr(msg, "defect", None)
        rest = msg.subject[len(self.lane) :] if msg.subject.startswith(self.lane) else msg.subject
        target = target_from_rest(rest)
        if defect is not None:
            where = None if defect[0] == "subject" else target
            return Rejected(msg, where, "undecodable", f"{defect[0]}: {defect[1]}")
        try:
            check_target(target, self.settings.target_allow)
            headers = forwarded(msg.headers)
            check_size(len(target.encode()), block_size(headers), len(msg.data), self.limits)
            env = parse_envelope(msg.data, now, self.limits)
            check_org(env, target)
        except TargetRefusedError as exc:
            return Rejected(msg, target, "target_refused", str(exc))
        except EnvelopeError as exc:
            return Rejected(msg, target, exc.reason, str(exc))
        due = ceil_ms(env.due_at(now))
        return NewTask(
            id=env.id,
            target=target,
            payload=msg.data,
            headers=headers,
            priority=env.priority,
            due_at=due,
            scheduled_for=due if due_ahead(env.delay_until, now) else asked_for(env, msg, now),
            expires_at=env.expires_at,
            org_id=env.org_id,
        )

    async def accept(
        self,
        msgs: Sequence[Delivery],
        results: list[NewTask | Rejected],
        repeats: Sequence[Delivery] = (),
        keys: Keys | None = None,
    ) -> None:
        """Insert the good tasks, dead-letter the bad ones, then ack: never ack before commit.

        `repeats` (see `gather`) are acked with them when their task is committed by then (an
        exact resend), and so are the messages of the batch that turn out to be copies of a
        task the batch before committed meanwhile; a copy of a message this batch refused is
        judged on its own after it. `keys`: the repeat keys `gather` noted (by `id`), the
        others are computed here."""
        if not self._may_act():  # self-fenced: leave the batch unacked for the next leader
            raise RuntimeError("office lost before the commit")
        key: Keys = {} if keys is None else keys  # each message hashed once
        for m in (*msgs, *repeats):
            if id(m) not in key:
                key[id(m)] = key_of(m)
        known = [self.repeats.known(key[id(m)]) for m in msgs]
        if any(known):
            repeats = [*repeats, *(m for m, k in zip(msgs, known, strict=True) if k)]
            results = [r for r, k in zip(results, known, strict=True) if not k]
            msgs = [m for m, k in zip(msgs, known, strict=True) if not k]
        good = [(m, r) for m, r in zip(msgs, results, strict=True) if isinstance(r, NewTask)]
        bad = [r for r in results if isinstance(r, Rejected)]
        if self.ledger is not None and good:
            good, over = self._over_quota(good)
            bad += over
        acked: list[Delivery] = []
        if good:
            began = trace.now_ms()
            insertion = await self._store([m for m, _ in good], [t for _, t in good])
            if trace.on():
                trace.step(
                    "stored", (t.id for _, t in good), took=trace.now_ms() - began,
                    resent=len(insertion.resent),
                )  # fmt: skip
            refused = [(t, "duplicate_id", DUPLICATE_ID) for t in insertion.taken]
            refused += [(t, "unstorable", f"task: {e}") for t, e in insertion.refused]
            acked = [m for m, _ in good]  # stored, or an exact resend
            if refused:
                msg_of = {id(t): m for m, t in good}
                bad += [Rejected(msg_of[id(t)], t.target, why, err) for t, why, err in refused]
                dropped = {id(t) for t, _, _ in refused}
                acked = [m for m, t in good if id(t) not in dropped]
        self.repeats.add(key[id(m)] for m in acked)  # stored, or stored already: committed
        if bad:
            await self._reject(bad)
        resent = [m for m in repeats if self.repeats.known(key[id(m)])]
        again = [m for m in repeats if not self.repeats.known(key[id(m)])] if resent else repeats
        if resent:
            self._events.intake_committed(0, len(resent), 0)
            acked += resent
        # One frame per ack, all handed to the connection at once (see scheduler.bus.nats.wire).
        await self.publisher.ack(m.reply for m in acked if m.reply)
        if again:  # copies of a message refused just now: judged alone, as before
            await self.accept(again, await self.validate_all(again), keys=key)

    def _over_quota(
        self, good: list[tuple[Delivery, NewTask]]
    ) -> tuple[list[tuple[Delivery, NewTask]], list[Rejected]]:
        """Split off the tasks of organisations at their quota, as `quota_exceeded`."""
        assert self.ledger is not None
        _, over = self.ledger.admit([t for _, t in good])
        if not over:
            return good, []
        refused = {id(t) for t in over}
        limit = self.ledger.max_pending
        return [(m, t) for m, t in good if id(t) not in refused], [
            Rejected(m, t.target, "quota_exceeded", quota_error(t.org_id or "", limit))
            for m, t in good
            if id(t) in refused
        ]

    async def _store(self, msgs: Sequence[Delivery], tasks: list[NewTask]) -> Insertion:
        """`insert_batch` under the horizon's lock: stored tasks the loader has passed go onto the
        heap at once (`Horizon.arm`), and so do tasks stored before whose lane message came
        here again (`_taken_again`); under P > 1 the owners of the others due soon are told
        (`notices`)."""
        insertion: Insertion
        # the tasks stored, and those stored before whose lane message came again (their
        # storer may have died before firing them, in this term's partitions too): offered to
        # the heap under the lock, and the owners of the others are told
        offered: list[TaskRef] = []

        def to_offer(done: Insertion) -> list[TaskRef]:
            offered.extend([*done.stored, *_taken_again(msgs, tasks, done.resent_refs)])
            return offered

        try:
            insertion, pushed = await self.horizon.arm(
                self._with_progress(self.tasks.insert_batch(tasks), msgs), to_offer, wake=False
            )
        except BaseException:
            if self.ledger is not None:  # nothing stored: the redelivery counts them again
                self.ledger.finished(tasks)
            raise
        if self.ledger is not None:  # counted at admission, but not new rows
            unstored = [*insertion.resent, *insertion.taken, *(t for t, _ in insertion.refused)]
            unstored += insertion.cancelled
            self.ledger.finished(unstored)
        self._events.intake_committed(
            len(insertion.stored), len(insertion.resent), len(insertion.cancelled)
        )
        if insertion.cancelled:  # a cancel came first: acked, stored cancelled, never delivered
            log.info("intake.cancelled_on_arrival count=%d", len(insertion.cancelled))
        if pushed:
            self.horizon.wake_up()
        if self.notices is not None and offered:
            await self.notices.send(offered, to_ms(self.clock.now() + self.settings.horizon))
        return insertion

    async def _with_progress(self, work: Awaitable[T], msgs: Sequence[Delivery]) -> T:
        """Await `work`, telling JetStream the batch is in progress while a slow commit runs."""
        task = asyncio.ensure_future(work)
        interval = max(self.settings.intake_ack_wait.total_seconds() / 3, 0.5)
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            for msg in msgs:
                await msg.in_progress()

    async def _reject(self, bad: list[Rejected]) -> None:
        """Store the refusals the budget allows (each capped), copy all to the DLQ stream, term."""
        cap = self.settings.dead_letter_payload_cap
        rows = [_dead_row(r, cap) for r in bad]
        await self.tasks.record_bad_intake(
            [row for r, row in zip(bad, rows, strict=True) if self._kept(r)]
        )
        self._events.intake_refused(r.reason for r in bad)
        letters = []
        for r, row in zip(bad, rows, strict=True):
            log.warning(
                "intake.rejected subject=%s reason=%s error=%s",
                printable(r.msg.subject, 300),
                r.reason,
                printable(r.error, 300),
            )
            marks = {"Mq-Original-Subject": r.msg.subject, "Mq-Original-Id": row["original_id"]}
            msg_id = row["key"] or f"dlq-intake:{row['original_id']}"
            letters.append(
                DeadLetter(r.target, r.msg.data, r.msg.headers, r.reason, r.error, marks, msg_id)
            )
        await self.dead.send(letters)
        for r in bad:
            await r.msg.term()

    def _kept(self, r: Rejected) -> bool:
        """Whether the refusal's organisation or subject may still add a row (see
        `engine.delayed.dead_budget`); one that may not is counted instead."""
        budget = self.budget
        if budget is None or budget.take(budget_key(r.target, r.msg.subject)):
            return True
        budget.dropped(r.target, r.reason)
        return False


def due_ahead(delay_until: datetime | None, now: datetime) -> bool:
    """Whether the task is due at its `delay_until` (not at once: `Envelope.due_at`)."""
    return delay_until is not None and delay_until >= now


def asked_for(env: Envelope, msg: Delivery, now: datetime) -> datetime:
    """The delivery time a task due at once was asked for (`Mq-Scheduled-For`, the fire
    log's `scheduled_for`): its `delay_until`, or when the lane stored it if that was later
    (no `delay_until`, or one already past when the producer sent it), so a task that waited
    on the lane shows that wait as lateness. Never after `now` (the server's clock may run
    ahead of ours: the delivery would look early), whole ms."""
    try:
        stored = msg.metadata.timestamp
    except Exception:  # not a JetStream message (the in-memory twin's tests)
        stored = now
    accepted = min(stored, now) if isinstance(stored, datetime) else now
    asked = accepted if env.delay_until is None else max(env.delay_until, accepted)
    return ceil_ms(min(asked, now))


def _lane_marks(msgs: Sequence[Delivery], results: Sequence[NewTask | Rejected]) -> list[str]:
    """`id@lane store ms/stream seq/consumer seq/delivery count` of each task in a batch
    (consumer sequence 0: read back from the stream, see `scheduler.bus.nats.puller`)."""
    marks = []
    for msg, r in zip(msgs, results, strict=True):
        if isinstance(r, NewTask):
            try:
                meta = msg.metadata
                stored = int(meta.timestamp.timestamp() * 1000)
                seqs = f"{meta.sequence.stream}/{meta.sequence.consumer}/{meta.num_delivered}"
                marks.append(f"{r.id}@{stored}/{seqs}")
            except Exception:  # not a JetStream message (the in-memory twin's tests)
                marks.append(r.id)
    return marks


def _dead_row(r: Rejected, cap: int) -> dict[str, Any]:
    """The `dead_letters` row of a rejected message (TaskStore.record_bad_intake): its first
    `cap` bytes (the DLQ stream's copy is whole), its size and whether it was cut."""
    data = r.msg.data
    return {
        "original_id": _original_id(r.msg),
        "key": _intake_key(r.msg),
        "subject": r.msg.subject,
        "error": r.error,
        "reason": r.reason,
        "target": r.target,
        "raw": data[:cap] if len(data) > cap else data,
        "raw_size": len(data),
        "headers": r.msg.headers,
    }


def _intake_key(msg: Delivery) -> str | None:
    """What identifies this message on the lane (stream, sequence and store time), so a
    redelivered bad message is dead-lettered once; None outside JetStream (tests)."""
    try:
        meta = msg.metadata
        stamp = int(meta.timestamp.timestamp() * 1_000_000)
        return f"dlq-intake:{meta.stream}:{meta.sequence.stream}:{stamp}"
    except Exception:  # not a JetStream message
        return None


def _original_id(msg: Delivery) -> str:
    """The envelope's id if there is one to read, else the producer's message id, else the
    lane's stream sequence."""
    try:
        doc = json.loads(msg.data)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("id"), str) and doc["id"]:
        return printable(doc["id"], 200)
    header = producer_msg_id(msg.headers)
    if header:
        return printable(header, 200)
    try:
        return f"intake:{msg.metadata.sequence.stream}"
    except Exception:  # not a JetStream message
        return "intake:?"


def _taken_again(
    msgs: Sequence[Delivery], tasks: Sequence[NewTask], refs: Sequence[TaskRef]
) -> list[TaskRef]:
    """Of `refs` (resends whose row waits to fire), those whose lane message came here again:
    delivered more than once, or read back from the stream (consumer sequence 0, a dead
    engine's batch: `scheduler.bus.nats.puller`). The engine that stored such a task may have
    died between its commit and its notice, and the owner would find the task only by its
    sweep, seconds overdue (bench/README.md, the kill at 500/s). A producer's own resend is a
    new message, delivered once: the engine that stored the first copy told the owner, and
    telling it again at every resend would let a producer push entries onto the owner's heap."""
    if not refs:
        return []
    again = {t.id for m, t in zip(msgs, tasks, strict=True) if _came_again(m)}
    return [r for r in refs if r.task_id in again]


def _came_again(msg: Delivery) -> bool:
    try:
        meta = msg.metadata
        return bool(meta.num_delivered > 1 or meta.sequence.consumer == 0)
    except Exception:  # not a JetStream message (the twins' tests): taken once
        return False
