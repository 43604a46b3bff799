"""The operators' reads of delayed tasks (`scheduler.operations.stores.TaskReads`), over the
in-memory twin and PostgreSQL alike: held tasks in firing order with every filter and keyset
pages, fired tasks from their deliveries and tombstones in the order they fired, each listed
as the same summary text, and one task's detail while held and once fired."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.clock import to_rfc3339_us
from scheduler.metrics import Metrics
from scheduler.operations.stores import TaskFilter, TaskReads
from scheduler.records import ClaimedTask, Fired, NewTask
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.memory_task_reads import MemoryTaskReads
from scheduler.store.postgres.task_rows import micros
from tests.contracts.admin import StoredTasks
from tests.support.stores import claim

NOW = datetime.now(UTC).replace(microsecond=0)
S = timedelta(seconds=1)
AHEAD = NOW + timedelta(days=3)  # held tasks nobody claims
EVERY = TaskFilter()


@dataclass
class Reads:
    tasks: StoredTasks
    reads: TaskReads
    take_office: Callable[[], Awaitable[int]]

    async def ids(self, where: TaskFilter = EVERY, limit: int = 100) -> list[str]:
        return [json.loads(r.doc)["id"] for r in await self.reads.tasks(where, None, limit)]

    async def fired_ids(self, where: TaskFilter = EVERY, limit: int = 100) -> list[str]:
        return [json.loads(r.doc)["id"] for r in await self.reads.fired(where, None, limit)]


@pytest.fixture
async def store(database: str | None) -> AsyncIterator[Reads]:
    if database is None:
        tasks = MemoryTaskStore()
        yield Reads(tasks, MemoryTaskReads(tasks), lambda: tasks.take_office("t"))
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.overview import OverviewStore
    from scheduler.store.postgres.tasks import TaskStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        db = PostgresStore(pool, Metrics())
        yield Reads(TaskStore(db), OverviewStore(db), lambda: take_office(pool, "t"))
    finally:
        await pool.close()


def _task(
    name: str,
    due: datetime,
    target: str = "mq.t.a",
    priority: int = 5,
    org: str | None = None,
    payload: bytes = b"{}",
) -> NewTask:
    return NewTask(name, target, payload, {"H": "v"}, priority, due, due, None, org_id=org)


async def _claimed(store: Reads, *tasks: NewTask) -> tuple[int, list[ClaimedTask]]:
    """`tasks` stored and claimed by a new epoch, in firing order."""
    await store.tasks.insert_batch(tasks)
    epoch = await store.take_office()
    claimed = await claim(store.tasks, epoch, [t.id for t in tasks], NOW + S)
    assert len(claimed) == len(tasks)
    return epoch, claimed


async def test_held_tasks_list_in_firing_order_and_each_filter_narrows_them(store: Reads) -> None:
    """Every held task lists in firing order (due, then priority), whatever its status, which is
    reported (`claimed` for a claimed one); subject (exact or a `.>` prefix), org, status (pending
    and in_doubt meaning not claimed) and the due window [after, before) each narrow the list."""
    await store.tasks.insert_batch(
        [
            _task("ha", AHEAD + 2 * S, org="org-a"),
            _task("hb", AHEAD + S, "mq.t.b", priority=9, org="org-b"),
            _task("hc", AHEAD + S, "mq.u.c", priority=1),
            _task("hd", AHEAD + 3 * S, "mq.t.b"),
            _task("he", AHEAD + 4 * S, "mq.tt"),
        ]
    )
    assert await store.tasks.cancel("hd", "mq.t.b") == "cancelled"
    epoch, (done, doubt, _) = await _claimed(
        store, _task("xa", NOW - 3 * S), _task("xb", NOW - 2 * S), _task("xc", NOW - S)
    )
    await store.tasks.kill(epoch, [(done, "boom", "publish_failed")])
    await store.tasks.retry_later(epoch, [(doubt, NOW - 2 * S, "no ack", True)])
    assert await store.ids() == ["xa", "xb", "xc", "hc", "hb", "ha", "hd", "he"]
    statuses = [json.loads(r.doc)["status"] for r in await store.reads.tasks(EVERY, None, 10)]
    assert statuses == [
        *("dead", "in_doubt", "claimed", "pending", "pending", "pending", "cancelled", "pending")
    ]
    assert await store.ids(TaskFilter(subject="mq.t.b")) == ["hb", "hd"]
    assert await store.ids(TaskFilter(subject="mq.t.>")) == ["xa", "xb", "xc", "hb", "ha", "hd"]
    assert await store.ids(TaskFilter(subject="mq.t")) == []
    assert await store.ids(TaskFilter(org_id="org-a")) == ["ha"]
    assert await store.ids(TaskFilter(status="pending")) == ["hc", "hb", "ha", "he"]
    assert await store.ids(TaskFilter(status="claimed")) == ["xc"]
    assert await store.ids(TaskFilter(status="in_doubt")) == ["xb"]
    assert await store.ids(TaskFilter(status="cancelled", subject="mq.t.b")) == ["hd"]
    assert await store.ids(TaskFilter(status="fired")) == []
    window = TaskFilter(due_after=AHEAD + S, due_before=AHEAD + 3 * S)
    assert await store.ids(window) == ["hc", "hb", "ha"]
    assert await store.ids(TaskFilter(due_before=AHEAD)) == ["xa", "xb", "xc"]
    assert await store.ids(limit=2) == ["xa", "xb"]


async def test_held_tasks_page_by_their_key(store: Reads) -> None:
    """A held task's key is its due time in microseconds, its priority and its intake sequence
    (ties of due and priority go in intake order); a page after a key starts right after it."""
    due = AHEAD.replace(microsecond=250)
    await store.tasks.insert_batch([_task("pa", due, priority=3)])
    await store.tasks.insert_batch([_task("pb", due, priority=3)])
    await store.tasks.insert_batch([_task("pc", due, priority=1), _task("pd", due + S)])
    first = await store.reads.tasks(EVERY, None, 2)
    assert [json.loads(r.doc)["id"] for r in first] == ["pc", "pa"]
    assert [r.key[:2] for r in first] == [(micros(due), 1), (micros(due), 3)]
    key = first[-1].key
    rest = await store.reads.tasks(EVERY, (due, key[1], key[2]), 10)
    assert [json.loads(r.doc)["id"] for r in rest] == ["pb", "pd"]
    assert rest[0].key[2] > key[2] and rest[1].key[:2] == (micros(due + S), 5)
    assert await store.reads.tasks(EVERY, (due + S, 5, rest[1].key[2]), 10) == []


async def test_a_listed_task_is_its_summary_as_postgresql_writes_it(store: Reads) -> None:
    """A listed task is its summary's JSON text in PostgreSQL's form: the model's fields in order,
    ` : ` and `, ` between them, strings escaped only where JSON must (a quote, a backslash, a
    control) and instants in UTC with six fraction digits and `Z`."""
    target = 'mq.t\u00e2ches."q"\\b\t\x01\x7f.\u2028\U0001f600'
    due = datetime(2031, 3, 4, 5, 6, 7, 120_000, tzinfo=UTC)
    task = NewTask("odd-1", target, b"{}", {}, 7, due, due.replace(microsecond=0), None)
    await store.tasks.insert_batch([task])
    (listed,) = await store.reads.tasks(EVERY, None, 10)
    created = json.loads(listed.doc)["created_at"]
    assert listed.doc == (
        '{"id" : "odd-1", "target" : "mq.t\u00e2ches.\\"q\\"\\\\b\\t\\u0001\x7f.\u2028\U0001f600", '
        '"status" : "pending", "priority" : 7, "due_at" : "2031-03-04T05:06:07.120000Z", '
        '"scheduled_for" : "2031-03-04T05:06:07.000000Z", "expires_at" : null, "attempts" : 0, '
        f'"created_at" : "{created}", "fired_at" : null}}'
    )
    at = datetime.fromisoformat(created.replace("Z", "+00:00"))
    assert created.endswith("Z") and abs(at - datetime.now(UTC)) < timedelta(minutes=1)


async def _fire(store: Reads, tasks: list[NewTask], fired_at: list[datetime]) -> None:
    """Claim `tasks` (due now) and record them fired at `fired_at`, one each."""
    epoch, claimed = await _claimed(store, *tasks)
    by_id = {c.id: c for c in claimed}
    fired = [
        Fired(by_id[t.id], at, "TASKS", n)
        for n, (t, at) in enumerate(zip(tasks, fired_at, strict=True), 1)
    ]
    await store.tasks.mark_fired(epoch, fired, "i-1")


async def test_fired_tasks_list_in_the_order_they_fired_with_filters_and_pages(
    store: Reads,
) -> None:
    """Fired tasks list by fired time, then id; each shows its delivery's due time and attempt,
    with no priority, expiry or creation; subject and due window read the delivery; a page
    after a key (fired time in microseconds, id) starts right after it."""
    due = [NOW - 3 * S, NOW - 2 * S, NOW - S, NOW - 2 * S]
    tasks = [
        _task("fc", due[0]),
        _task("fa", due[1], "mq.u.x"),
        _task("fb", due[2]),
        _task("fd", due[3]),
    ]
    at = NOW + timedelta(microseconds=5)
    await _fire(store, tasks, [at + S, at, at, at + 2 * S])
    assert await store.fired_ids() == ["fa", "fb", "fc", "fd"]
    first = await store.reads.fired(EVERY, None, 2)
    assert [r.key for r in first] == [(micros(at), "fa"), (micros(at), "fb")]
    assert json.loads(first[0].doc) == {
        "id": "fa",
        "target": "mq.u.x",
        "status": "fired",
        "priority": None,
        "due_at": to_rfc3339_us(due[1]),
        "scheduled_for": to_rfc3339_us(due[1]),
        "expires_at": None,
        "attempts": 1,
        "created_at": None,
        "fired_at": to_rfc3339_us(at),
    }
    assert [json.loads(r.doc)["id"] for r in await store.reads.fired(EVERY, (at, "fa"), 10)] == [
        "fb",
        "fc",
        "fd",
    ]
    assert await store.reads.fired(EVERY, (at + 2 * S, "fd"), 10) == []
    assert await store.fired_ids(TaskFilter(subject="mq.t.>")) == ["fb", "fc", "fd"]
    assert await store.fired_ids(TaskFilter(subject="mq.u.x")) == ["fa"]
    window = TaskFilter(due_after=NOW - 2 * S, due_before=NOW - S)
    assert await store.fired_ids(window) == ["fa", "fd"]
    assert await store.fired_ids(limit=1) == ["fa"]


async def test_a_delivery_a_day_before_the_due_window_is_not_listed(store: Reads) -> None:
    """A fired task whose delivery went out more than a day before the window's start is left
    out of that window even when its due time is in it (the fired-time index bounds the scan)."""
    await _fire(store, [_task("ea", NOW), _task("eb", NOW)], [NOW - 2 * timedelta(days=1), NOW])
    assert await store.fired_ids() == ["ea", "eb"]
    assert await store.fired_ids(TaskFilter(due_after=NOW - S)) == ["eb"]
    assert await store.fired_ids(TaskFilter(due_after=NOW - timedelta(days=2))) == ["ea", "eb"]


HELD_DETAIL = [
    "id",
    "target",
    "status",
    "priority",
    "due_at",
    "scheduled_for",
    "expires_at",
    "attempts",
    "created_at",
    "fired_at",
    "seq",
    "stream_seq",
    "last_error",
    "claimed_epoch",
    "claimed_at",
    "updated_at",
    "headers",
    "payload",
    "deliveries",
]


async def test_a_held_tasks_detail_has_its_bytes_headers_and_claim(store: Reads) -> None:
    """A held task's detail has its bytes, headers and sequence; unchanged, updated when
    created; claimed, the epoch and instant of the claim (updated then); retried, no epoch but
    the claim's instant kept, with the error and a later update. An unknown id: None."""
    task = _task("da", NOW - S, payload=b'{"n": 1}', org="org-a")
    await store.tasks.insert_batch([task, _task("db", AHEAD)])
    fresh = await store.reads.task("db")
    assert fresh is not None and list(fresh) == HELD_DETAIL
    assert fresh["updated_at"] == fresh["created_at"] and fresh["claimed_at"] is None
    epoch = await store.take_office()
    (claimed,) = await claim(store.tasks, epoch, ["da"], NOW + S)
    doc = await store.reads.task("da")
    assert doc is not None and list(doc) == HELD_DETAIL
    assert (doc["status"], doc["attempts"], doc["claimed_epoch"]) == ("claimed", 1, epoch)
    assert (doc["headers"], doc["payload"], doc["deliveries"]) == ({"H": "v"}, b'{"n": 1}', [])
    assert doc["claimed_at"] == doc["updated_at"] and doc["updated_at"] > doc["created_at"]
    assert (doc["priority"], doc["due_at"], doc["scheduled_for"]) == (5, NOW - S, NOW - S)
    assert doc["seq"] > 0 and doc["seq"] < fresh["seq"]
    assert (doc["stream_seq"], doc["last_error"], doc["fired_at"]) == (None, None, None)
    await store.tasks.retry_later(epoch, [(claimed, NOW + S, "no ack", True)])
    again = await store.reads.task("da")
    assert again is not None
    assert (again["status"], again["claimed_epoch"], again["last_error"]) == (
        "in_doubt",
        None,
        "no ack",
    )
    assert again["claimed_at"] == doc["claimed_at"] and again["updated_at"] > doc["updated_at"]
    assert again["due_at"] == NOW + S and again["scheduled_for"] == NOW - S
    assert await store.reads.task("nobody") is None


async def test_a_fired_tasks_detail_comes_from_its_tombstone_and_deliveries(
    store: Reads,
) -> None:
    """A fired task's detail has no bytes, headers, priority, expiry, creation or claim: its due
    time, attempt and stream sequence are its delivery's, updated when it fired; its deliveries
    list with where JetStream stored them."""
    at = NOW + timedelta(microseconds=70)
    await _fire(store, [_task("fe", NOW - S)], [at])
    doc = await store.reads.task("fe")
    assert doc is not None
    want: dict[str, Any] = {"id": "fe", "target": "mq.t.a", "status": "fired", "priority": None}
    want |= {"due_at": NOW - S, "scheduled_for": NOW - S, "expires_at": None, "attempts": 1}
    want |= {"fired_at": at, "stream_seq": 1, "last_error": None, "created_at": None}
    want |= {"claimed_epoch": None, "claimed_at": None, "updated_at": at, "headers": {}}
    want |= {"payload": None}
    want["deliveries"] = [
        {"scheduled_for": NOW - S, "fired_at": at, "attempt": 1}
        | {"epoch": 1, "instance": "i-1", "stream": "TASKS", "stream_seq": 1}
    ]
    assert doc == want and list(doc) == list(want)
