"""The life of a delayed task, top-down: accept, claim, publish, book.

Read this module from top to bottom to follow one task from the delay lane to its delivery.
Each step is a short function that calls the ports (`TaskRepository`, `Broker`) and the
`Horizon`, and leaves the detail to the helpers it names: fair firing and its throttles
(`engine.fair`), the bounded armed set and byte budgets (`engine.armed`), parked payloads and
orphans (`engine.claims`), quotas (`engine.quota`), dead-letter copies (`engine.deadletter`).

1. **Accept** a batch from the lane: `validate` each message, `store` the good ones in one
   `TaskRepository.insert_batch` (under the horizon's lock, those within the loaded horizon go
   onto the heap: `Horizon.arm`), `reject` the bad ones to the dead letters, then ack.
2. **Claim** what falls due: `Horizon.take_due` within the lookahead, then
   `TaskRepository.claim_within` (fenced by the epoch); `arm_or_park` hands the claimed tasks
   to the armed set in firing order.
3. **Publish** at the due millisecond: `publish_due` hands every due task to
   `Broker.publish_tasks` at once (the broker builds every byte of the message).
4. **Book** the outcomes: `book` records them in one go (`mark_fired`, `expire`, then
   `retry_or_kill`: `retry_later` with a backoff, or `kill` and a `dead_letter` copy).

*When* each step runs is the business of the loops that own the state between steps, each
binding its step by name (so the hot path pays no extra call): `engine.intake.Intake` (the lane
loop: `commit = accept`), `engine.claims.Claimer` (`step = claim_due`), and
`engine.firing.Firing` (the claim, dispatch and bookkeeping loops: `_publish_due =
publish_due`, `_record = book`); `engine.leader_loop.LeaderEngine` runs them for a term.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from scheduler.backoff import backoff_seconds
from scheduler.engine.delayed.dead_budget import budget_key
from scheduler.engine.delayed.dead_letters import DeadLetter
from scheduler.engine.delayed.fairness import UNNAMED, FairArmed
from scheduler.engine.delayed.quota import quota_error
from scheduler.engine.ports import Delivery
from scheduler.errors import EnvelopeError, FencedError, TargetRefusedError
from scheduler.messages.envelope import check_org, check_size, parse_envelope
from scheduler.messages.headers import block_size, forwarded, printable, producer_msg_id
from scheduler.messages.subjects import check_target, target_from_rest
from scheduler.metrics import observe_many
from scheduler.records import (
    Claimed,
    ClaimedTask,
    Done,
    Entry,
    Fired,
    Insertion,
    NewTask,
    PubAck,
    PublishError,
    TaskRef,
    ceil_ms,
    firing_order,
    from_ms,
    to_ms,
)

# The loops that run these steps and own the state between them. They import this module, so
# it names them without importing them (import-linter: no cycle, type-only imports included).
Intake = Any  # engine.intake.Intake: the lane loop
Claimer = Any  # engine.claims.Claimer: claims in flight, parked payloads, orphans
Firing = Any  # engine.firing.Firing: the claim, dispatch and bookkeeping loops

T = TypeVar("T")

intake_log = logging.getLogger("scheduler.intake")
firing_log = logging.getLogger("scheduler.firing")  # claims and firing alike


# ------------------------------------------------------------------------------------------------
# 1. Accept a batch from the delay lane


YIELD_EVERY = 100


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


async def validate_all(intake: Intake, msgs: Sequence[Delivery]) -> list[NewTask | Rejected]:
    now = intake.clock.now()
    results: list[NewTask | Rejected] = []
    for i, msg in enumerate(msgs):
        results.append(validate(intake, msg, now))
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # let the dispatcher publish on time during a big batch
    return results


def validate(intake: Intake, msg: Delivery, now: datetime) -> NewTask | Rejected:
    """Validate one message into a NewTask, or say precisely why it is rejected."""
    defect: tuple[str, str] | None = getattr(msg, "defect", None)
    rest = msg.subject[len(intake.lane) :] if msg.subject.startswith(intake.lane) else msg.subject
    target = target_from_rest(rest)
    if defect is not None:
        where = None if defect[0] == "subject" else target
        return Rejected(msg, where, "undecodable", f"{defect[0]}: {defect[1]}")
    try:
        check_target(target, intake.settings.target_allow)
        headers = forwarded(msg.headers)
        check_size(len(target.encode()), block_size(headers), len(msg.data), intake.limits)
        env = parse_envelope(msg.data, now, intake.limits)
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
        scheduled_for=due if env.delay_until is not None else ceil_ms(now),
        expires_at=env.expires_at,
        org_id=env.org_id,
    )


async def accept(
    intake: Intake, msgs: Sequence[Delivery], results: list[NewTask | Rejected]
) -> None:
    """Insert the good tasks, dead-letter the bad ones, then ack: never ack before commit."""
    if not intake._may_act():  # self-fenced: leave the batch unacked for the next leader
        raise RuntimeError("office lost before the commit")
    good = [(m, r) for m, r in zip(msgs, results, strict=True) if isinstance(r, NewTask)]
    bad = [r for r in results if isinstance(r, Rejected)]
    if intake.ledger is not None and good:
        good, over = over_quota(intake, good)
        bad += over
    acked: list[Delivery] = []
    if good:
        insertion = await store(intake, [m for m, _ in good], [t for _, t in good])
        msg_of = {id(t): m for m, t in good}
        refused = [(t, "duplicate_id", DUPLICATE_ID) for t in insertion.taken]
        refused += [(t, "unstorable", f"task: {e}") for t, e in insertion.refused]
        bad += [Rejected(msg_of[id(t)], t.target, why, error) for t, why, error in refused]
        dropped = {id(t) for t, _, _ in refused}
        acked = [m for m, t in good if id(t) not in dropped]  # stored, or an exact resend
    if bad:
        await reject(intake, bad)
    # One frame per ack, all handed to the connection at once (see scheduler.bus.nats.wire).
    await intake.publisher.ack(m.reply for m in acked if m.reply)


def over_quota(
    intake: Intake, good: list[tuple[Delivery, NewTask]]
) -> tuple[list[tuple[Delivery, NewTask]], list[Rejected]]:
    """Split off the tasks of organisations at their quota, as `quota_exceeded`."""
    assert intake.ledger is not None
    _, over = intake.ledger.admit([t for _, t in good])
    if not over:
        return good, []
    refused = {id(t) for t in over}
    limit = intake.ledger.max_pending
    return [(m, t) for m, t in good if id(t) not in refused], [
        Rejected(m, t.target, "quota_exceeded", quota_error(t.org_id or "", limit))
        for m, t in good
        if id(t) in refused
    ]


async def store(intake: Intake, msgs: Sequence[Delivery], tasks: list[NewTask]) -> Insertion:
    """`insert_batch` under the horizon's lock: stored tasks the loader has passed go onto the
    heap at once (`Horizon.arm`)."""
    insertion: Insertion
    try:
        insertion, pushed = await intake.horizon.arm(
            with_progress(intake, intake.tasks.insert_batch(tasks), msgs),
            lambda done: done.stored,
            wake=False,
        )
    except BaseException:
        if intake.ledger is not None:  # nothing stored: the redelivery counts them again
            intake.ledger.finished(tasks)
        raise
    if intake.ledger is not None:  # counted at admission, but not new rows
        unstored = [*insertion.resent, *insertion.taken, *(t for t, _ in insertion.refused)]
        unstored += insertion.cancelled
        intake.ledger.finished(unstored)
    intake.metrics.intake.labels("accepted").inc(len(insertion.stored))
    if insertion.resent:
        intake.metrics.intake.labels("duplicate").inc(len(insertion.resent))
    if insertion.cancelled:  # a cancel came first: acked, stored cancelled, never delivered
        intake.metrics.intake.labels("cancelled_on_arrival").inc(len(insertion.cancelled))
        intake_log.info("intake.cancelled_on_arrival count=%d", len(insertion.cancelled))
    if pushed:
        intake.horizon.wake_up()
    return insertion


async def with_progress(intake: Intake, work: Awaitable[T], msgs: Sequence[Delivery]) -> T:
    """Await `work`, telling JetStream the batch is in progress while a slow commit runs."""
    task = asyncio.ensure_future(work)
    interval = max(intake.settings.intake_ack_wait.total_seconds() / 3, 0.5)
    while True:
        done, _ = await asyncio.wait({task}, timeout=interval)
        if done:
            return task.result()
        for msg in msgs:
            await msg.in_progress()


async def reject(intake: Intake, bad: list[Rejected]) -> None:
    """Store the refusals the budget allows (each capped), copy all to the DLQ stream, term."""
    cap = intake.settings.dead_letter_payload_cap
    rows = [_dead_row(r, cap) for r in bad]
    await intake.tasks.record_bad_intake(
        [row for r, row in zip(bad, rows, strict=True) if kept(intake, r)]
    )
    letters = []
    for r, row in zip(bad, rows, strict=True):
        intake.metrics.intake.labels(r.reason).inc()
        intake.metrics.dead_letters.labels(r.reason).inc()
        intake_log.warning(
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
    await intake.dead.send(letters)
    for r in bad:
        await r.msg.term()


def kept(intake: Intake, r: Rejected) -> bool:
    """Whether the refusal's organisation or subject may still add a row (see
    `engine.dead_budget`); one that may not is counted instead."""
    budget = intake.budget
    if budget is None or budget.take(budget_key(r.target, r.msg.subject)):
        return True
    budget.dropped(r.target, r.reason)
    return False


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


# ------------------------------------------------------------------------------------------------
# 2. Claim what falls due


# Claims run in steps: each claims every task due within LOOKAHEAD_MS, the next one follows
# CLAIM_STEP_MS later, or sooner when a task would otherwise be claimed less than CLAIM_LEAD_MS
# before it is due (a claim round trip under load takes 15-30 ms here). A steady stream of
# tasks so costs 40 claim statements a second instead of one per due millisecond.
LOOKAHEAD_MS = 80
CLAIM_LEAD_MS = 40
CLAIM_STEP_MS = 25
CLAIMS_IN_FLIGHT = 4


async def claim_due(claims: Claimer, epoch: int) -> bool:
    """Claim what falls due within the lookahead; return whether there was any.

    Up to `CLAIMS_IN_FLIGHT` claims run at once, so one slow round trip does not hold up
    the next window (a burst of tasks due at one instant drains at the database's pace)."""
    now = to_ms(claims.clock.now())
    throttles = claims.throttles
    throttles.update(now)
    nxt = claims.horizon.next_due()
    behind = nxt is not None and nxt <= now  # a backlog drains: claims queue up
    until = now + (throttles.busy_lookahead(LOOKAHEAD_MS) if behind else LOOKAHEAD_MS)
    entries = claims.horizon.take_due(until, min(throttles.claim_limit, claims.room()))
    claims.metrics.heap_size.set(len(claims.horizon))
    if not entries:
        return False
    claims._last_claim_ms = now
    await claims._slots.acquire()
    claims._claiming += len(entries)
    # each claim in flight may take a share of the byte room: one taking all that is left
    # would leave the next ones' payloads parked (claimed, fetched again later, in order)
    room = claims.armed.byte_room()
    budget = max(min(room // CLAIMS_IN_FLIGHT, room - claims._reserved), 1)
    claims._reserved += budget
    before, claims._taken = claims._taken, asyncio.Event()
    running = asyncio.create_task(
        claim(claims, epoch, entries, until, budget, before, claims._taken), name="claim"
    )
    claims._claims.add(running)
    running.add_done_callback(claims._claims.discard)
    return True


async def claim(
    claims: Claimer,
    epoch: int,
    entries: list[Entry],
    until: int,
    budget: int,
    before: asyncio.Event,
    taken: asyncio.Event,
) -> None:
    """One claim of up to `budget` payload bytes. Claims run concurrently, but their
    results are taken in the order they were started (`before` is the previous one's),
    so a burst due at one instant still goes out in firing order."""
    try:
        ids = [e[3] for e in entries]
        claimed = await claims.tasks.claim_within(epoch, ids, from_ms(until), budget)
        await before.wait()
        arm_or_park(claims, claimed)
    except FencedError:
        claims.on_fenced(epoch)
    except Exception as exc:  # PostgreSQL away: put the batch back and let the loop retry
        firing_log.warning("claim.failed count=%d error=%r", len(entries), exc)
        claims.horizon.put_back(TaskRef(i, due, p, seq) for due, p, seq, i in entries)
        await claims.clock.sleep(0.5)
    finally:
        taken.set()
        claims._claiming -= len(entries)
        claims._reserved -= budget
        claims._slots.release()


def arm_or_park(claims: Claimer, claimed: Claimed) -> None:
    """Arm what came with payloads, park the rest; nothing armed may come after a parked
    task in firing order (it would go out first), so such tasks are parked too, their
    payloads dropped until they are fetched again in order."""
    ready, parked = claimed.ready, claimed.parked
    if parked or claims._parked:
        first = firing_order(min((*parked, *claims._parked), key=firing_order))
        due_ms, priority, seq = to_ms(first[0]), first[1], first[2]
        later = claims.armed.take_after(due_ms, priority, seq)
        ready = [t for t in ready if firing_order(t) <= first]
        later += [t for t in claimed.ready if firing_order(t) > first]
        for task in later:
            task.payload = b""
        claims._parked = sorted([*claims._parked, *parked, *later], key=firing_order)
    claims._arm(ready)


# ------------------------------------------------------------------------------------------------
# 3. Publish at the due millisecond


async def publish_due(firing: Firing, allow: dict[str, int] | None = None) -> None:
    """Publish every armed task that is due, all in one hand-over to the connection
    (with `allow`: only those of the orgs it names, see `_dispatch_allowance`)."""
    now = firing.clock.now()
    now_ms = to_ms(now)
    batch: list[ClaimedTask] = []
    done: list[Done] = []
    size = 0
    lateness: dict[int, int] = {}  # due ms -> tasks, observed per group
    armed = firing.armed
    if allow is not None and isinstance(armed, FairArmed):
        due = armed.pop_due(now_ms, allow)
    else:
        due = armed.pop_due(now_ms)
    counts = firing._org_inflight
    if due:
        firing.room_event.set()
    for due_ms, *_, task in due:
        lateness[due_ms] = lateness.get(due_ms, 0) + 1
        if task.expires_at is not None and task.expires_at <= now and not task.doubted:
            firing._expired.append(task)
            firing.outcome_event.set()
            continue
        refused = firing._refused(task.target)  # re-checked at fire time
        if refused is not None:
            error = PublishError(task.target, refused, True, "target_refused")
            firing._outcomes.append((task, error, now))
            firing.outcome_event.set()
            continue
        size += len(task.payload)
        if counts is not None:
            org = task.org_id or UNNAMED
            counts[org] = counts.get(org, 0) + 1
        batch.append(task)
        done.append(functools.partial(firing._done, task))
    for due_ms, n in lateness.items():
        observe_many(firing.metrics.dispatch_lateness, (now_ms - due_ms) / 1000, n)
    if batch:
        firing._inflight += len(batch)
        firing._inflight_bytes += size
        await firing.publisher.publish_tasks(batch, done, now)


# ------------------------------------------------------------------------------------------------
# 4. Book the outcomes


async def book(
    firing: Firing,
    epoch: int,
    outcomes: list[tuple[ClaimedTask, PubAck | PublishError, datetime]],
    expired: list[ClaimedTask],
) -> None:
    """Record a flush of outcomes, fenced by `epoch`: the fired (`mark_fired`), the expired,
    then the failed (retried or dead); a newer leader's epoch deposes this one."""
    fired = [Fired(t, at, r.stream, r.seq) for t, r, at in outcomes if isinstance(r, PubAck)]
    if firing.on_stream is not None:
        for stream in {f.stream for f in fired}:
            firing.on_stream(stream)
    failed = [(t, r) for t, r, _ in outcomes if isinstance(r, PublishError)]
    try:
        await firing.tasks.mark_fired(epoch, fired, firing.settings.instance_id)
        await expire(firing, epoch, expired)
        await retry_or_kill(firing, epoch, failed)
    except FencedError:
        firing._deposed(epoch)
        return
    if firing.ledger is not None:  # fired, expired: no longer pending (dead: in retry_or_kill)
        firing.ledger.finished([*(f.task for f in fired), *expired])
    groups: dict[tuple[datetime, datetime], int] = {}
    for f in fired:
        key = (f.fired_at, f.task.scheduled_for)
        groups[key] = groups.get(key, 0) + 1
    histogram = firing.metrics.lateness.labels("delayed")
    for (fired_at, scheduled_for), n in groups.items():
        observe_many(histogram, max((fired_at - scheduled_for).total_seconds(), 0.0), n)
    firing.metrics.fired.labels("delayed").inc(len(fired))


async def expire(firing: Firing, epoch: int, expired: list[ClaimedTask]) -> None:
    if not expired:
        return
    await firing.tasks.expire(epoch, [t.id for t in expired])
    firing.metrics.expired.inc(len(expired))
    for t in expired:
        firing_log.info("task.expired id=%s target=%s expired_at=%s", t.id, t.target, t.expires_at)


async def retry_or_kill(
    firing: Firing, epoch: int, failed: list[tuple[ClaimedTask, PublishError]]
) -> None:
    """Retry with backoff, or dead-letter after `max_attempts`. A publish that went out
    unacknowledged leaves its task in doubt (never pending: a cancel must not succeed
    for a task JetStream may hold); its retry republishes under the same message id."""
    if not failed:
        return
    now = firing.clock.now()
    dead: list[tuple[ClaimedTask, str, str]] = []
    retry: list[tuple[ClaimedTask, datetime, str, bool]] = []
    for t, e in failed:
        doubt = e.in_doubt or t.doubted
        if e.permanent or t.attempts >= firing.settings.max_attempts:
            if doubt:  # the task may have been delivered: say so
                reason, error = "publish_unconfirmed", f"{e} (it may have been delivered)"
            else:
                reason, error = e.reason, str(e)
            dead.append((t, error, reason))
        else:
            retry.append((t, ceil_ms(now + backoff(firing, t.attempts)), str(e), e.in_doubt))
    await firing.horizon.arm(  # under its lock: the loader must not pass a retry unseen
        firing.tasks.retry_later(epoch, retry),
        lambda _: [
            TaskRef(t.id, to_ms(due), t.priority, t.seq, t.org_id) for t, due, _, _ in retry
        ],
        wake=False,  # woken below, once the dead ones are recorded too
    )
    for task, _, error, doubt in retry:
        firing_log.warning(
            "publish.retry id=%s target=%s attempt=%d in_doubt=%s error=%s",
            task.id,
            task.target,
            task.attempts,
            doubt or task.doubted,
            error,
        )
    firing.metrics.publish_retries.inc(len(retry))
    in_doubt = sum(1 for _, _, _, doubt in retry if doubt)
    if in_doubt:
        firing.metrics.publish_in_doubt.inc(in_doubt)
    if dead:
        await firing.tasks.kill(epoch, dead)
        if firing.ledger is not None:
            firing.ledger.finished(t for t, _, _ in dead)
        await dead_letter(firing, dead)
    firing.horizon.wake_up()


def backoff(firing: Firing, attempt: int) -> timedelta:
    """First backoff doubling per attempt up to 60 s, with +-20 % jitter."""
    return timedelta(seconds=backoff_seconds(firing.settings.backoff.total_seconds(), attempt))


async def dead_letter(firing: Firing, dead: list[tuple[ClaimedTask, str, str]]) -> None:
    letters = []
    for task, error, reason in dead:
        firing.metrics.dead_letters.labels(reason).inc()
        firing_log.error(
            "task.dead id=%s target=%s attempts=%d error=%s",
            task.id,
            task.target,
            task.attempts,
            error,
        )
        marks = {"Mq-Target": task.target, "Mq-Attempt": str(task.attempts)}
        letter = DeadLetter(
            task.target, task.payload, task.headers, reason, error, marks, f"dlq:{task.id}"
        )
        letters.append(letter)
    await firing.dead.send(letters)
