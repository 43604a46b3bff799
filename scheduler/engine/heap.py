"""The horizon heap: the tasks due soon, in firing order, with a watermark of what is loaded.

Pure bookkeeping, no I/O. Entries are ordered by (due time, priority, intake sequence): among tasks
due at the same instant the higher priority (lower number) fires first, then intake order.

The *cursor* is the key of the last task loaded from PostgreSQL: the heap holds every pending
task whose key is <= cursor (minus those already popped). A task arriving from intake goes onto
the heap only if its key is <= cursor; otherwise the loader will read it in order later. So
memory is bounded by what is due within the horizon (and a hard cap), not by the pending count.
"""

from __future__ import annotations

import heapq

from scheduler.core import MAX_PRIORITY, Entry, Key, TaskRef

_AFTER_ALL = (MAX_PRIORITY + 1, 2**63 - 1)


class HorizonHeap:
    """A min-heap of due tasks plus the loader's cursor."""

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        self.cursor: Key = (-1, 0, 0)

    def __len__(self) -> int:
        return len(self._heap)

    def covers(self, key: Key) -> bool:
        """True when a task with this key belongs on the heap now (the loader has passed it)."""
        return key <= self.cursor

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
            self.cursor = max(self.cursor, (complete_until_ms, *_AFTER_ALL))

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

    @property
    def cursor_ms(self) -> int:
        return self.cursor[0]
