"""The stored notice through a term of office on the twins (fake clock): under P > 1 a term
tells the owners of the other partitions' tasks it stored and hears its own partitions'
notices; under P = 1 it neither sends nor listens."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta

import pytest

from scheduler.bus.memory import DeliveryMetadata, SequencePair
from scheduler.engine.delayed import stored
from scheduler.partitions import partition_of
from scheduler.records import NewTask, to_ms
from scheduler.store.memory import MemoryTaskStore
from tests.unit.engine_twins import T0, Delivery, Engine, Office, engine_on_twins

P = 8
MINE = frozenset({0, 1, 2})


class SharingOffice(Office):
    """The twin's office holding some of P partitions in one term (`engine.office.Shares`)."""

    def __init__(self, epoch: int, partitions: frozenset[int]) -> None:
        super().__init__(epoch)
        self.partitions = partitions
        self.handover = asyncio.Event()

    def partitions_of(self, epoch: int) -> frozenset[int] | None:
        return self.partitions

    def term_ended(self, epoch: int) -> None:
        pass

    async def resized(self, epoch: int) -> frozenset[int]:
        await asyncio.Event().wait()  # this twin's term never grows
        raise AssertionError("unreachable")

    def resize_applied(self, epoch: int, ok: bool) -> None:
        raise AssertionError("no growth was handed out")


async def recorded(twin: Engine) -> list[tuple[str, bytes]]:
    """Every core message the term sends on the bus (still delivered to its listeners)."""
    sent: list[tuple[str, bytes]] = []
    notify = twin.bus.notify

    async def recording(subject: str, data: bytes) -> None:
        sent.append((subject, data))
        await notify(subject, data)

    twin.bus.notify = recording  # type: ignore[method-assign]
    return sent


async def sharing_twin(store: MemoryTaskStore | None = None) -> Engine:
    twin = await engine_on_twins(store, partitions=P)
    office = SharingOffice(await twin.store.take_office("twin"), MINE)
    twin.engine.office = twin.office = office
    return twin


async def test_a_term_over_partitions_notices_other_partitions_tasks_due_soon() -> None:
    """Of the tasks one term takes in, those of partitions it does not own due within its
    horizon are named in a notice on their partition's subject (once each); its own and
    those due later are not; it listens on its own partitions' subjects only."""
    twin = await sharing_twin()
    sent = await recorded(twin)
    await twin.start()
    try:
        soon = [twin.send(delay_ms=300) for _ in range(24)]
        later = [twin.send(delay_ms=10 * 60_000) for _ in range(8)]
        await twin.until(lambda: all(i in twin.store.rows for i in soon + later))
        named = [(s, r.task_id) for s, d in sent for r in stored.decode(d)[1]]
        foreign = [i for i in soon if partition_of(i, P) not in MINE]
        assert sorted(named) == sorted((stored.subject(partition_of(i, P)), i) for i in foreign)
        assert foreign and len(foreign) < len(soon)
        listening = {s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)}
        assert listening == {stored.subject(p) for p in MINE}
    finally:
        await twin.close()
    assert not [s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)]


async def test_a_notice_puts_a_task_behind_the_cursor_on_the_heap_to_fire_on_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task of the term's partitions stored by another engine after the loader passed its
    due time fires at that time once its notice arrives (the sweep would find it 2 s late);
    a bad notice is logged and changes nothing."""
    twin = await sharing_twin()
    await twin.start()
    try:
        await twin.until(lambda: twin.engine.horizon.heap.cursor[0] > to_ms(T0) + 60_000)
        task_id = next(f"other-{n}" for n in range(100) if partition_of(f"other-{n}", P) in MINE)
        due = twin.clock.now() + timedelta(milliseconds=300)
        doc = {"schema": "hanzo.mq.v1", "id": task_id, "type": "t", "source": "x", "data": {}}
        insertion = await twin.store.insert_batch(
            [NewTask(task_id, "mq.inference.chat", json.dumps(doc).encode(), {}, 5, due, due, None)]
        )
        subject = stored.subject(partition_of(task_id, P))
        with caplog.at_level(logging.WARNING):
            await twin.bus.notify(subject, b'{"p": 1, "tasks": [["x", -5, 5, 1, null]]}')
        assert "engine.bad_stored_notice" in caplog.text
        [data] = stored.encode(partition_of(task_id, P), insertion.stored)
        await twin.bus.notify(subject, data)
        took = await twin.until(lambda: task_id in twin.ids(), limit_ms=3_000)
        assert 290 <= took <= 320, f"fired {took} ms after its notice, due after 300"
    finally:
        await twin.close()


async def test_under_one_partition_no_notice_is_sent_or_heard() -> None:
    """P = 1: the one engine owns every task, so intake sends no notice and the term
    subscribes to none."""
    twin = await engine_on_twins()
    sent = await recorded(twin)
    await twin.start()
    try:
        ids = [twin.send(delay_ms=300) for _ in range(10)]
        await twin.until(lambda: all(i in twin.ids() for i in ids), limit_ms=2_000)
        assert twin.engine.notices is None
        assert not [s for s, _ in sent if s.startswith(stored.SUBJECT_PREFIX)]
        assert not [s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)]
    finally:
        await twin.close()


def _meta(delivered: int, consumer_seq: int) -> DeliveryMetadata:
    seqs = SequencePair(stream=consumer_seq or 7, consumer=consumer_seq)
    return DeliveryMetadata("MQ_DELAY", "scheduler-intake", seqs, delivered, T0)


async def test_a_stored_task_taken_again_from_the_lane_is_noticed_a_producers_resend_is_not() -> (
    None
):
    """A task of another partition already stored, whose lane message comes again (delivered
    twice, or read back from the stream: its storer may have died between its commit and its
    notice), is named in a notice by the engine that takes it again; the same bytes sent anew
    by the producer (a new message, delivered once) are not: a producer cannot push entries
    onto the owner's heap by resending."""
    first = await sharing_twin()
    await first.start()
    try:
        ids = [first.send(delay_ms=300) for _ in range(16)]
        await first.until(lambda: all(i in first.store.rows for i in ids))
    finally:
        await first.close()
    task_id = next(i for i in ids if partition_of(i, P) not in MINE)
    msg = first.sent[task_id]
    for delivered, consumer_seq in ((1, 5), (2, 5), (1, 0)):
        twin = await sharing_twin(first.store)  # another engine, on the same database
        sent = await recorded(twin)
        await twin.start()
        try:
            again = Delivery(msg.subject, msg.data, f"ack.{delivered}.{consumer_seq}")
            again.meta = _meta(delivered, consumer_seq)
            twin.lane.queue.put_nowait(again)
            await twin.until(twin.lane.queue.empty)
            await twin.settle()
        finally:
            await twin.close()
        named = [r.task_id for _, d in sent for r in stored.decode(d)[1]]
        want = [] if delivered == 1 and consumer_seq else [task_id]
        assert named == want, (delivered, consumer_seq, named)


async def test_a_stored_task_taken_again_by_its_owner_goes_on_its_heap_and_fires_on_time() -> None:
    """The owner itself takes again the lane message of a task another engine stored in one of
    its partitions and died before firing (its cursor passed the task's key before the task
    was stored, so its loader will not read it): the exact resend puts it on the owner's heap,
    and it fires at its millisecond, not when a sweep finds it seconds overdue."""
    owner = await sharing_twin()  # the store keeps the owner's clock
    # another engine's intake in the same partitions, at the owner's epoch (neither fences the
    # other), that dies after storing
    storer = await engine_on_twins(owner.store, partitions=P)
    epoch = await owner.store.take_office("twin")
    owner.engine.office = owner.office = SharingOffice(epoch, MINE)
    storer.engine.office = storer.office = SharingOffice(epoch, MINE)
    await owner.start()  # its loader's cursor is past what falls due in the next minutes
    try:
        await storer.start()
        try:
            ids = [storer.send(delay_ms=1_500) for _ in range(16)]
            await storer.until(lambda: all(i in storer.store.rows for i in ids))
        finally:
            storer.stop.set()
            assert storer.runner is not None
            storer.runner.cancel()  # killed: nothing more of its term runs
            await asyncio.gather(storer.runner, return_exceptions=True)
        task_id = next(i for i in ids if partition_of(i, P) in MINE)
        due_ms = to_ms(owner.store.rows[task_id].task.due_at)
        msg = storer.sent[task_id]
        again = Delivery(msg.subject, msg.data, "ack.again")
        again.meta = _meta(2, 7)
        owner.lane.queue.put_nowait(again)
        await owner.until(lambda: task_id in owner.ids(), limit_ms=10_000)
        late_ms = to_ms(owner.clock.now()) - due_ms
        assert 0 <= late_ms <= 100, late_ms
    finally:
        await owner.close()
