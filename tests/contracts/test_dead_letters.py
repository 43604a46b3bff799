"""The dead letters' contract for operators (`scheduler.operations.stores.DeadLetters`), over
the in-memory twin and PostgreSQL alike: dead letters as the engine records them (at intake and
at firing), listed newest first with filters and keyset pages, resolved, and the replay's
transitions (marked once; a requeue only of a task still dead)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.metrics import Metrics
from scheduler.operations.stores import DeadLetterFilter, DeadLetters
from scheduler.records import NewTask, to_ms
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.memory_dead_letters import MemoryDeadLetterStore
from tests.contracts.admin import StoredTasks
from tests.support.stores import claim

NOW = datetime.now(UTC).replace(microsecond=0)
EVERY = DeadLetterFilter()


@dataclass
class Book:
    tasks: StoredTasks
    dead: DeadLetters
    take_office: Callable[[], Awaitable[int]]


@pytest.fixture
async def book(database: str | None) -> AsyncIterator[Book]:
    if database is None:
        tasks = MemoryTaskStore()
        yield Book(tasks, MemoryDeadLetterStore(tasks), tasks.take_office)
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.dead_letters import DeadLetterStore
    from scheduler.store.postgres.epoch import take_office
    from scheduler.store.postgres.tasks import TaskStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        db = PostgresStore(pool, Metrics())
        yield Book(TaskStore(db), DeadLetterStore(db), lambda: take_office(pool, "t"))
    finally:
        await pool.close()


async def _intake(
    book: Book,
    original_id: str,
    target: str | None = "mq.tasks.a",
    reason: str = "invalid_envelope",
    raw: bytes = b'{"id": "x", "n": 1}',
    raw_size: int | None = None,
) -> dict[str, Any]:
    """One intake dead letter, recorded as the intake records it; its listed row."""
    row: dict[str, Any] = {"original_id": original_id, "key": f"k-{uuid.uuid4().hex}"}
    row["subject"] = "mq.delay.x"
    row |= {"error": "bad", "reason": reason, "target": target, "raw": raw}
    row |= {"raw_size": len(raw) if raw_size is None else raw_size, "headers": {"H": "v"}}
    await book.tasks.record_bad_intake([row])
    listed = await book.dead.list(EVERY, None, 1)
    assert listed[0]["original_id"] == original_id
    return listed[0]


async def _killed(book: Book, payload: bytes = b'{"a": [1, 2]}') -> tuple[NewTask, dict[str, Any]]:
    """A task that died at firing, and its dead letter as listed."""
    t = NewTask(f"c_{uuid.uuid4().hex[:12]}", "mq.tasks.w", payload, {"X": "1"}, 5, NOW, NOW, None)
    await book.tasks.insert_batch([t])
    epoch = await book.take_office()
    claimed = await claim(book.tasks, epoch, [t.id], NOW + timedelta(seconds=1))
    await book.tasks.kill(epoch, [(claimed[0], "too many attempts", "publish_failed")])
    listed = await book.dead.list(EVERY, None, 1)
    assert listed[0]["original_id"] == t.id
    return t, listed[0]


async def _ids(book: Book, where: DeadLetterFilter = EVERY) -> list[str]:
    return [r["original_id"] for r in await book.dead.list(where, None, 100)]


async def test_newest_first_filtered_and_paged(book: Book) -> None:
    """Dead letters list newest first; reason, stage and resolved filter exactly; the subject
    exactly or as a `.>` prefix, on the target (the subject without one) or on the subject;
    a page continues strictly after the key (last failure, id) of the one before."""
    await _intake(book, "a", target="mq.tasks.a")
    await _intake(book, "b", target=None, reason="no_target")
    await _intake(book, "c", target="mq.other.c")
    assert await _ids(book) == ["c", "b", "a"]
    assert await _ids(book, DeadLetterFilter(reason="no_target")) == ["b"]
    assert await _ids(book, DeadLetterFilter(stage="intake")) == ["c", "b", "a"]
    assert await _ids(book, DeadLetterFilter(stage="firing")) == []
    assert await _ids(book, DeadLetterFilter(resolved=False)) == ["c", "b", "a"]
    assert await _ids(book, DeadLetterFilter(subject="mq.tasks.a")) == ["a"]
    assert await _ids(book, DeadLetterFilter(subject="mq.tasks.>")) == ["a"]
    assert await _ids(book, DeadLetterFilter(subject="mq.delay.x")) == ["c", "b", "a"]
    assert await _ids(book, DeadLetterFilter(subject="mq.>")) == ["c", "b", "a"]
    assert await _ids(book, DeadLetterFilter(subject="mq.tasks")) == []
    first = await book.dead.list(EVERY, None, 2)
    rest = await book.dead.list(EVERY, (first[-1]["last_failed"], first[-1]["id"]), 2)
    assert [r["original_id"] for r in first + rest] == ["c", "b", "a"]


async def test_an_intake_dead_letter_shows_its_bytes_and_document(book: Book) -> None:
    """Listed: stage, reason, target, one attempt, open, its size; shown: the headers, the
    bytes and the document read from them, none from bytes that were cut; unknown: None."""
    row = await _intake(book, "a")
    assert (row["stage"], row["reason"], row["target"], row["attempts"]) == (
        "intake", "invalid_envelope", "mq.tasks.a", 1,
    )  # fmt: skip
    assert (row["resolved"], row["replayed_at"], row["raw_size"], row["raw_truncated"]) == (
        False, None, 19, False,
    )  # fmt: skip
    shown = await book.dead.get(row["id"])
    assert shown is not None and shown["headers"] == {"H": "v"}
    assert shown["raw"] == b'{"id": "x", "n": 1}' and shown["payload"] == {"id": "x", "n": 1}
    assert {k: shown[k] for k in row} == row
    cut = await _intake(book, "b", raw=b'{"id": "x", "n"', raw_size=4000)
    shown = await book.dead.get(cut["id"])
    assert shown is not None and shown["payload"] is None and shown["raw_truncated"] is True
    assert shown["raw_size"] == 4000
    assert await book.dead.get(uuid.uuid4()) is None


async def test_resolve_toggles_and_counts(book: Book) -> None:
    """Resolving records who and when and leaves the unresolved count; opening again forgets
    both; an unknown dead letter answers None."""
    a = await _intake(book, "a")
    await _intake(book, "b")
    assert await book.dead.unresolved() == 2
    done = await book.dead.resolve(a["id"], True, "admin")
    assert done is not None and done["resolved"] is True and done["resolved_by"] == "admin"
    assert done["resolved_at"] is not None
    assert await book.dead.unresolved() == 1
    assert await _ids(book, DeadLetterFilter(resolved=True)) == ["a"]
    opened = await book.dead.resolve(a["id"], False, "admin")
    assert opened is not None and (opened["resolved_at"], opened["resolved_by"]) == (None, None)
    assert await book.dead.unresolved() == 2
    assert await book.dead.resolve(uuid.uuid4(), True, "admin") is None


async def test_a_replay_is_marked_once_until_unmarked(book: Book) -> None:
    """Marking a replay succeeds once (it resolves the dead letter by `<who> (replay)`), a
    second mark and a mark of an unknown one fail; unmarking opens it for a replay again."""
    a = await _intake(book, "a")
    assert await book.dead.mark_replayed(a["id"], "admin") is True
    assert await book.dead.mark_replayed(a["id"], "admin") is False
    assert await book.dead.mark_replayed(uuid.uuid4(), "admin") is False
    marked = await book.dead.get(a["id"])
    assert marked is not None and marked["replayed_at"] is not None and marked["resolved"]
    assert marked["resolved_by"] == "admin (replay)"
    assert await book.dead.unresolved() == 0
    await book.dead.unmark_replayed(a["id"])
    opened = await book.dead.get(a["id"])
    assert opened is not None and opened["replayed_at"] is None and not opened["resolved"]
    assert opened["resolved_by"] is None and opened["resolved_at"] is None
    assert await book.dead.mark_replayed(a["id"], "admin") is True


async def test_a_firing_dead_letter_requeues_its_task_once(book: Book) -> None:
    """A task that died at firing is a dead letter of its target, bytes, headers and attempts;
    its requeue puts the task back to pending at the due time given (attempts from zero) and
    marks the replay; a second requeue is `already_replayed` and changes nothing."""
    t, row = await _killed(book)
    assert (row["stage"], row["subject"], row["target"]) == ("firing", t.target, t.target)
    assert row["reason"] == "publish_failed" and row["error"] == "too many attempts"
    assert row["attempts"] == 1  # the claim counted its one attempt
    shown = await book.dead.get(row["id"])
    assert shown is not None and shown["raw"] == t.payload and shown["payload"] == {"a": [1, 2]}
    assert shown["headers"] == {"X": "1"} and shown["raw_size"] == len(t.payload)
    due = NOW + timedelta(minutes=5)
    done = await book.dead.requeue(row["id"], t.id, due, "admin")
    assert done.status == "replayed" and done.ref is not None
    assert (done.ref.task_id, done.ref.due_ms) == (t.id, to_ms(due))
    task = await book.tasks.get(t.id)
    assert task is not None and (task["status"], task["due_at"]) == ("pending", due)
    assert task["attempts"] == 0 and task["last_error"] is None
    marked = await book.dead.get(row["id"])
    assert marked is not None and marked["resolved_by"] == "admin (replay)"
    again = await book.dead.requeue(row["id"], t.id, due, "admin")
    assert (again.status, again.ref) == ("already_replayed", None)


async def test_a_requeue_of_a_task_not_dead_changes_nothing(book: Book) -> None:
    """A dead letter whose task is not dead (`not_dead`, with its status) or unknown
    (`missing_task`) is not requeued, and its replay is not marked."""
    t, row = await _killed(book)
    await book.dead.requeue(row["id"], t.id, NOW, "admin")
    other = await _intake(book, t.id)
    refused = await book.dead.requeue(other["id"], t.id, NOW, "admin")
    assert (refused.status, refused.task_status, refused.ref) == ("not_dead", "pending", None)
    missing = await book.dead.requeue(other["id"], "nope", NOW, "admin")
    assert (missing.status, missing.task_status) == ("missing_task", None)
    kept = await book.dead.get(other["id"])
    assert kept is not None and kept["replayed_at"] is None and kept["resolved"] is False
