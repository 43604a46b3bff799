"""The stored notice (scheduler.engine.delayed.stored): what it carries, how it is bounded and
split, what it refuses, and which tasks of a batch it names."""

from __future__ import annotations

import json
import logging

import pytest

from scheduler.engine.delayed import stored
from scheduler.engine.delayed.stored import StoredNotices
from scheduler.partitions import partition_of
from scheduler.records import TaskRef

P = 8


def test_the_notice_carries_each_tasks_heap_entry_and_organisation() -> None:
    """What the storing engine encodes the owner decodes to the same partition and refs."""
    refs = [TaskRef("t-1", 1_795_000_000_000, 3, 42, "acme"), TaskRef("t-2", 0, 10, 0)]
    [data] = stored.encode(5, refs)
    assert stored.decode(data) == (5, refs)
    assert json.loads(data)["tasks"][0] == ["t-1", 1_795_000_000_000, 3, 42, "acme"]


def test_many_tasks_are_split_into_notices_within_the_count_and_byte_bounds() -> None:
    """A batch is split into as few notices as MAX_TASKS and MAX_BYTES allow, each within
    both, together naming every task once, in order."""
    small = [TaskRef(f"t-{i}", 1_000 + i, 5, i) for i in range(2 * stored.MAX_TASKS + 1)]
    notices = stored.encode(1, small)
    assert [len(stored.decode(n)[1]) for n in notices] == [stored.MAX_TASKS] * 2 + [1]
    big = [TaskRef(f"{i:0>200}", 1, 5, i, "o" * stored.MAX_ORG) for i in range(400)]
    notices = stored.encode(1, big)
    assert len(notices) > 1 and all(len(n) <= stored.MAX_BYTES for n in notices)
    assert [r for n in notices for r in stored.decode(n)[1]] == big


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "notice: "),
        (b"[]", "notice: "),
        (b'{"tasks": [["t", 1, 5, 1, null]]}', "p: Field required"),
        (b'{"p": -1, "tasks": [["t", 1, 5, 1, null]]}', "p: Input should be"),
        (b'{"p": 4096, "tasks": [["t", 1, 5, 1, null]]}', "p: Input should be"),
        (b'{"p": 1, "tasks": []}', "tasks: List should have at least 1"),
        (b'{"p": 1, "tasks": [["t\\n", 1, 5, 1, null]]}', "tasks.0.0: String should match"),
        (b'{"p": 1, "tasks": [["t", -1, 5, 1, null]]}', "tasks.0.1: Input should be"),
        (b'{"p": 1, "tasks": [["t", 1, 0, 1, null]]}', "tasks.0.2: Input should be"),
        (b'{"p": 1, "tasks": [["t", 1, 5, "1", null]]}', "tasks.0.3: Input should be"),
        (b'{"p": 1, "tasks": [["t", 1, 5, 1]]}', "tasks.0.4: Field required"),
        (b'{"p": 1, "tasks": [["t", 1, 5, 1, 7]]}', "tasks.0.4: Input should be"),
    ],
)
def test_a_bad_notice_is_refused_naming_the_field(data: bytes, problem: str) -> None:
    """A notice off NATS is validated strictly; the error names the field and the problem."""
    with pytest.raises(ValueError, match="^" + problem):
        stored.decode(data)


def test_oversized_and_overlong_notices_are_refused() -> None:
    """A notice over MAX_BYTES is refused by its size alone, one naming more than MAX_TASKS
    tasks or an org_id over MAX_ORG by the field."""
    with pytest.raises(ValueError, match=f"more than {stored.MAX_BYTES}"):
        stored.decode(b" " * (stored.MAX_BYTES + 1))
    rows = ",".join('["t",1,5,1,null]' for _ in range(stored.MAX_TASKS + 1))
    with pytest.raises(ValueError, match=r"^tasks: List should have at most"):
        stored.decode(f'{{"p": 1, "tasks": [{rows}]}}'.encode())
    long_org = f'{{"p": 1, "tasks": [["t",1,5,1,"{"o" * (stored.MAX_ORG + 1)}"]]}}'
    with pytest.raises(ValueError, match=r"^tasks\.0\.4: String should have at most"):
        stored.decode(long_org.encode())


async def test_the_sender_names_only_other_partitions_tasks_due_soon_one_notice_each() -> None:
    """Of a committed batch, the tasks of partitions the engine does not own that are due by
    its now + horizon (+ the skew margin) go, one notice per partition, on that partition's
    subject; its own tasks, tasks due later and an org_id over MAX_ORG are not noticed."""
    sent: list[tuple[str, bytes]] = []

    async def notify(subject: str, data: bytes) -> None:
        sent.append((subject, data))

    mine = {0, 1, 2}

    def owns(task_id: str) -> bool:
        return partition_of(task_id, P) in mine

    until = 10_000
    refs = [TaskRef(f"t-{i}", until - 500 + 100 * (i % 20), 5, i) for i in range(200)]
    refs.append(TaskRef("long-org", 0, 5, 999, "o" * (stored.MAX_ORG + 1)))
    notices = StoredNotices(notify, P, owns)
    await notices.send(refs, until)
    got: dict[int, list[TaskRef]] = {}
    for subject, data in sent:
        p, named = stored.decode(data)
        assert subject == stored.subject(p) == f"scheduler.v1.internal.stored.{p}"
        got.setdefault(p, []).extend(named)
    expected: dict[int, list[TaskRef]] = {}
    for r in refs[:-1]:
        if not owns(r.task_id) and r.due_ms <= until + stored.SKEW_MARGIN_MS:
            expected.setdefault(partition_of(r.task_id, P), []).append(r)
    assert got == expected and set(got) == set(range(P)) - mine
    assert notices.sent == len(sent) == P - len(mine)


async def test_a_notice_that_cannot_be_sent_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The link is down: the batch's notices are given up with a log line (the owner's
    sweep finds the tasks); intake goes on."""

    async def down(subject: str, data: bytes) -> None:
        raise ConnectionError("link down")

    with caplog.at_level(logging.WARNING):
        notices = StoredNotices(down, P, lambda task_id: False)
        await notices.send([TaskRef("t-1", 0, 5, 1)], 1_000)
    assert notices.sent == 0
    assert "intake.notice_failed" in caplog.text
