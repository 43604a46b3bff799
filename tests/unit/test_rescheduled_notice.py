"""The reschedule notice (scheduler.engine.delayed.rescheduled): what it carries and what it
refuses."""

from __future__ import annotations

import json

import pytest

from scheduler.engine.delayed import rescheduled
from scheduler.records import TaskRef


def test_the_notice_carries_the_tasks_heap_entry_and_organisation() -> None:
    """What one instance encodes the leader decodes to the same ref, `org` included."""
    for ref in (TaskRef("t-1", 1_795_000_000_000, 3, 42, "acme"), TaskRef("t-2", 0, 10, 0)):
        assert rescheduled.decode(rescheduled.encode(ref)) == ref
    assert json.loads(rescheduled.encode(TaskRef("t", 5, 5, 5, "acme")))["org"] == "acme"


def test_a_notice_from_an_older_instance_is_a_task_of_no_organisation() -> None:
    """A notice without `org` (sent before it existed) still moves the task; unknown fields
    a newer instance may add are ignored."""
    old = b'{"id": "t-1", "due_ms": 100, "priority": 5, "seq": 7, "later": true}'
    assert rescheduled.decode(old) == TaskRef("t-1", 100, 5, 7, None)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "notice: "),
        (b"[]", "notice: "),
        (b'{"id": "t\\n", "due_ms": 1, "priority": 5, "seq": 1}', "id: String should match"),
        (b'{"id": "", "due_ms": 1, "priority": 5, "seq": 1}', "id: String should match"),
        (b'{"id": "t", "due_ms": -1, "priority": 5, "seq": 1}', "due_ms: Input should be"),
        (b'{"id": "t", "due_ms": 1, "priority": 0, "seq": 1}', "priority: Input should be"),
        (b'{"id": "t", "due_ms": 1, "priority": 5, "seq": "1"}', "seq: Input should be"),
        (b'{"id": "t", "due_ms": 1, "priority": 5}', "seq: Field required"),
        (b'{"id": "t", "due_ms": 1, "priority": 5, "seq": 1, "org": 7}', "org: Input should be"),
    ],
)
def test_a_bad_notice_is_refused_naming_the_field(data: bytes, problem: str) -> None:
    """A notice off NATS is validated strictly; the error names the field and the problem."""
    with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(")):
        rescheduled.decode(data)


def test_an_oversized_notice_is_refused_before_it_is_parsed() -> None:
    """A notice over MAX_BYTES is refused by its size alone."""
    data = rescheduled.encode(TaskRef("t", 1, 5, 1, "x" * rescheduled.MAX_BYTES))
    with pytest.raises(ValueError, match=f"more than {rescheduled.MAX_BYTES}"):
        rescheduled.decode(data)
