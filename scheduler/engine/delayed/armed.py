"""The armed set: claimed tasks waiting for their due millisecond, in firing order, bounded.

Pure bookkeeping, no I/O. Each entry is keyed by (due ms, priority, intake sequence, arming
number). The arming number is unique, so two keys never tie and a comparison never reaches the
task object (whose payload cannot be ordered): the sort can neither raise nor leave the list
half-sorted. A task id armed while it is already armed (a reclaim racing a claim of the same
row) is kept once. The count and the payload bytes held are tracked against two limits, so the
claimer stops claiming while the set is full and memory stays bounded during a burst.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Collection, Iterable

from scheduler.records import ClaimedTask, to_ms

# (due_ms, priority, seq, arming number, task)
Slot = tuple[int, int, int, int, ClaimedTask]
AFTER_PRIORITIES = 99  # sorts after every priority (1-10) of the same millisecond
LAST_ARMING = 2**63  # sorts after every arming number


class Armed:
    """Claimed tasks in firing order, at most `max_count` of them or `max_bytes` of payload
    (a single task larger than the byte limit is still admitted when the set is empty)."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.bytes = 0
        self._slots: list[Slot] = []
        self._ids: set[str] = set()
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._slots)

    def __bool__(self) -> bool:
        return bool(self._slots)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self._ids

    def ids(self) -> Collection[str]:
        """The ids of the tasks armed (a view: not to be changed)."""
        return self._ids

    def add(self, tasks: Iterable[ClaimedTask]) -> int:
        """Arm `tasks` (any order); ids already armed are skipped. Returns how many were new."""
        ids, numbers = self._ids, self._numbers
        new: list[Slot] = []
        size = 0
        for t in tasks:
            if t.id in ids:
                continue
            ids.add(t.id)
            size += len(t.payload)
            new.append((to_ms(t.due_at), t.priority, t.seq, next(numbers), t))
        if not new:
            return 0
        new.sort()
        slots = self._slots
        in_order = not slots or new[0] >= slots[-1]
        slots.extend(new)
        if not in_order:  # a retry or an older claim: merge (two sorted runs, one pass)
            slots.sort()
        self.bytes += size
        return len(new)

    def next_due_ms(self) -> int | None:
        return self._slots[0][0] if self._slots else None

    def pop_due(self, now_ms: int) -> list[Slot]:
        """Take every entry due at or before `now_ms`, in firing order."""
        slots = self._slots
        cut = bisect.bisect_right(slots, (now_ms, AFTER_PRIORITIES))
        if cut == 0:
            return []
        due, self._slots = slots[:cut], slots[cut:]
        self._forget(due)
        return due

    def take_after(self, due_ms: int, priority: int, seq: int) -> list[ClaimedTask]:
        """Take every entry whose key comes after (due_ms, priority, seq), in firing order."""
        slots = self._slots
        cut = bisect.bisect_right(slots, (due_ms, priority, seq, LAST_ARMING))
        if cut == len(slots):
            return []
        later, self._slots = slots[cut:], slots[:cut]
        self._forget(later)
        return [s[4] for s in later]

    def clear(self) -> list[ClaimedTask]:
        """Take everything (losing office: the tasks stay claimed for the next leader)."""
        slots, self._slots = self._slots, []
        self._forget(slots)
        return [s[4] for s in slots]

    def room(self) -> int:
        """How many more tasks may be claimed now (0 while either limit is reached)."""
        if self._slots and self.bytes >= self.max_bytes:
            return 0
        return max(0, self.max_count - len(self._slots))

    def byte_room(self) -> int:
        """Payload bytes the set may still take (at least 1, so one task always fits when
        it is empty)."""
        if not self._slots:
            return max(self.max_bytes, 1)
        return max(self.max_bytes - self.bytes, 0)

    def _forget(self, slots: list[Slot]) -> None:
        ids = self._ids
        size = 0
        for s in slots:
            ids.discard(s[4].id)
            size += len(s[4].payload)
        self.bytes -= size
