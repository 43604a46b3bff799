"""Exact resends on the delay lane (engine/delayed/repeats.py): a copy of a task intake has
committed is acked without validation or a store call, copies within a batch cost one insert,
and anything that is not an exact copy of a committed task is judged as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from scheduler.clock import to_rfc3339
from scheduler.engine.delayed.repeats import Repeats, key_of
from tests.unit.engine_twins import Delivery
from tests.unit.test_intake_gathering import Rig, make_rig, running, stopped

SUBJECT = "mq.delay.inference.chat"


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    yield await make_rig()


def envelope(rig: Rig, task_id: str, n: int = 0) -> bytes:
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1", "id": task_id, "type": "t", "source": "test",
        "timestamp": to_rfc3339(rig.clock.now()),
        "delay_until": to_rfc3339(rig.clock.now() + timedelta(seconds=30)), "data": {"n": n},
    }  # fmt: skip
    return json.dumps(doc).encode()


def put(rig: Rig, data: bytes, reply: str) -> None:
    rig.lane.put(Delivery(SUBJECT, data, reply))


def test_repeats_forget_the_oldest_past_their_bound() -> None:
    """Past `remember` keys the oldest go first; a key added again counts as new."""
    keys = [key_of(Delivery(SUBJECT, str(i).encode())) for i in range(4)]
    repeats = Repeats(remember=3)
    repeats.add(keys[:3])
    repeats.add(keys[:1])  # the first again: now the newest
    repeats.add(keys[3:])
    assert [repeats.known(k) for k in keys] == [True, False, True, True]
    assert len(repeats) == 3


def test_the_same_bytes_on_another_subject_are_another_key() -> None:
    """The key holds the subject: the same envelope sent to another target is another task's
    message, never acked as a resend of the first; the key is one 16-byte digest."""
    data = b'{"id":"t1"}'
    first = key_of(Delivery(SUBJECT, data))
    assert first is not None and len(first) == 16
    assert key_of(Delivery(SUBJECT, data)) == first
    assert key_of(Delivery(SUBJECT + ".other", data)) != first
    assert key_of(Delivery(SUBJECT, data + b" ")) != first
    repeats = Repeats()
    repeats.add([first])
    assert not repeats.known(key_of(Delivery("mq.delay.inference.other", data)))


async def test_a_copy_of_a_committed_task_is_acked_without_a_store_call(rig: Rig) -> None:
    """A task, then two copies of its bytes a batch later (a producer's resends): one insert,
    all three messages acked."""
    runner = await running(rig)
    data = envelope(rig, "task_a")
    put(rig, data, "ack.1")
    await rig.run_for(80)
    put(rig, data, "ack.2")
    put(rig, data, "ack.3")
    await rig.run_for(80)
    assert [ids for _, ids in rig.store.calls] == [["task_a"]]
    assert rig.broker.acked == ["ack.1", "ack.2", "ack.3"]
    await stopped(rig, runner)


async def test_copies_within_one_batch_cost_one_insert_of_the_first(rig: Rig) -> None:
    """Copies of a task in the batch that brings it: the first is stored, each copy acked after
    the commit, the batch's other tasks in lane order."""
    runner = await running(rig)
    data = envelope(rig, "task_a")
    put(rig, data, "ack.1")
    put(rig, envelope(rig, "task_b"), "ack.2")
    put(rig, data, "ack.3")
    await rig.run_for(80)
    assert [ids for _, ids in rig.store.calls] == [["task_a", "task_b"]]
    assert sorted(rig.broker.acked) == ["ack.1", "ack.2", "ack.3"]
    await stopped(rig, runner)


async def test_other_bytes_with_a_stored_id_are_still_refused(rig: Rig) -> None:
    """Another message with a stored task's id but other bytes is no copy: it goes to the
    store, which refuses it `duplicate_id`; the stored task keeps its bytes."""
    runner = await running(rig)
    put(rig, envelope(rig, "task_a", n=1), "ack.1")
    await rig.run_for(80)
    put(rig, envelope(rig, "task_a", n=2), "ack.2")
    await rig.run_for(80)
    assert [ids for _, ids in rig.store.calls] == [["task_a"], ["task_a"]]
    assert rig.broker.acked == ["ack.1"]
    assert [d["reason"] for d in rig.store.dead_letters] == ["duplicate_id"]
    await stopped(rig, runner)


async def test_copies_of_a_refused_message_are_each_refused(rig: Rig) -> None:
    """Two copies of a message that is no task, in one batch: neither is taken for a resend;
    both are dead-lettered and neither acked."""
    runner = await running(rig)
    put(rig, b"not json", "ack.1")
    put(rig, b"not json", "ack.2")
    await rig.run_for(80)
    assert rig.broker.acked == []
    assert [d["reason"] for d in rig.store.dead_letters] == ["unparseable", "unparseable"]
    await stopped(rig, runner)
