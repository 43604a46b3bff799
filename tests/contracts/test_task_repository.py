"""The task repository's contract, over the in-memory twin and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.partitions import partition_of
from scheduler.records import ClaimedTask, Fired, NewTask, to_ms
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.postgres.intents import IntentLimits
from tests.contracts.admin import StoredTasks
from tests.support.stores import claim, insert

NOW = datetime.now(UTC).replace(microsecond=0)
LIMITS = IntentLimits(ttl=timedelta(minutes=1), max_per_target=3)


@dataclass
class Repo:
    tasks: StoredTasks
    take_office: Callable[[], Awaitable[int]]
    has_row: Callable[[str], Awaitable[bool]]  # whether `delayed_messages` holds the id
    # the intake dead letters recorded for a lane message's key: (original_id, reason) each
    dead_intake: Callable[[str], Awaitable[list[tuple[str, str]]]]
    partition: Callable[[str], Awaitable[int]]  # the partition a task's row holds


@pytest.fixture
async def repo(database: str | None) -> AsyncIterator[Repo]:
    async with open_repo(database) as opened:
        yield opened


@asynccontextmanager
async def open_repo(database: str | None, partitions: int = 1) -> AsyncIterator[Repo]:
    """The twin, or the PostgreSQL store on `database`, for a deployment of `partitions`."""
    if database is None:
        store = MemoryTaskStore(intent_limits=LIMITS, partitions=partitions)

        async def in_rows(task_id: str) -> bool:
            return task_id in store.rows

        async def dead_memory(key: str) -> list[tuple[str, str]]:
            got = [d for d in store.dead_letters if d.get("key") == key]
            return [(d["original_id"], d["reason"]) for d in got]

        async def partition_memory(task_id: str) -> int:
            return store.rows[task_id].partition

        yield Repo(store, store.take_office, in_rows, dead_memory, partition_memory)
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.tasks import TaskStore

    pool = await create_pool(database, min_size=1, max_size=2)

    async def has_row(task_id: str) -> bool:
        sql = "SELECT count(*) FROM delayed_messages WHERE id = $1"
        return bool(await pool.fetchval(sql, task_id))

    async def dead_real(key: str) -> list[tuple[str, str]]:
        sql = "SELECT original_id, reason FROM dead_letters WHERE intake_key = $1 ORDER BY id"
        return [(r["original_id"], r["reason"]) for r in await pool.fetch(sql, key)]

    async def partition_real(task_id: str) -> int:
        sql = "SELECT partition FROM delayed_messages WHERE id = $1"
        return int(await pool.fetchval(sql, task_id))

    try:
        tasks = TaskStore(PostgresStore(pool, Metrics()), LIMITS, partitions)
        yield Repo(tasks, lambda: take_office(pool, "t"), has_row, dead_real, partition_real)
    finally:
        await pool.close()


def task(
    due_s: float = 1, priority: int = 5, payload: bytes = b"{}", target: str = "mq.t.x"
) -> NewTask:
    due = NOW + timedelta(seconds=due_s)
    return NewTask(f"c_{uuid.uuid4().hex[:12]}", target, payload, {}, priority, due, due, None)


async def status(repo: Repo, t: NewTask) -> str:
    row = await repo.tasks.get(t.id)
    assert row is not None
    return str(row["status"])


async def test_an_id_is_stored_once_and_a_resend_told_from_a_clash(repo: Repo) -> None:
    """A resent task (same target, same bytes) is `resent`, with the heap entry of its row,
    which waits to fire (`resent_refs`, the stored one's); another task under a taken id is
    `taken`; only the first is stored."""
    first = task()
    same = NewTask(first.id, first.target, first.payload, {}, 5, first.due_at, first.due_at, None)
    other = NewTask(first.id, first.target, b'{"x":1}', {}, 5, first.due_at, first.due_at, None)
    got = await repo.tasks.insert_batch([first])
    assert [r.task_id for r in got.stored] == [first.id]
    again = await repo.tasks.insert_batch([same, other])
    assert (again.stored, again.resent, again.taken) == ([], [same], [other])
    assert again.resent_refs == got.stored


async def test_a_resend_of_a_claimed_or_fired_task_has_no_heap_entry(repo: Repo) -> None:
    """Only a resend whose row waits to fire (pending, held by no leader) names its heap
    entry: one claimed or fired is nothing to fire again."""
    held, fired = task(0), task(0)
    await repo.tasks.insert_batch([held, fired])
    epoch = await repo.take_office()
    assert len(await claim(repo.tasks, epoch, [held.id], NOW + timedelta(seconds=1))) == 1
    await _fire(repo, fired)
    again = await repo.tasks.insert_batch([held, fired])
    assert (again.stored, again.resent, again.resent_refs) == ([], [held, fired], [])


async def test_pages_come_in_firing_order_past_the_cursor(repo: Repo) -> None:
    """Due time first, then priority (lower first), then intake order; a page starts after the
    given key and stops at `until`."""
    late, low, high, early, beyond = task(2), task(1, 7), task(1, 2), task(0.5), task(60)
    await repo.tasks.insert_batch([late, low, high, early, beyond])
    page = await repo.tasks.load_page((-1, 0, 0), NOW + timedelta(seconds=5), 10)
    assert [r.task_id for r in page] == [early.id, high.id, low.id, late.id]
    rest = await repo.tasks.load_page(page[1].key, NOW + timedelta(seconds=5), 10)
    assert [r.task_id for r in rest] == [low.id, late.id]
    assert await repo.tasks.pending_count() == 5


async def test_a_claim_is_fenced_by_the_epoch(repo: Repo) -> None:
    """Once a newer epoch is taken, a claim or a booking by the older one fails with
    FencedError and changes nothing; the new leader claims the task."""
    t = task(0)
    await repo.tasks.insert_batch([t])
    old = await repo.take_office()
    claimed = await claim(repo.tasks, old, [t.id], NOW + timedelta(seconds=1))
    assert [c.id for c in claimed] == [t.id]
    new = await repo.take_office()
    assert new > old
    with pytest.raises(FencedError):
        await claim(repo.tasks, old, [t.id], NOW + timedelta(seconds=1))
    with pytest.raises(FencedError):
        await repo.tasks.mark_fired(old, [Fired(claimed[0], NOW, "S", 1)], "a")
    assert await status(repo, t) == "claimed"
    orphans = await repo.tasks.reclaim_orphans(new)
    assert [c.id for c in orphans.ready] == [t.id]
    await repo.tasks.mark_fired(new, [Fired(orphans.ready[0], NOW, "S", 1)], "b")
    assert await status(repo, t) == "fired"


async def test_claims_skip_tasks_not_ready_or_not_due(repo: Repo) -> None:
    """A claim takes only ready tasks due by `until`: not a later one, not a cancelled one,
    not one already claimed; a claimed task counts once toward attempts."""
    due, later, gone = task(0), task(30), task(0)
    await repo.tasks.insert_batch([due, later, gone])
    assert await repo.tasks.cancel(gone.id, gone.target) == "cancelled"
    epoch = await repo.take_office()
    ids = [due.id, later.id, gone.id]
    claimed = await claim(repo.tasks, epoch, ids, NOW + timedelta(seconds=1))
    assert [(c.id, c.attempts) for c in claimed] == [(due.id, 1)]
    assert await claim(repo.tasks, epoch, ids, NOW + timedelta(seconds=1)) == []


async def test_a_claim_takes_only_tasks_due_within_a_minute(repo: Repo) -> None:
    """Whatever `until` asks, a claim takes no task due more than a minute after the store's
    own now (so every claimed task falls due within that minute: the orphan reclaim reads no
    further); a claimed task reads `claimed` and is refused by cancel and reschedule."""
    soon, far = task(0), task(3600)
    await repo.tasks.insert_batch([soon, far])
    epoch = await repo.take_office()
    claimed = await claim(repo.tasks, epoch, [soon.id, far.id], NOW + timedelta(hours=2))
    assert [c.id for c in claimed] == [soon.id]
    assert (await status(repo, soon), await status(repo, far)) == ("claimed", "pending")
    assert await repo.tasks.cancel(soon.id, soon.target) == "too_late"
    assert await repo.tasks.reschedule(soon.id, soon.target, NOW) == ("too_late", None)
    assert await repo.tasks.pending_count() == 1
    page = await repo.tasks.load_page((-1, 0, 0), NOW + timedelta(hours=2), 10)
    assert [r.task_id for r in page] == [far.id]  # a claimed task is not loaded again
    orphans = await repo.tasks.reclaim_orphans(await repo.take_office())
    assert [c.id for c in orphans.ready] == [soon.id]


async def test_payloads_come_back_within_the_byte_budget(repo: Repo) -> None:
    """Rows past the budget are claimed without payload (`parked`) and fetched later."""
    tasks = [task(0.001 * i, payload=b'{"p":"' + b"x" * 90 + b'"}') for i in range(4)]
    await repo.tasks.insert_batch(tasks)
    epoch = await repo.take_office()
    got = await repo.tasks.claim_within(epoch, [t.id for t in tasks], NOW + timedelta(1), 150)
    assert [c.id for c in got.ready] == [tasks[0].id, tasks[1].id]
    assert [c.id for c in got.parked] == [tasks[2].id, tasks[3].id]
    assert all(c.payload == b"" for c in got.parked)
    later = await repo.tasks.load_claimed(epoch, [c.id for c in got.parked], 10_000)
    assert [c.payload for c in later.ready] == [tasks[2].payload, tasks[3].payload]


async def test_cancel_and_reschedule_answer_by_status(repo: Repo) -> None:
    """Pending: cancelled or rescheduled. Claimed: too_late. Published without an ack (in
    doubt): in_flight, never cancelled. Unknown or another target: not_found."""
    pending, claimed, doubted = task(0), task(0), task(0)
    await repo.tasks.insert_batch([pending, claimed, doubted])
    epoch = await repo.take_office()
    taken = await claim(repo.tasks, epoch, [claimed.id, doubted.id], NOW + timedelta(seconds=1))
    retry: list[tuple[ClaimedTask, datetime, str, bool]] = [
        (c, NOW + timedelta(seconds=5), "ack lost", True) for c in taken if c.id == doubted.id
    ]
    await repo.tasks.retry_later(epoch, retry)
    assert await status(repo, doubted) == "in_doubt"
    assert await repo.tasks.cancel(claimed.id, claimed.target) == "too_late"
    assert await repo.tasks.cancel(doubted.id, doubted.target) == "in_flight"
    assert (await repo.tasks.reschedule(doubted.id, doubted.target, NOW))[0] == "in_flight"
    assert await repo.tasks.cancel(pending.id, "mq.t.other") == "not_found"
    moved, ref = await repo.tasks.reschedule(pending.id, pending.target, NOW + timedelta(9))
    assert moved == "rescheduled" and ref is not None
    assert ref.due_ms == to_ms(NOW + timedelta(9))
    assert await repo.tasks.cancel(pending.id, pending.target) == "cancelled"
    assert await repo.tasks.cancel(pending.id, pending.target) == "cancelled"
    assert (await repo.tasks.reschedule(pending.id, pending.target, NOW))[0] == "too_late"


async def test_a_rescheduled_tasks_ref_names_its_organisation(repo: Repo) -> None:
    """The heap ref a reschedule returns carries the task's `org_id`, so the leader's fair heap
    queues the moved task under its organisation (scheduler.engine.delayed.rescheduled)."""
    acme, none = task(60), task(60)
    acme.org_id = "acme"
    await repo.tasks.insert_batch([acme, none])
    for t, org in ((acme, "acme"), (none, None)):
        moved, ref = await repo.tasks.reschedule(t.id, t.target, NOW + timedelta(seconds=30))
        assert moved == "rescheduled" and ref is not None
        assert (ref.task_id, ref.org) == (t.id, org)


async def test_a_task_once_in_doubt_stays_in_doubt(repo: Repo) -> None:
    """A retry after a definite failure is pending again, unless the task was ever in doubt."""
    sure, doubt = task(0), task(0)
    await repo.tasks.insert_batch([sure, doubt])
    epoch = await repo.take_office()
    until = NOW + timedelta(seconds=60)
    taken = {c.id: c for c in await claim(repo.tasks, epoch, [sure.id, doubt.id], until)}
    soon = NOW + timedelta(seconds=1)
    await repo.tasks.retry_later(
        epoch, [(taken[sure.id], soon, "no stream", False), (taken[doubt.id], soon, "lost", True)]
    )
    assert (await status(repo, sure), await status(repo, doubt)) == ("pending", "in_doubt")
    again = {c.id: c for c in await claim(repo.tasks, epoch, [sure.id, doubt.id], until)}
    assert again[doubt.id].doubted and not again[sure.id].doubted
    later = NOW + timedelta(seconds=2)
    await repo.tasks.retry_later(epoch, [(again[doubt.id], later, "no stream", False)])
    assert await status(repo, doubt) == "in_doubt"
    overdue = await repo.tasks.overdue(NOW + timedelta(seconds=3), 10)
    assert {r.task_id for r in overdue} == {doubt.id}


async def test_bookkeeping_applies_to_the_writers_claims_only(repo: Repo) -> None:
    """Expire and kill change tasks claimed by the writer's epoch, and nothing else."""
    old_t, mine, dead = task(0), task(0), task(0)
    await repo.tasks.insert_batch([old_t, mine, dead])
    until = NOW + timedelta(seconds=1)
    old = await repo.take_office()
    await claim(repo.tasks, old, [old_t.id], until)
    new = await repo.take_office()
    claimed = {c.id: c for c in await claim(repo.tasks, new, [mine.id, dead.id], until)}
    await repo.tasks.expire(new, [old_t.id, mine.id])
    await repo.tasks.kill(new, [(claimed[dead.id], "too many attempts", "publish_failed")])
    states = [await status(repo, t) for t in (old_t, mine, dead)]
    assert states == ["claimed", "expired", "dead"]


async def _fire(repo: Repo, t: NewTask, seq: int = 7) -> ClaimedTask:
    epoch = await repo.take_office()
    (claimed,) = await claim(repo.tasks, epoch, [t.id], NOW + timedelta(seconds=1))
    await repo.tasks.mark_fired(epoch, [Fired(claimed, NOW, "S", seq)], "a")
    return claimed


async def test_a_fired_task_row_is_gone_and_its_state_kept(repo: Repo) -> None:
    """Marking a task fired deletes its row (the table holds only unfired tasks); `get` still
    answers fired with its delivery, cancel and reschedule answer too_late (not_found for
    another target), and booking the same delivery again changes nothing."""
    t, other = task(0), task(30)
    await repo.tasks.insert_batch([t, other])
    claimed = await _fire(repo, t)
    assert not await repo.has_row(t.id) and await repo.has_row(other.id)
    assert await repo.tasks.pending_count() == 1
    got = await repo.tasks.get(t.id, t.target)
    assert got is not None
    assert (got["status"], got["fired_at"], got["stream_seq"]) == ("fired", NOW, 7)
    assert (got["attempts"], got["scheduled_for"]) == (1, t.scheduled_for)
    assert await repo.tasks.get(t.id, "mq.t.other") is None
    assert await repo.tasks.cancel(t.id, t.target) == "too_late"
    assert await repo.tasks.reschedule(t.id, t.target, NOW + timedelta(9)) == ("too_late", None)
    assert await repo.tasks.cancel(t.id, "mq.t.other") == "not_found"
    epoch = await repo.take_office()
    await repo.tasks.mark_fired(epoch, [Fired(claimed, NOW, "S", 7)], "a")
    assert (await repo.tasks.get(t.id) or {}).get("status") == "fired"
    assert await claim(repo.tasks, epoch, [t.id], NOW + timedelta(seconds=1)) == []


async def test_a_fired_id_is_refused_within_the_retention(repo: Repo) -> None:
    """A task id that fired is not stored again: an exact resend is `resent` (a no-op, as for
    a stored task) and another task with that id is `taken` (duplicate_id), alone or in a
    batch beside new tasks; nothing of it becomes claimable."""
    t = task(0)
    await repo.tasks.insert_batch([t])
    await _fire(repo, t)
    same = NewTask(t.id, t.target, t.payload, {}, 5, t.due_at, t.due_at, None)
    other = NewTask(t.id, t.target, b'{"x":1}', {}, 5, t.due_at, t.due_at, None)
    elsewhere = NewTask(t.id, "mq.t.other", t.payload, {}, 5, t.due_at, t.due_at, None)
    fresh = task(0)
    got = await repo.tasks.insert_batch([same, fresh, other, elsewhere])
    assert [r.task_id for r in got.stored] == [fresh.id]
    assert (got.resent, got.taken) == ([same], [other, elsewhere])
    assert await insert(repo.tasks, [other]) == []
    assert not await repo.has_row(t.id)
    assert [r.task_id for r in await repo.tasks.overdue(NOW + timedelta(1), 10)] == [fresh.id]


async def test_unfinished_tasks_are_counted_per_org(repo: Repo) -> None:
    """`pending_by_org` counts pending, in-doubt and claimed tasks per organisation (none for
    tasks without one under None); fired, expired and cancelled ones leave the count."""
    due = NOW + timedelta(seconds=0)

    def of(org: str | None) -> NewTask:
        t = task(0)
        return NewTask(t.id, t.target, t.payload, {}, 5, due, due, None, org_id=org)

    a1, a2, a3, a4, b1, none = of("a"), of("a"), of("a"), of("a"), of("b"), of(None)
    gone = of("b")
    await repo.tasks.insert_batch([a1, a2, a3, a4, b1, none, gone])
    assert await repo.tasks.cancel(gone.id, gone.target) == "cancelled"
    epoch = await repo.take_office()
    until = NOW + timedelta(seconds=1)
    claimed = {c.id: c for c in await claim(repo.tasks, epoch, [a1.id, a2.id, a3.id, b1.id], until)}
    await repo.tasks.retry_later(epoch, [(claimed[a2.id], until, "ack lost", True)])
    await repo.tasks.mark_fired(epoch, [Fired(claimed[a3.id], NOW, "S", 1)], "x")
    await repo.tasks.expire(epoch, [b1.id])
    assert await repo.tasks.pending_by_org() == {"a": 3, None: 1}


async def test_a_stored_task_holds_the_partition_of_its_id(database: str | None) -> None:
    """Under P = 8 each stored task holds `partition_of(id, 8)`, a task taking over its id's
    reschedule intent too; under P = 1 every task is in partition 0."""
    async with open_repo(database, partitions=8) as repo:
        tasks = [task(1) for _ in range(16)]
        waited = task(1)
        await repo.tasks.reschedule(waited.id, waited.target, NOW + timedelta(minutes=5))
        await repo.tasks.insert_batch([*tasks, waited])
        stored = [await repo.partition(t.id) for t in [*tasks, waited]]
        assert stored == [partition_of(t.id, 8) for t in [*tasks, waited]]
        assert len(set(stored)) > 1
    async with open_repo(database) as repo:
        tasks = [task(1) for _ in range(4)]
        await repo.tasks.insert_batch(tasks)
        assert [await repo.partition(t.id) for t in tasks] == [0] * 4


# -- cancel and reschedule intents: a task still on the delay lane (issue 25 item 5) ---------


async def test_a_cancel_before_arrival_stores_the_task_cancelled(repo: Repo) -> None:
    """A cancel for an id not stored answers `cancelled` (again: `cancelled`); the task
    arriving later is stored cancelled, reported as such, and never loaded to fire."""
    t = task(0)
    assert await repo.tasks.cancel(t.id, t.target) == "cancelled"
    assert await repo.tasks.cancel(t.id, t.target) == "cancelled"
    got = await repo.tasks.insert_batch([t])
    assert got.stored == [] and [c.id for c in got.cancelled] == [t.id]
    assert await status(repo, t) == "cancelled"
    assert await repo.tasks.load_page((0, 0, 0), NOW + timedelta(hours=1), 10) == []
    assert await repo.tasks.cancel(t.id, t.target) == "cancelled"


async def test_a_reschedule_before_arrival_stores_the_task_at_the_new_time(repo: Repo) -> None:
    """A reschedule for an id not stored answers `rescheduled` with no heap ref; the task
    arriving later is stored pending at the new time. A reschedule after a cancel intent is
    `too_late` (a cancel is never undone)."""
    t, c = task(0), task(0)
    later = NOW + timedelta(minutes=5)
    assert await repo.tasks.reschedule(t.id, t.target, later) == ("rescheduled", None)
    got = await repo.tasks.insert_batch([t])
    assert [r.task_id for r in got.stored] == [t.id] and got.cancelled == []
    assert got.stored[0].due_ms == to_ms(later)
    assert await status(repo, t) == "pending"
    assert await repo.tasks.cancel(c.id, c.target) == "cancelled"
    assert (await repo.tasks.reschedule(c.id, c.target, later))[0] == "too_late"


async def test_an_intent_leaves_another_targets_task_alone(repo: Repo) -> None:
    """An intent acts only on its target's task: a task of another target with that id takes
    the id and is stored as sent; a cancel of another target meeting a live intent answers
    `id_contended`; a cancel naming another target than a stored task's is `not_found`."""
    t = task(0, target="mq.t.mine")
    assert await repo.tasks.cancel(t.id, "mq.t.other") == "cancelled"
    assert await repo.tasks.cancel(t.id, t.target) == "id_contended"
    got = await repo.tasks.insert_batch([t])
    assert [r.task_id for r in got.stored] == [t.id] and got.cancelled == []
    assert await status(repo, t) == "pending"
    assert await repo.tasks.cancel(t.id, "mq.t.other") == "not_found"


async def test_intents_are_capped_per_target(repo: Repo) -> None:
    """Past `max_per_target` live intents a target's cancel of a new id answers
    `too_many_intents` and records nothing (the task then arrives pending); another target
    is not affected, and renewing a held intent is not counted again."""
    held = [task(0) for _ in range(LIMITS.max_per_target)]
    for t in held:
        assert await repo.tasks.cancel(t.id, t.target) == "cancelled"
    extra = task(0)
    assert await repo.tasks.cancel(extra.id, extra.target) == "too_many_intents"
    assert (await repo.tasks.reschedule(extra.id, extra.target, NOW))[0] == "too_many_intents"
    assert await repo.tasks.cancel(held[0].id, held[0].target) == "cancelled"
    other = task(0, target="mq.t.y")
    assert await repo.tasks.cancel(other.id, other.target) == "cancelled"
    got = await repo.tasks.insert_batch([extra])
    assert [r.task_id for r in got.stored] == [extra.id]


async def test_intents_are_capped_per_organisation_and_in_total(repo: Repo) -> None:
    """Past `max_per_org` live intents over an organisation's targets a cancel of a new id
    there answers `too_many_intents_org`, past `max_total` anywhere `too_many_intents_total`,
    recording nothing; a stored task is still cancelled past both."""
    repo.tasks.intent_limits = IntentLimits(timedelta(minutes=1), 3, max_per_org=2, max_total=3)
    acme = [task(0, target=f"mq.org.acme.t{n}") for n in range(3)]
    assert [await repo.tasks.cancel(t.id, t.target) for t in acme[:2]] == ["cancelled"] * 2
    assert await repo.tasks.cancel(acme[2].id, acme[2].target) == "too_many_intents_org"
    assert (await repo.tasks.reschedule(acme[2].id, acme[2].target, NOW))[0] == (
        "too_many_intents_org"
    )
    plain, more = task(0, target="mq.t.a"), task(0, target="mq.t.b")
    assert await repo.tasks.cancel(plain.id, plain.target) == "cancelled"
    assert await repo.tasks.cancel(more.id, more.target) == "too_many_intents_total"
    stored = task(3600, target="mq.t.b")
    await repo.tasks.insert_batch([stored])
    assert await repo.tasks.cancel(stored.id, stored.target) == "cancelled"
    got = await repo.tasks.insert_batch([acme[2], more])
    assert sorted(r.task_id for r in got.stored) == sorted([acme[2].id, more.id])
    assert await status(repo, acme[2]) == "pending"


async def test_a_lapsed_intent_is_not_honoured(repo: Repo) -> None:
    """An intent older than its TTL no longer acts: the task arriving after it is stored
    pending as sent, and the lapsed intent does not count against the cap."""
    repo.tasks.intent_limits = IntentLimits(ttl=timedelta(milliseconds=200), max_per_target=1)
    t, u = task(0), task(0)
    assert await repo.tasks.cancel(t.id, t.target) == "cancelled"
    await asyncio.sleep(0.3)  # past the TTL on the store's own clock (PostgreSQL's now())
    assert await repo.tasks.cancel(u.id, u.target) == "cancelled"  # the lapsed one not counted
    got = await repo.tasks.insert_batch([t])
    assert [r.task_id for r in got.stored] == [t.id] and got.cancelled == []
    assert await status(repo, t) == "pending"


async def test_the_current_epoch_is_the_latest_taken(repo: Repo) -> None:
    """`current_epoch` answers the fencing epoch now in force: the one taken last."""
    first = await repo.take_office()
    assert await repo.tasks.current_epoch() == first
    second = await repo.take_office()
    assert second > first and await repo.tasks.current_epoch() == second


def bad_intake(key: str, original_id: str) -> dict[str, Any]:
    return {
        "original_id": original_id,
        "subject": "mq.delay.t.x",
        "error": "not JSON",
        "reason": "invalid_envelope",
        "target": "mq.t.x",
        "raw": b"{not json",
        "headers": {"Nats-Msg-Id": original_id},
        "key": key,
    }


async def test_a_bad_intake_message_is_recorded_once(repo: Repo) -> None:
    """`record_bad_intake` keeps a dead letter per refused lane message; the same message
    recorded again (a redelivery, the same key) adds nothing, another one is kept too."""
    key, other = f"dlq-intake:{uuid.uuid4().hex}", f"dlq-intake:{uuid.uuid4().hex}"
    await repo.tasks.record_bad_intake([bad_intake(key, "a")])
    await repo.tasks.record_bad_intake([bad_intake(key, "a"), bad_intake(other, "b")])
    await repo.tasks.record_bad_intake([])
    assert await repo.dead_intake(key) == [("a", "invalid_envelope")]
    assert await repo.dead_intake(other) == [("b", "invalid_envelope")]


async def test_analyze_if_stale_runs_only_after_growth(repo: Repo) -> None:
    """`analyze_if_stale` answers whether it refreshed the statistics; with no task stored
    since its last answer it does not run again."""
    assert isinstance(await repo.tasks.analyze_if_stale(), bool)
    assert await repo.tasks.analyze_if_stale() is False


async def test_a_lane_note_names_the_target_while_an_intent_would_live(repo: Repo) -> None:
    """A note gives back the target of a task put on the delay lane; a later note for the id
    replaces it; an id never noted has none; a note lives as long as an intent (its TTL)."""
    await repo.tasks.note_lane("n-1", "mq.t.a")
    assert await repo.tasks.lane_target("n-1") == "mq.t.a"
    await repo.tasks.note_lane("n-1", "mq.t.b")
    assert await repo.tasks.lane_target("n-1") == "mq.t.b"
    assert await repo.tasks.lane_target("n-2") is None
    repo.tasks.intent_limits = IntentLimits(ttl=timedelta(0))
    await repo.tasks.note_lane("n-3", "mq.t.a")
    assert await repo.tasks.lane_target("n-3") is None, "a note past its TTL still answered"
