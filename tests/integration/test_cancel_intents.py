"""A cancel (or reschedule) sent right after the PubAck holds, whichever of intake and the
cancel reaches PostgreSQL first (issue 25 item 5): real nats-server, PostgreSQL and daemon."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, KeyValueConfig, StorageType

from scheduler import client
from scheduler.metrics import Metrics
from scheduler.records import NewTask
from scheduler.settings import Settings
from scheduler.store.postgres import intents, task_admin
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.tasks import TaskStore
from tests.support.helpers import DaemonRunner, waiting_on_locks

TARGET = "mq.tasks.work"


def envelope(due: datetime) -> dict[str, Any]:
    return {
        "schema": "hanzo.mq.v1",
        "id": f"t_{uuid.uuid4().hex}",
        "type": "test.work",
        "source": "tests",
        "timestamp": datetime.now(UTC).isoformat(),
        "delay_until": due.isoformat(),
        "data": {"n": 1},
    }


def new_task(task_id: str, target: str = TARGET, due: datetime | None = None) -> NewTask:
    due = due or datetime.now(UTC) + timedelta(hours=1)
    return NewTask(task_id, target, b'{"a":1}', {}, 5, due, due, None)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[tuple[TaskStore, asyncpg.Pool]]:
    pool = await create_pool(database_url, min_size=1, max_size=6)
    try:
        yield TaskStore(PostgresStore(pool, Metrics()), IntentLimits(max_per_target=3)), pool
    finally:
        await pool.close()


async def blocked_on_lock(pool: asyncpg.Pool, work: asyncio.Task[Any]) -> None:
    """Wait (bounded) until `work` is done or some statement waits on a lock."""
    async with asyncio.timeout(5):
        while not work.done():
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if waiting:
                return
            await asyncio.sleep(0.01)


def seam(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str
) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold `module.name` (an async function) until `release` is set; `reached` is set once
    its caller has run the statements before it, inside the caller's open transaction."""
    reached, release = asyncio.Event(), asyncio.Event()
    original: Callable[..., Awaitable[Any]] = getattr(module, name)

    async def held(*args: Any) -> Any:
        reached.set()
        await release.wait()
        return await original(*args)

    monkeypatch.setattr(module, name, held)
    return reached, release


async def test_cancel_waits_for_an_intake_insert_in_flight_and_cancels_the_task(
    store: tuple[TaskStore, asyncpg.Pool], database_url: str
) -> None:
    """Intake first: its insert has stored the task but not committed when the cancel runs
    (it waits on a batch neighbour's id, held by another transaction); the cancel waits on the
    id, then cancels the stored task (`cancelled`), and a claim finds nothing."""
    tasks, pool = store
    task, neighbour = new_task(f"t_{uuid.uuid4().hex}"), new_task(f"t_{uuid.uuid4().hex}")
    blocker = await asyncpg.connect(database_url)
    try:
        hold = blocker.transaction()
        await hold.start()
        await blocker.execute(
            "INSERT INTO delayed_messages (id, target, payload, due_at, scheduled_for) "
            "VALUES ($1, $2, ''::bytea, now(), now())",
            neighbour.id,
            TARGET,
        )
        # `task` first: inserted, then the insert waits on the neighbour's uncommitted row.
        inserting = asyncio.create_task(tasks.insert_batch([task, neighbour]))
        await waiting_on_locks(pool, 1)
        cancelling = asyncio.create_task(tasks.cancel(task.id, TARGET))
        await waiting_on_locks(pool, 2)
        assert not cancelling.done()
        await hold.rollback()
    finally:
        await blocker.close()
    async with asyncio.timeout(5):
        answer, insertion = await cancelling, await inserting
    assert answer == "cancelled"
    assert sorted(r.task_id for r in insertion.stored) == sorted([task.id, neighbour.id])
    assert (await tasks.get(task.id) or {}).get("status") == "cancelled"
    epoch = await pool.fetchval("UPDATE leadership SET epoch = epoch + 1 RETURNING epoch")
    far = datetime.now(UTC) + timedelta(days=1)
    claimed = await tasks.claim_within(epoch, [task.id], far, 1 << 20)
    assert not claimed.ready and not claimed.parked


async def test_intake_waits_for_a_cancel_intent_in_flight_and_honours_it(
    store: tuple[TaskStore, asyncpg.Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancel first: its intent is recorded but uncommitted when intake inserts the task;
    intake waits on the id, then stores the task cancelled (acked, never armed)."""
    tasks, pool = store
    task = new_task(f"t_{uuid.uuid4().hex}")
    reached, release = seam(
        monkeypatch, intents, "drop_if_fired"
    )  # after the intent, before commit
    cancelling = asyncio.create_task(tasks.cancel(task.id, TARGET))
    async with asyncio.timeout(5):
        await reached.wait()
    inserting = asyncio.create_task(tasks.insert_batch([task]))
    await blocked_on_lock(pool, inserting)
    assert not inserting.done()
    release.set()
    async with asyncio.timeout(5):
        answer, insertion = await cancelling, await inserting
    assert answer == "cancelled"
    assert insertion.stored == [] and insertion.taken == [] and insertion.resent == []
    assert [t.id for t in insertion.cancelled] == [task.id]
    row = await pool.fetchrow("SELECT status, payload FROM delayed_messages WHERE id = $1", task.id)
    assert row is not None
    assert (row["status"], bytes(row["payload"])) == ("cancelled", task.payload)
    again = await tasks.insert_batch([task])  # the producer's exact resend: a no-op
    assert again.resent == [task] and again.stored == [] and again.cancelled == []


def commit_between(
    monkeypatch: pytest.MonkeyPatch, tasks: TaskStore, task: NewTask
) -> list[str | None]:
    """Intake commits the task between the cancel's (or reschedule's) UPDATE, which missed
    it, and its status read: `_answer_status` stores the task first, on its own connection,
    once. Returns the statuses the read saw."""
    original = task_admin._answer_status
    seen: list[str | None] = []

    async def late_commit(conn: asyncpg.Connection, task_id: str, target: str) -> str | None:
        if not seen:
            await tasks.insert_batch([task])
        status = await original(conn, task_id, target)
        seen.append(status)
        return status

    monkeypatch.setattr(task_admin, "_answer_status", late_commit)
    return seen


@pytest.mark.parametrize("verb", ["cancel", "reschedule"])
async def test_a_task_stored_between_the_update_and_the_status_read_is_still_acted_on(
    store: tuple[TaskStore, asyncpg.Pool], monkeypatch: pytest.MonkeyPatch, verb: str
) -> None:
    """Intake commits the task after the cancel's UPDATE missed it and before the cancel reads
    its status: the answer is `cancelled` (or `rescheduled`) and the row says so, never
    `too_late` for a pending task that would then be delivered."""
    tasks, _ = store
    task = new_task(f"t_{uuid.uuid4().hex}")
    seen = commit_between(monkeypatch, tasks, task)
    new_due = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=3)
    if verb == "cancel":
        assert await tasks.cancel(task.id, TARGET) == "cancelled"
        assert (await tasks.get(task.id) or {}).get("status") == "cancelled"
    else:
        status, ref = await tasks.reschedule(task.id, TARGET, new_due)
        assert status == "rescheduled" and ref is not None and ref.task_id == task.id
        got = await tasks.get(task.id)
        assert got is not None and (got["status"], got["due_at"]) == ("pending", new_due)
    assert seen[0] == "pending"  # the race happened: the read saw the task the UPDATE missed


async def test_reschedule_intent_moves_the_task_when_it_arrives(
    store: tuple[TaskStore, asyncpg.Pool],
) -> None:
    """A reschedule before intake answers `rescheduled`; the task is stored due at the new
    time only."""
    tasks, _ = store
    task = new_task(f"t_{uuid.uuid4().hex}")
    new_due = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=3)
    status, ref = await tasks.reschedule(task.id, TARGET, new_due)
    assert (status, ref) == ("rescheduled", None)
    insertion = await tasks.insert_batch([task])
    assert [r.task_id for r in insertion.stored] == [task.id]
    got = await tasks.get(task.id)
    assert got is not None and (got["status"], got["due_at"]) == ("pending", new_due)


async def test_an_intent_never_touches_another_targets_task(
    store: tuple[TaskStore, asyncpg.Pool],
) -> None:
    """A cancel naming another target records an intent that the task ignores: stored as sent
    (pending), replacing the intent; the other target's cancel then answers `not_found`."""
    tasks, _ = store
    task = new_task(f"t_{uuid.uuid4().hex}")
    assert await tasks.cancel(task.id, "mq.tasks.other") == "cancelled"  # an intent
    assert await tasks.cancel(task.id, TARGET) == "id_contended"  # held by the other's intent
    insertion = await tasks.insert_batch([task])
    assert [r.task_id for r in insertion.stored] == [task.id]
    assert (await tasks.get(task.id) or {}).get("status") == "pending"
    assert await tasks.cancel(task.id, "mq.tasks.other") == "not_found"
    assert await tasks.cancel(task.id, TARGET) == "cancelled"


async def test_intents_are_bounded_per_target_and_lapse(
    store: tuple[TaskStore, asyncpg.Pool],
) -> None:
    """Past SCHEDULER_INTENT_MAX_PER_TARGET live intents a cancel of an unknown id records
    nothing (`too_many_intents`); a cancel of a stored task still works; lapsed intents are
    purged and no longer honoured."""
    tasks, pool = store
    ids = [f"t_{uuid.uuid4().hex}" for _ in range(4)]
    assert [await tasks.cancel(i, TARGET) for i in ids[:3]] == ["cancelled"] * 3
    assert await tasks.cancel(ids[3], TARGET) == "too_many_intents"
    assert await tasks.cancel(ids[3], "mq.tasks.other") == "cancelled"  # another target's share
    stored = new_task(f"t_{uuid.uuid4().hex}")
    await tasks.insert_batch([stored])
    assert await tasks.cancel(stored.id, TARGET) == "cancelled"
    await pool.execute(
        "UPDATE delayed_messages SET expires_at = now() - interval '1 second' WHERE id = $1",
        ids[0],
    )
    insertion = await tasks.insert_batch([new_task(ids[0])])  # lapsed: stored as sent
    assert [r.task_id for r in insertion.stored] == [ids[0]]
    await pool.execute(
        "UPDATE delayed_messages SET expires_at = now() - interval '1 second' WHERE id = $1",
        ids[1],
    )
    await tasks.purge_finished(14)
    assert await pool.fetchval("SELECT count(*) FROM delayed_messages WHERE id = $1", ids[1]) == 0


async def test_a_cancel_after_the_task_fired_records_no_intent(
    store: tuple[TaskStore, asyncpg.Pool],
) -> None:
    """A fired task's id (tombstone) answers `too_late` and stores nothing."""
    tasks, pool = store
    task_id = f"t_{uuid.uuid4().hex}"
    await pool.execute(
        "INSERT INTO fired_tasks (id, target, digest, fired_at) VALUES ($1, $2, "
        "md5('x')::uuid, now())",
        task_id,
        TARGET,
    )
    assert await tasks.cancel(task_id, TARGET) == "too_late"
    assert await pool.fetchval("SELECT count(*) FROM delayed_messages WHERE id = $1", task_id) == 0


# -- end to end: a daemon whose intake is held (another holds the lease) ---------------------


async def hold_lease(js: Any, settings: Settings) -> Any:
    """Create the leader bucket and take its key, so the daemon stands by: it serves the NATS
    API but does not pull the delay lane until the key is deleted."""
    kv = await js.create_key_value(
        KeyValueConfig(
            bucket=settings.leader_bucket,
            history=1,
            ttl=settings.lease_ttl,
            storage=StorageType.FILE,
        )
    )
    await kv.create("leader", b"someone-else")
    return kv


async def delivered(js: Any, within: float) -> dict[str, datetime]:
    """Task id -> arrival time of every message on TASKS after `within` seconds of quiet."""
    psub = await js.pull_subscribe(
        ">", durable=None, stream="TASKS", config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    out: dict[str, datetime] = {}
    try:
        async with asyncio.timeout(within + 5):
            while True:
                try:
                    msgs = await psub.fetch(100, timeout=within)
                except TimeoutError:
                    break
                for m in msgs:
                    out[json.loads(m.data)["id"]] = m.metadata.timestamp
    finally:
        await psub.unsubscribe()
    return out


async def test_cancel_and_reschedule_right_after_the_puback_hold(settings: Settings) -> None:
    """N tasks published with nats-py and cancelled (or rescheduled) at once after their PubAck,
    while intake is held: every answer is `cancelled` (`rescheduled`), no cancelled task is
    ever delivered, and each rescheduled one arrives once, not before its new time."""
    settings = settings.with_overrides(lease_ttl=30.0)
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    kv = await hold_lease(js, settings)
    runner = DaemonRunner(settings)
    try:
        await runner.start()
        soon = datetime.now(UTC) + timedelta(seconds=1)
        cancel_answers, cancelled = [], []
        for _ in range(20):
            doc = envelope(soon)
            await client.publish_delayed(js, TARGET, doc)
            cancel_answers.append((await client.cancel(nc, TARGET, doc["id"]))["status"])
            cancelled.append(doc["id"])
        new_due = datetime.now(UTC) + timedelta(seconds=4)
        moved_answers, moved = [], []
        for _ in range(20):
            doc = envelope(soon)
            await client.publish_delayed(js, TARGET, doc)
            reply = await client.reschedule(nc, TARGET, doc["id"], new_due)
            moved_answers.append(reply["status"])
            moved.append(doc["id"])
        assert cancel_answers == ["cancelled"] * 20
        assert moved_answers == ["rescheduled"] * 20
        await kv.delete("leader")  # the daemon takes office and drains the lane
        got = await delivered(js, within=max((new_due - datetime.now(UTC)).total_seconds(), 0) + 2)
        assert sorted(got) == sorted(moved)  # none of the cancelled, each moved one
        assert all(at >= new_due - timedelta(milliseconds=5) for at in got.values())
        for task_id in cancelled:
            assert (await client.get(nc, TARGET, task_id))["task"]["status"] == "cancelled"
    finally:
        await runner.stop()
        await nc.close()


# -- issue 25 item 6: no producer's message id suppresses another's task ---------------------


async def test_a_producer_cannot_silently_suppress_anothers_task(settings: Settings) -> None:
    """Producer A publishes id X with `Nats-Msg-Id: X` (bytes 1); producer B then publishes its
    own task X (bytes 2) with the client library: B's task is not dropped by the lane's
    duplicate window but reaches the daemon and is visibly refused (`duplicate_id`, dead-
    lettered), and A's task is delivered once."""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    runner = DaemonRunner(settings)
    try:
        await runner.start()
        soon = datetime.now(UTC) + timedelta(milliseconds=500)
        first = envelope(soon)
        second = {**first, "data": {"n": 2}}
        raw_a = json.dumps(first).encode()
        await js.publish(f"mq.delay.{TARGET[3:]}", raw_a, headers={"Nats-Msg-Id": first["id"]})
        ack_b = await client.publish_delayed(js, TARGET, second)
        assert not ack_b.duplicate  # stored on the lane: the daemon sees it
        got = await delivered(js, within=2)
        assert list(got) == [first["id"]]
        pool = runner.daemon.tasks.db.pool  # type: ignore[union-attr]
        refused = 0
        async with asyncio.timeout(10):
            while not refused:  # the daemon writes it after the ack: poll, bounded
                refused = await pool.fetchval(
                    "SELECT count(*) FROM dead_letters WHERE original_id = $1 AND reason = "
                    "'duplicate_id'",
                    first["id"],
                )
                await asyncio.sleep(0.05)
        assert refused == 1
    finally:
        await runner.stop()
        await nc.close()
