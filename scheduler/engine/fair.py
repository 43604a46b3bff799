"""Fair firing: tasks due together are taken round-robin by organisation, weighted by share.

Two stages decide the order in which due tasks go out, and both take turns here when
`fair_firing` is on (the default):

- `FairHeap` (the horizon's heap): one min-heap per organisation in firing order, and an index
  of each organisation's first due time. `pop_due` takes, from every organisation with a task
  due, up to its share per round (`org_shares`, 1 unless named), round after round, until the
  claim's limit. So org B's task due now is claimed in the next claim step even behind
  200,000 tasks org A scheduled for one instant, instead of after all of them.
- `FairArmed` (the claimed tasks waiting for their millisecond), also one sorted list per
  organisation: the dispatcher takes at most `FAIR_CHUNK` due tasks per hand-over to the
  publisher, chosen the same way, so a task armed while a backlog drains waits behind at most
  one chunk, not behind the whole armed set.

Within one organisation the order stays the firing order (due time, priority, intake
sequence); across organisations a turn ignores priority. Tasks without an `org_id` form one
group of their own (the unnamed organisation, `""`). With `fair_firing` off both stages are the
plain FIFO ones (`HorizonHeap`, `Armed`).

Costs: a heap push or pop is one heap operation in the organisation's heap, plus one in the
index when the organisation's first task changes (O(log orgs)). `pop_due` touches each
organisation with something due once per call. `FairArmed.pop_due` costs a bisection per
organisation holding armed tasks plus the slices it hands out.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping

from scheduler.core import ClaimedTask, Entry, TaskRef, to_ms
from scheduler.engine.armed import _AFTER_PRIORITIES, _LAST, Armed, Slot
from scheduler.engine.heap import _AFTER_ALL, HorizonHeap
from scheduler.settings import Settings

# Tasks handed to the publisher per turn while a backlog drains: behind a chunk a newly armed
# task waits about FAIR_CHUNK / drain rate (250 at 25,000/s: 10 ms).
FAIR_CHUNK = 250
# Tasks per claim when fair: a claim's result is taken after those started before it, so a
# task due soon waits for up to CLAIMS_IN_FLIGHT - 1 claims of another org's backlog; small
# claims keep that wait inside the claimer's lookahead.
FAIR_CLAIM = 250
# Outcomes held back while a backlog drains, when fair: recording them blocks the event loop
# for a time proportional to their number (about 2 us each), and a task of another org due
# meanwhile waits; 5,000 keep each such pause near 10 ms.
FAIR_BOOK_DEFER = 5_000
# Publishes in flight (unacknowledged) before the dispatcher hands over the next chunk, when
# fair: a task handed over waits behind them at the server (1,000 at 25,000/s: 40 ms).
FAIR_INFLIGHT = 300
# How far ahead the claimer claims while a backlog is overdue, when fair: claims are taken in
# the order they started, so another org's task claimed 80 ms ahead may still be waiting
# behind three claims of the backlog when it falls due. A cancel that comes later than this
# before the due time of such a task answers `too_late` (without a backlog: 80 ms).
FAIR_BUSY_LOOKAHEAD_MS = 250
UNNAMED = ""  # the group of tasks without an org_id


def _org(ref: TaskRef) -> str:
    return ref.org or UNNAMED


class FairHeap(HorizonHeap):
    """The horizon's heap kept per organisation; `pop_due` takes turns (see the module)."""

    def __init__(self, shares: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.shares = dict(shares or {})
        self._orgs: dict[str, list[Entry]] = {}
        # (due ms of an org's first task, org), lazily pruned: an entry is current while that
        # org's first task is due at that ms
        self._firsts: list[tuple[int, str]] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _push(self, org: str, entry: Entry) -> None:
        heap = self._orgs.get(org)
        if heap is None:
            heap = self._orgs[org] = []
        if not heap or entry < heap[0]:
            heapq.heappush(self._firsts, (entry[0], org))
        heapq.heappush(heap, entry)
        self._size += 1

    def _current(self, due: int, org: str) -> bool:
        heap = self._orgs.get(org)
        return bool(heap) and heap[0][0] == due  # type: ignore[index]

    def offer(self, ref: TaskRef) -> bool:
        if ref.key <= self.cursor:
            self._push(_org(ref), ref.entry)
            return True
        return False

    def push(self, ref: TaskRef) -> None:
        self._push(_org(ref), ref.entry)

    def loaded(self, refs: list[TaskRef], complete_until_ms: int | None) -> None:
        for ref in refs:
            self._push(_org(ref), ref.entry)
        if refs:
            self.cursor = max(self.cursor, refs[-1].key)
        if complete_until_ms is not None:
            self.cursor = max(self.cursor, (complete_until_ms, *_AFTER_ALL))

    def next_due_ms(self) -> int | None:
        firsts = self._firsts
        while firsts and not self._current(*firsts[0]):
            heapq.heappop(firsts)
        return firsts[0][0] if firsts else None

    def pop_due(self, until_ms: int, limit: int) -> list[Entry]:
        """Up to `limit` entries due by `until_ms`: each organisation with one due gives up
        to its share per round, the earliest-due organisation first."""
        firsts, orgs = self._firsts, self._orgs
        due_orgs: list[str] = []
        seen: set[str] = set()
        while firsts and firsts[0][0] <= until_ms:
            due, org = heapq.heappop(firsts)
            if self._current(due, org) and org not in seen:
                seen.add(org)
                due_orgs.append(org)
        out: list[Entry] = []
        active = due_orgs
        while active and len(out) < limit:
            still = []
            for org in active:
                heap = orgs[org]
                for _ in range(min(self.shares.get(org, 1), limit - len(out))):
                    if not heap or heap[0][0] > until_ms:
                        break
                    out.append(heapq.heappop(heap))
                if heap and heap[0][0] <= until_ms:
                    still.append(org)
                if len(out) >= limit:
                    break
            active = still
        for org in due_orgs:
            heap = orgs[org]
            if heap:
                heapq.heappush(firsts, (heap[0][0], org))
            else:
                del orgs[org]
        self._size -= len(out)
        return out

    def reset(self) -> None:
        super().reset()
        self._orgs.clear()
        self._firsts.clear()
        self._size = 0


class FairArmed(Armed):
    """The armed set kept per organisation, each in firing order, handing due tasks out at
    most `chunk` at a time and taking turns by organisation (see the module)."""

    def __init__(
        self,
        max_count: int,
        max_bytes: int,
        shares: Mapping[str, int] | None = None,
        chunk: int = FAIR_CHUNK,
    ) -> None:
        super().__init__(max_count, max_bytes)
        self.shares = dict(shares or {})
        self.chunk = chunk
        self._orgs: dict[str, list[Slot]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def add(self, tasks: Iterable[ClaimedTask]) -> int:
        ids, numbers = self._ids, self._numbers
        new: dict[str, list[Slot]] = {}
        size = added = 0
        for t in tasks:
            if t.id in ids:
                continue
            ids.add(t.id)
            size += len(t.payload)
            slot = (to_ms(t.due_at), t.priority, t.seq, next(numbers), t)
            new.setdefault(t.org_id or UNNAMED, []).append(slot)
            added += 1
        for org, slots in new.items():
            slots.sort()
            have = self._orgs.setdefault(org, [])
            in_order = not have or slots[0] >= have[-1]
            have.extend(slots)
            if not in_order:
                have.sort()
        self.bytes += size
        self._count += added
        return added

    def next_due_ms(self) -> int | None:
        return min((s[0][0] for s in self._orgs.values() if s), default=None)

    def pop_due(self, now_ms: int) -> list[Slot]:
        """Up to `chunk` due entries: each organisation gives up to its share per round, the
        one whose first task is earliest first; each organisation's own in firing order."""
        due: dict[str, int] = {}
        for org, slots in self._orgs.items():
            cut = bisect.bisect_right(slots, (now_ms, _AFTER_PRIORITIES))
            if cut:
                due[org] = cut
        if not due:
            return []
        order = sorted(due, key=lambda o: self._orgs[o][0])
        taken = dict.fromkeys(order, 0)
        out: list[Slot] = []
        while len(out) < self.chunk:
            before = len(out)
            for org in order:
                start = taken[org]
                n = min(self.shares.get(org, 1), due[org] - start, self.chunk - len(out))
                if n > 0:
                    out += self._orgs[org][start : start + n]
                    taken[org] = start + n
            if len(out) == before:
                break
        for org, n in taken.items():
            self._orgs[org] = self._orgs[org][n:]
        self._drop(out)
        return out

    def take_after(self, due_ms: int, priority: int, seq: int) -> list[ClaimedTask]:
        later: list[Slot] = []
        for org, slots in self._orgs.items():
            cut = bisect.bisect_right(slots, (due_ms, priority, seq, _LAST))
            later += slots[cut:]
            self._orgs[org] = slots[:cut]
        later.sort()
        self._drop(later)
        return [s[4] for s in later]

    def clear(self) -> list[ClaimedTask]:
        slots = sorted(s for org in self._orgs.values() for s in org)
        self._orgs.clear()
        self._drop(slots)
        return [s[4] for s in slots]

    def room(self) -> int:
        if self._count and self.bytes >= self.max_bytes:
            return 0
        return max(0, self.max_count - self._count)

    def byte_room(self) -> int:
        if not self._count:
            return max(self.max_bytes, 1)
        return max(self.max_bytes - self.bytes, 0)

    def _drop(self, slots: list[Slot]) -> None:
        self._forget(slots)
        self._count -= len(slots)
        for org in [o for o, s in self._orgs.items() if not s]:
            del self._orgs[org]


def horizon_heap(settings: Settings) -> HorizonHeap:
    """The heap the settings ask for: fair by organisation, or plain FIFO."""
    return FairHeap(settings.org_shares) if settings.fair_firing else HorizonHeap()


def armed_set(settings: Settings) -> Armed:
    """The armed set the settings ask for: fair by organisation, or plain FIFO."""
    if settings.fair_firing:
        return FairArmed(settings.armed_max, settings.armed_max_bytes, settings.org_shares)
    return Armed(settings.armed_max, settings.armed_max_bytes)


def claim_limit(settings: Settings) -> int:
    """Tasks per claim: `batch`, or at most FAIR_CLAIM when fair."""
    return min(settings.batch, FAIR_CLAIM) if settings.fair_firing else settings.batch


def book_defer_max(settings: Settings, default: int) -> int:
    """Outcomes the bookkeeper may hold back during a drain: fewer when fair."""
    return min(default, FAIR_BOOK_DEFER) if settings.fair_firing else default


def inflight_cap(settings: Settings) -> int:
    """Unacknowledged publishes after which the dispatcher waits: FAIR_INFLIGHT when fair,
    else no cap of its own (the publisher's window applies)."""
    return FAIR_INFLIGHT if settings.fair_firing else 2**62


def busy_lookahead(settings: Settings, default: int) -> int:
    """The claimer's lookahead while tasks are overdue: longer when fair."""
    return max(default, FAIR_BUSY_LOOKAHEAD_MS) if settings.fair_firing else default
