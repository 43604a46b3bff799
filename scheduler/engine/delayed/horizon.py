"""The horizon: the tasks due soon, in firing order, with a watermark of what is loaded.

`HorizonHeap` is pure bookkeeping, no I/O; `Horizon` puts it together with its lock and the
firing loop's wake-up behind `arm`, `offer`, `load`, `put_back`, `next_due`, `take_due` and
`disarm`. Entries are ordered by (due time, priority, intake sequence): among tasks due at the
same instant the higher priority (lower number) fires first, then intake order.

The *cursor* is the key of the last task loaded from PostgreSQL: the heap holds every pending
task whose key is <= cursor (minus those already popped). A task arriving from intake goes onto
the heap only if its key is <= cursor; otherwise the loader will read it in order later. So
memory is bounded by what is due within the horizon (and a hard cap), not by the pending count.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from scheduler.records import MAX_PRIORITY, Entry, Key, TaskRef

AFTER_ALL = (MAX_PRIORITY + 1, 2**63 - 1)
T = TypeVar("T")


class HorizonHeap:
    """A min-heap of due tasks plus the loader's cursor."""

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        self.cursor: Key = (-1, 0, 0)

    def __len__(self) -> int:
        return len(self._heap)

    def offer(self, ref: TaskRef) -> bool:
        """Push `ref` if the loader has passed its key; return whether it was pushed."""
        if ref.key <= self.cursor:
            heapq.heappush(self._heap, ref.entry)
            return True
        return False

    def push(self, ref: TaskRef) -> None:
        """Push unconditionally (a retry or a reschedule of a known task)."""
        heapq.heappush(self._heap, ref.entry)

    def loaded(self, refs: list[TaskRef], complete_until_ms: int | None) -> None:
        """Record a loader page: push it, and advance the cursor to its last key.

        `complete_until_ms` says the page held every pending task due up to that time, so the
        cursor may move to the end of that millisecond even if the page was short.
        """
        for ref in refs:
            heapq.heappush(self._heap, ref.entry)
        if refs:
            self.cursor = max(self.cursor, refs[-1].key)
        if complete_until_ms is not None:
            self.cursor = max(self.cursor, (complete_until_ms, *AFTER_ALL))

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, until_ms: int, limit: int) -> list[Entry]:
        """Pop up to `limit` entries due at or before `until_ms`, in firing order."""
        out: list[Entry] = []
        heap = self._heap
        while heap and heap[0][0] <= until_ms and len(out) < limit:
            out.append(heapq.heappop(heap))
        return out

    def reset(self) -> None:
        """Forget everything (on losing office the next leader reloads from PostgreSQL)."""
        self._heap.clear()
        self.cursor = (-1, 0, 0)


class Horizon:
    """The horizon of one term: the heap (fair or FIFO, `engine.delayed.fairness.horizon_heap`),
    the lock that keeps the loader's cursor consistent with what else is offered, and the
    claimer's wake-up, behind one small API; the parts of a term share this one object.

    Whatever puts a task on the heap after writing it to PostgreSQL (intake, a retry, the loader)
    does both under the lock (`arm` with the write): otherwise the loader could read past a task
    written but not yet offered, move its cursor beyond it, and the offer would be refused.
    """

    def __init__(self, heap: HorizonHeap | None = None) -> None:
        self.heap = heap if heap is not None else HorizonHeap()
        self.wake = asyncio.Event()  # set when tasks go on the heap (the claimer waits on it)
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self.heap)

    async def arm(
        self,
        write: Awaitable[T],
        refs_of: Callable[[T], Iterable[TaskRef]],
        wake: bool = True,
    ) -> tuple[T, int]:
        """Run `write` (the store call that made the tasks pending) under the lock, then offer
        the tasks `refs_of` its result names; wake the firing loop if any went on the heap
        (and `wake`). Returns the write's result and how many were pushed."""
        async with self._lock:
            result = await write
            pushed = sum(self.heap.offer(ref) for ref in refs_of(result))
        if pushed and wake:
            self.wake.set()
        return result, pushed

    async def offer(self, ref: TaskRef) -> bool:
        """Offer one task known to be pending (a reschedule notice); wake if it went on."""
        async with self._lock:
            pushed = self.heap.offer(ref)
        if pushed:
            self.wake.set()
        return pushed

    async def load(
        self, fetch: Callable[[Key], Awaitable[list[TaskRef]]], page: int, until_ms: int
    ) -> list[TaskRef]:
        """Load the next page past the cursor (`fetch(cursor)`, at most `page` tasks, all due
        by `until_ms`) under the lock; a short page means every task up to `until_ms` is in."""
        async with self._lock:
            refs = await fetch(self.heap.cursor)
            self.heap.loaded(refs, None if len(refs) == page else until_ms)
        if refs:
            self.wake.set()
        return refs

    def put_back(self, refs: Iterable[TaskRef], wake: bool = False) -> None:
        """Push tasks taken but not claimed (or found overdue) back, unconditionally."""
        for ref in refs:
            self.heap.push(ref)
            if wake:
                self.wake.set()

    def next_due(self) -> int | None:
        """The due time (epoch ms) of the first task on the heap."""
        return self.heap.next_due_ms()

    def take_due(self, until_ms: int, limit: int) -> list[Entry]:
        """Pop up to `limit` tasks due by `until_ms`, in firing order."""
        return self.heap.pop_due(until_ms, limit)

    def disarm(self) -> None:
        """Forget every task (office lost: the next leader reloads from PostgreSQL)."""
        self.heap.reset()

    def wake_up(self) -> None:
        self.wake.set()
