"""The horizon heap: firing order, the loader cursor, and bounded memory."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.engine.delayed.horizon import HorizonHeap, TaskRef


def ref(task_id: str, due: int, priority: int = 5, seq: int = 0) -> TaskRef:
    return TaskRef(task_id, due, priority, seq)


def test_pops_in_due_then_priority_then_intake_order() -> None:
    """Same due time: priority 1 before 5, then lower intake sequence first."""
    heap = HorizonHeap()
    heap.loaded([ref("c", 100, 5, 3), ref("a", 100, 1, 9), ref("b", 100, 5, 2), ref("z", 50)], 1000)
    assert [e[3] for e in heap.pop_due(100, 10)] == ["z", "a", "b", "c"]


def test_pop_due_respects_time_and_limit() -> None:
    """Only tasks due by the given time come out, at most `limit` of them."""
    heap = HorizonHeap()
    heap.loaded([ref(str(i), i * 10, seq=i) for i in range(10)], 1000)
    assert [e[3] for e in heap.pop_due(35, 100)] == ["0", "1", "2", "3"]
    assert [e[3] for e in heap.pop_due(1000, 2)] == ["4", "5"]
    assert heap.next_due_ms() == 60


def test_offer_only_within_the_loaded_range() -> None:
    """Intake pushes a task only if the loader has passed its key; later ones wait for it."""
    heap = HorizonHeap()
    heap.loaded([ref("a", 100, 5, 1)], None)  # a full page: cursor is a's key exactly
    assert heap.offer(ref("early", 90, 5, 7))
    assert heap.offer(ref("same-ms-higher-prio", 100, 1, 8))
    assert not heap.offer(ref("same-ms-later-seq", 100, 5, 9))
    assert not heap.offer(ref("later", 101, 1, 10))
    heap.loaded([], 5000)  # the loader found nothing more up to 5000
    assert heap.offer(ref("later", 101, 1, 10))
    assert not heap.offer(ref("beyond", 5001, 1, 11))


def test_reset_forgets_everything() -> None:
    """On losing office the heap and cursor are dropped; the next term reloads."""
    heap = HorizonHeap()
    heap.loaded([ref("a", 1)], 100)
    heap.reset()
    assert len(heap) == 0 and heap.next_due_ms() is None
    assert not heap.offer(ref("b", 1))


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10)), max_size=200))
def test_heap_order_matches_a_sort(items: list[tuple[int, int]]) -> None:
    """Popping everything gives exactly the sorted (due, priority, seq) order."""
    refs = [ref(f"t{i}", due, prio, i) for i, (due, prio) in enumerate(items)]
    heap = HorizonHeap()
    heap.loaded(refs, 10_000)
    popped = heap.pop_due(10_000, len(refs) + 1)
    assert [e[3] for e in popped] == [r.task_id for r in sorted(refs, key=lambda r: r.key)]
