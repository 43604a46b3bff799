"""Fair firing: tasks due together are taken round-robin by organisation, weighted by share.

Two stages decide the order in which due tasks go out, and both take turns here when
`fair_firing` is on (off by default, see docs/security.md):

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

Fair firing also throttles the path behind those turns (small claims, small chunks, few
publishes unacknowledged, see the constants below), so that a task of another organisation
handed over during a backlog is not queued behind thousands of the backlog's at the server.
`Throttles` applies them only while two or more organisations have tasks armed or due within
`CONTENDED_WINDOW_MS`; one organisation alone (a single tenant's burst, a steady stream of one
org) runs on exactly the FIFO path's limits, and a single organisation's turns cost one heap
operation per task like the FIFO heap.

Costs: a heap push or pop is one heap operation in the organisation's heap, plus one in the
index when the organisation's first task changes (O(log orgs)). `pop_due` touches each
organisation with something due once per call. `FairArmed.pop_due` costs a bisection per
organisation holding armed tasks plus the slices it hands out. `Throttles.update`, at most
once a millisecond, walks the index entries due within the window and stops at the second
organisation it finds.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Collection, Iterable, Mapping

from scheduler.engine.delayed.armed import AFTER_PRIORITIES, LAST_ARMING, Armed, Slot
from scheduler.engine.delayed.horizon import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_TASKS,
    HorizonHeap,
    cost,
    due_bound,
    due_of,
    unpack,
)
from scheduler.records import ClaimedTask, Entry, TaskRef, to_ms
from scheduler.settings import Settings

# The limits below apply while two or more organisations compete (see `Throttles`).
# Tasks handed to the publisher per turn while a backlog drains: behind a chunk a newly armed
# task waits about FAIR_CHUNK / drain rate (250 at 25,000/s: 10 ms).
FAIR_CHUNK = 100
# Tasks per claim: a claim's result is taken after those started before it, so a
# task due soon waits for up to CLAIMS_IN_FLIGHT - 1 claims of another org's backlog; small
# claims keep that wait inside the claimer's lookahead.
FAIR_CLAIM = 250
# Outcomes held back while a backlog drains: recording them blocks the event loop for a time
# proportional to their number (about 2 us each), and a task of another org due meanwhile
# waits; 5,000 keep each such pause near 10 ms.
FAIR_BOOK_DEFER = 5_000
# Publishes in flight (unacknowledged) before the dispatcher hands over the next chunk: a
# task handed over waits behind them at the server (1,000 at 25,000/s: 40 ms) ...
FAIR_INFLIGHT = 150
# ... and payload bytes in flight, so large payloads keep that wait as short
FAIR_INFLIGHT_BYTES = 1 << 20
# An org with fewer publishes than this unacknowledged may hand over due tasks (up to that
# many) even while the caps above are reached: another org's task then goes out at its due
# millisecond, not when enough of the backlog's acks have come back.
FAIR_ALLOWANCE = 20
# Fair limits apply while two or more orgs have tasks armed or due within this window (see
# Throttles); one org alone drains on the FIFO path's limits.
CONTENDED_WINDOW_MS = 1_000
# How far ahead the claimer claims while a backlog is overdue: claims are taken in
# the order they started, so another org's task claimed 80 ms ahead may still be waiting
# behind three claims of the backlog when it falls due. A cancel that comes later than this
# before the due time of such a task answers `too_late` (without a backlog: 80 ms).
FAIR_BUSY_LOOKAHEAD_MS = 250
UNNAMED = ""  # the group of tasks without an org_id


def _org(ref: TaskRef) -> str:
    return ref.org or UNNAMED


class FairHeap(HorizonHeap):
    """The horizon's heap kept per organisation; `pop_due` takes turns (see the module). Its
    bounds and trims are the `HorizonHeap`'s, over all organisations together (the cursor
    is one, in firing order)."""

    def __init__(
        self,
        shares: Mapping[str, int] | None = None,
        max_tasks: int = DEFAULT_MAX_TASKS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        super().__init__(max_tasks, max_bytes)
        self.shares = dict(shares or {})
        self._orgs: dict[str, list[bytes]] = {}
        # (due ms of an org's first task, org), lazily pruned: an entry is current while that
        # org's first task is due at that ms
        self._firsts: list[tuple[int, str]] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _push(self, ref: TaskRef, packed: bytes) -> None:
        org = _org(ref)
        heap = self._orgs.get(org)
        if heap is None:
            heap = self._orgs[org] = []
        if not heap or packed < heap[0]:
            heapq.heappush(self._firsts, (ref.due_ms, org))
        heapq.heappush(heap, packed)
        self._size += 1
        self.bytes += cost(packed)

    def _entries(self) -> list[bytes]:
        return [e for heap in self._orgs.values() for e in heap]

    def _retain(self, keep: Callable[[bytes], bool]) -> list[bytes]:
        gone: list[bytes] = []
        for org in list(self._orgs):
            heap: list[bytes] = []
            for e in self._orgs[org]:
                (heap if keep(e) else gone).append(e)
            if heap:
                heapq.heapify(heap)
                self._orgs[org] = heap
            else:
                del self._orgs[org]
        self._firsts = [(due_of(heap[0]), org) for org, heap in self._orgs.items()]
        heapq.heapify(self._firsts)
        self._size = sum(map(len, self._orgs.values()))
        self.bytes = sum(cost(e) for heap in self._orgs.values() for e in heap)
        return gone

    def _keep_below(self, cut: bytes) -> int:
        return len(self._retain(lambda e: e < cut))

    def _current(self, due: int, org: str) -> bool:
        heap = self._orgs.get(org)
        return bool(heap and due_of(heap[0]) == due)

    def next_due_ms(self) -> int | None:
        firsts = self._firsts
        while firsts and not self._current(*firsts[0]):
            heapq.heappop(firsts)
        return firsts[0][0] if firsts else None

    def orgs_due_by(self, until_ms: int, known: Iterable[str] = (), enough: int = 2) -> int:
        """How many organisations, counting `known`, have a task due by `until_ms`; the count
        stops at `enough`. Walks only the index entries due by then (the index is a heap: they
        form a subtree at its root)."""
        found = set(known)
        firsts, stack = self._firsts, [0]
        while stack and len(found) < enough:
            i = stack.pop()
            if i >= len(firsts) or firsts[i][0] > until_ms:
                continue
            if self._current(*firsts[i]):
                found.add(firsts[i][1])
            stack += (2 * i + 1, 2 * i + 2)
        return min(len(found), enough)

    def pop_due(self, until_ms: int, limit: int) -> list[Entry]:
        """Up to `limit` entries due by `until_ms`: each organisation with one due gives up
        to its share per round, the earliest-due organisation first."""
        firsts, orgs = self._firsts, self._orgs
        bound = due_bound(until_ms)
        due_orgs: list[str] = []
        seen: set[str] = set()
        while firsts and firsts[0][0] <= until_ms:
            due, org = heapq.heappop(firsts)
            if self._current(due, org) and org not in seen:
                seen.add(org)
                due_orgs.append(org)
        out: list[bytes] = []
        if len(due_orgs) == 1:  # one organisation: its own order, no turns to take
            heap = orgs[due_orgs[0]]
            while heap and heap[0] < bound and len(out) < limit:
                out.append(heapq.heappop(heap))
        active = due_orgs if len(due_orgs) > 1 else []
        while active and len(out) < limit:
            still = []
            for org in active:
                heap = orgs[org]
                for _ in range(min(self.shares.get(org, 1), limit - len(out))):
                    if not heap or heap[0] >= bound:
                        break
                    out.append(heapq.heappop(heap))
                if heap and heap[0] < bound:
                    still.append(org)
                if len(out) >= limit:
                    break
            active = still
        for org in due_orgs:
            heap = orgs[org]
            if heap:
                heapq.heappush(firsts, (due_of(heap[0]), org))
            else:
                del orgs[org]
        self._size -= len(out)
        self.bytes -= sum(map(cost, out))
        return [unpack(e) for e in out]

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

    def next_due_ms(self, allow: Mapping[str, int] | None = None) -> int | None:
        """The first due time, of the organisations in `allow` when given."""
        orgs = self._orgs
        if allow is None:
            return min((s[0][0] for s in orgs.values() if s), default=None)
        return min((orgs[o][0][0] for o in allow if orgs.get(o)), default=None)

    def orgs(self) -> Collection[str]:
        """The organisations with tasks armed."""
        return self._orgs.keys()

    def pop_due(self, now_ms: int, allow: Mapping[str, int] | None = None) -> list[Slot]:
        """Up to `chunk` due entries: each organisation gives up to its share per round, the
        one whose first task is earliest first; each organisation's own in firing order.
        With one organisation due, its due entries up to `chunk` (one slice). With `allow`,
        only the organisations it names, each at most the number it gives."""
        due: dict[str, int] = {}
        for org, slots in self._orgs.items():
            if allow is not None and org not in allow:
                continue
            cut = bisect.bisect_right(slots, (now_ms, AFTER_PRIORITIES))
            if allow is not None:
                cut = min(cut, allow[org])
            if cut:
                due[org] = cut
        if not due:
            return []
        if len(due) == 1:
            [(org, cut)] = due.items()
            slots = self._orgs[org]
            cut = min(cut, self.chunk)
            out, self._orgs[org] = slots[:cut], slots[cut:]
            self._drop(out)
            return out
        order = sorted(due, key=lambda o: self._orgs[o][0])
        taken = dict.fromkeys(order, 0)
        out = []  # list[Slot], as in the one-organisation case above
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
            cut = bisect.bisect_right(slots, (due_ms, priority, seq, LAST_ARMING))
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
    bounds = (settings.horizon_max_tasks, settings.horizon_max_bytes)
    if settings.fair_firing:
        return FairHeap(settings.org_shares, *bounds)
    return HorizonHeap(*bounds)


def armed_set(settings: Settings) -> Armed:
    """The armed set the settings ask for: fair by organisation, or plain FIFO."""
    if settings.fair_firing:
        return FairArmed(settings.armed_max, settings.armed_max_bytes, settings.org_shares)
    return Armed(settings.armed_max, settings.armed_max_bytes)


class Throttles:
    """The limits the firing path applies now. While at most one organisation has tasks
    armed or due within `CONTENDED_WINDOW_MS`, exactly the FIFO ones (one org's burst drains
    as fast as with fair firing off); while two or more do, the fair ones above (chunks of
    `FAIR_CHUNK`, claims of `FAIR_CLAIM`, `FAIR_INFLIGHT` publishes or `FAIR_INFLIGHT_BYTES`
    unacknowledged, the longer busy lookahead, fewer outcomes held back). The window looks
    ahead so the publisher's queue is short by the time the second org's first task is due.
    With `fair_firing` off, never contended."""

    def __init__(self, settings: Settings, heap: HorizonHeap, armed: Armed) -> None:
        self.batch = settings.batch
        self._heap: FairHeap | None = None
        self._armed: FairArmed | None = None
        if isinstance(heap, FairHeap) and isinstance(armed, FairArmed):
            self._heap, self._armed = heap, armed
        self.fair = self._heap is not None
        self.contended = False
        self._at_ms: int | None = None
        self._set(False)

    def update(self, now_ms: int) -> bool:
        """Whether two or more organisations compete now (looked at once per millisecond)."""
        heap, armed = self._heap, self._armed
        if heap is None or armed is None or now_ms == self._at_ms:
            return self.contended
        self._at_ms = now_ms
        orgs = armed.orgs()
        contended = len(orgs) >= 2 or heap.orgs_due_by(now_ms + CONTENDED_WINDOW_MS, orgs) >= 2
        if contended != self.contended:
            self._set(contended)
        return contended

    def _set(self, contended: bool) -> None:
        self.contended = contended
        self.claim_limit = min(self.batch, FAIR_CLAIM) if contended else self.batch
        self.inflight_cap = FAIR_INFLIGHT if contended else 2**62
        self.inflight_bytes_cap = FAIR_INFLIGHT_BYTES if contended else 2**62
        if self._armed is not None:
            self._armed.chunk = FAIR_CHUNK if contended else 2**62

    def allowance(self, armed: FairArmed, inflight: Mapping[str, int]) -> dict[str, int]:
        """While the in-flight caps are reached: how many due tasks each armed organisation
        with fewer than `FAIR_ALLOWANCE` unacknowledged may still hand over."""
        return {
            org: FAIR_ALLOWANCE - n
            for org in armed.orgs()
            if (n := inflight.get(org, 0)) < FAIR_ALLOWANCE
        }

    def busy_lookahead(self, default: int) -> int:
        """The claimer's lookahead while tasks are overdue: longer while contended."""
        return max(default, FAIR_BUSY_LOOKAHEAD_MS) if self.contended else default

    def book_defer_max(self, default: int) -> int:
        """Outcomes the bookkeeper may hold back during a drain: fewer while contended."""
        return min(default, FAIR_BOOK_DEFER) if self.contended else default
