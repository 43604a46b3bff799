"""The horizon: the tasks due soon, in firing order, with a watermark of what is loaded.

`HorizonHeap` is pure bookkeeping, no I/O; `Horizon` puts it together with its lock and the
firing loop's wake-up behind `arm`, `offer`, `load`, `put_back`, `next_due`, `take_due` and
`disarm`. Entries are ordered by (due time, priority, intake sequence): among tasks due at the
same instant the higher priority (lower number) fires first, then intake order.

The *cursor* is the key of the last task loaded from PostgreSQL: the heap holds every pending
task whose key is <= cursor (minus those already popped). A task arriving from intake goes onto
the heap only if its key is <= cursor; otherwise the loader will read it in order later.

**Bounded by time, count and bytes.** The loader reads no further than `SCHEDULER_HORIZON`
ahead, and no more than the heap has room for (`SCHEDULER_HORIZON_MAX_TASKS` entries,
`SCHEDULER_HORIZON_MAX_BYTES` of them), so a million tasks due in one minute cost the heap
its bound, not a million entries. What intake, a retry or a reschedule notice pushes inside
the loaded range can still overfill it; then the heap gives up its *tail*: it keeps the
earliest entries (about 7/8 of the bound, `trim`) and moves the cursor back to just before the
first one it dropped. The dropped tasks are pending in PostgreSQL with keys past the new
cursor, so the loader reads them again, in order, when there is room: nothing is lost, and
nothing is taken out of order (every task on the heap comes before every task past the
cursor).

Why that is safe against everything else that touches the heap:
- a trim only moves the cursor back, to just before the first task it gave up, and every task
  it keeps lies at or before the new cursor;
- a load in flight (`Horizon.load`, awaiting PostgreSQL) read from the cursor it started
  with; if the cursor moved back meanwhile its page is dropped, not pushed (its tasks lie past
  the new cursor and are read again);
- intake's and a retry's write-then-offer (`arm`) hold the lock across the write: a trim
  during the write only lowers the cursor, and the offer after it compares with the new one;
- an entry pushed twice (the loader rereading a task whose claim is in flight, a put-back,
  a sweep) is harmless: a claim takes only a task still pending, unclaimed and due (so a
  stale entry can neither fire a task twice nor early), and the armed set keeps an id once.

**A cheap entry.** An entry is one `bytes` object: the key packed big-endian (due ms with
an offset so earlier instants sort first, priority, sequence: 17 bytes) followed by the task
id, so bytes order is firing order. About 80 B per task with a 26-character id, where the
tuple of four objects it replaces took ~217 B; comparing two is one `memcmp`. `pop_due`
unpacks what it hands out (`Entry` tuples): only what the claimer takes pays for that.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import struct
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from scheduler.records import MAX_PRIORITY, Entry, Key, TaskRef
from scheduler.settings import Settings

log = logging.getLogger(__name__)

AFTER_ALL = (MAX_PRIORITY + 1, 2**63 - 1)
BEFORE_ALL: Key = (-1, 0, 0)
T = TypeVar("T")

_KEY = struct.Struct(">QBQ")  # due ms + _DUE_OFFSET, priority, sequence
KEY_BYTES = _KEY.size
_DUE_OFFSET = 1 << 63  # due ms may be negative (a task due before 1970 fires at once)
# What one entry costs beyond its task id: the bytes object (header + packed key, rounded by
# the allocator) and its slot in the heap's list.
ENTRY_OVERHEAD = 64
DEFAULT_MAX_TASKS = 200_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
KEEP = 7 / 8  # a trim keeps this share of the bound, so the next one is far away
EXACT_TRIM = 4_096  # heaps up to this size are trimmed at an exact cut (a sort)
TRIM_SAMPLE = 2_048  # larger ones at a cut read off a sorted sample of this many entries


def pack(ref: TaskRef) -> bytes:
    """The heap entry of `ref`: packed key, then the id (bytes order is firing order)."""
    return _KEY.pack(ref.due_ms + _DUE_OFFSET, ref.priority, ref.seq) + ref.task_id.encode()


def unpack(packed: bytes) -> Entry:
    due, priority, seq = _KEY.unpack_from(packed)
    return (due - _DUE_OFFSET, priority, seq, packed[KEY_BYTES:].decode())


def due_of(packed: bytes) -> int:
    """The due time (epoch ms) of an entry."""
    return int.from_bytes(packed[:8], "big") - _DUE_OFFSET


def due_bound(until_ms: int) -> bytes:
    """Greater than every entry due by `until_ms`, less than every entry due later."""
    return _KEY.pack(until_ms + 1 + _DUE_OFFSET, 0, 0)


def key_before(packed: bytes) -> Key:
    """The greatest key below the entry's (a cursor that stops just short of it)."""
    due, priority, seq = _KEY.unpack_from(packed)
    return (due - _DUE_OFFSET, priority, seq - 1)


def cost(packed: bytes) -> int:
    """The bytes an entry is counted for (see `ENTRY_OVERHEAD`)."""
    return ENTRY_OVERHEAD + len(packed)


class HorizonHeap:
    """A min-heap of due tasks plus the loader's cursor, within `max_tasks` entries and
    `max_bytes` (see the module: a trim gives up the tail and moves the cursor back)."""

    def __init__(
        self, max_tasks: int = DEFAULT_MAX_TASKS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._heap: list[bytes] = []
        self.cursor: Key = BEFORE_ALL
        self.max_tasks = max(1, max_tasks)
        self.max_bytes = max(1, max_bytes)
        self.bytes = 0  # the entries' cost (`cost`)
        self.evicted = 0  # entries given up by trims, over the heap's life

    def __len__(self) -> int:
        return len(self._heap)

    # -- the storage; FairHeap keeps one heap per organisation instead ----------------------

    def _push(self, ref: TaskRef, packed: bytes) -> None:
        heapq.heappush(self._heap, packed)
        self.bytes += ENTRY_OVERHEAD + len(packed)

    def _entries(self) -> list[bytes]:
        return self._heap

    def _retain(self, keep: Callable[[bytes], bool]) -> list[bytes]:
        """Keep the entries `keep` accepts; return the others."""
        kept: list[bytes] = []
        gone: list[bytes] = []
        for e in self._heap:
            (kept if keep(e) else gone).append(e)
        heapq.heapify(kept)
        self._heap = kept
        self.bytes = sum(map(cost, kept))
        return gone

    def _keep_below(self, cut: bytes) -> int:
        """Keep the entries below `cut` (`_retain` for a trim, without a call per entry);
        return how many went."""
        heap = self._heap
        kept = [e for e in heap if e < cut]
        gone = [e for e in heap if e >= cut]
        heapq.heapify(kept)
        self._heap = kept
        self.bytes -= sum(map(cost, gone))
        return len(gone)

    def adopt(self, entries: list[bytes]) -> None:
        """Take over packed entries (split off another heap)."""
        for e in entries:
            heapq.heappush(self._heap, e)
        self.bytes += sum(map(cost, entries))

    # -- the bookkeeping ------------------------------------------------------------------

    def offer(self, ref: TaskRef) -> bool:
        """Push `ref` if the loader has passed its key; return whether it was pushed."""
        if ref.key <= self.cursor:
            self._push(ref, pack(ref))
            self._bound()
            return True
        return False

    def push(self, ref: TaskRef) -> None:
        """Push unconditionally (a retry or a reschedule of a known task)."""
        self._push(ref, pack(ref))
        self._bound()

    def loaded(
        self,
        refs: list[TaskRef],
        complete_until_ms: int | None,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        """Record a loader page: push it (with `owns`, the tasks it accepts), and advance the
        cursor to its last key.

        `complete_until_ms` says the page held every pending task due up to that time, so the
        cursor may move to the end of that millisecond even if the page was short.
        """
        for ref in refs:
            if owns is not None and not owns(ref.task_id):
                continue
            self._push(ref, pack(ref))
        if refs:
            self.cursor = max(self.cursor, refs[-1].key)
        if complete_until_ms is not None:
            self.cursor = max(self.cursor, (complete_until_ms, *AFTER_ALL))
        self._bound()

    def room(self) -> int:
        """How many more entries the bounds allow (bytes at the heap's mean entry cost)."""
        n = len(self)
        mean = self.bytes / n if n else ENTRY_OVERHEAD + KEY_BYTES + 26
        by_bytes = int((self.max_bytes - self.bytes) / mean)
        return max(0, min(self.max_tasks - n, by_bytes))

    def _bound(self) -> None:
        while (len(self) > self.max_tasks or self.bytes > self.max_bytes) and self.trim():
            pass

    def trim(self) -> int:
        """Give up the tail down to about `KEEP` of the bounds and move the cursor back before
        it; return how many entries went (the loader reads them again from PostgreSQL).

        The cut is exact on a small heap; on a large one it is read off a sorted random sample
        (`TRIM_SAMPLE` entries, within a percent or so of `KEEP`), then one pass keeps what is
        below it and rebuilds the heap: ~0.1 s for 500,000 entries where a full sort blocked
        the event loop several times longer."""
        entries = self._entries()
        n = len(entries)
        if not n:
            return 0
        mean = self.bytes / n
        keep = max(1, min(int(self.max_tasks * KEEP), int(self.max_bytes * KEEP / mean)))
        if keep >= n:
            return 0
        if n <= EXACT_TRIM:
            cut = sorted(entries)[keep]
        else:
            sample = sorted(random.sample(entries, TRIM_SAMPLE))
            cut = sample[keep * TRIM_SAMPLE // n]
        self.cursor = min(self.cursor, key_before(cut))  # every entry from `cut` on goes
        gone = self._keep_below(cut)
        self.evicted += gone
        log.info("horizon.trimmed evicted=%d kept=%d cursor=%s", gone, len(self), self.cursor)
        return gone

    def split_off(self, at: Key) -> HorizonHeap:
        """Move the entries with keys <= `at` into a new (FIFO) heap with this one's bounds;
        each keeps the cursor invariant over its own range: the new heap's cursor is the
        lesser of this cursor and `at`, this one's the greater."""
        edge = _KEY.pack(at[0] + _DUE_OFFSET, at[1], at[2])
        below = HorizonHeap(self.max_tasks, self.max_bytes)
        below.adopt(self._retain(lambda e: e[:KEY_BYTES] > edge))
        below.cursor = min(self.cursor, at)
        self.cursor = max(self.cursor, at)
        return below

    def bound(self, max_tasks: int, max_bytes: int) -> None:
        """New bounds; trimmed at once if over them."""
        self.max_tasks, self.max_bytes = max(1, max_tasks), max(1, max_bytes)
        self._bound()

    def next_due_ms(self) -> int | None:
        return due_of(self._heap[0]) if self._heap else None

    def pop_due(self, until_ms: int, limit: int) -> list[Entry]:
        """Pop up to `limit` entries due at or before `until_ms`, in firing order."""
        out: list[bytes] = []
        heap, bound = self._heap, due_bound(until_ms)
        while heap and heap[0] < bound and len(out) < limit:
            out.append(heapq.heappop(heap))
        self.bytes -= sum(map(cost, out))
        return [unpack(e) for e in out]

    def reset(self) -> None:
        """Forget everything (on losing office the next leader reloads from PostgreSQL)."""
        self._heap = []
        self.bytes = 0
        self.cursor = BEFORE_ALL


CATCHUP_LAG_MS = 1_000  # overdue by more than this when a backlog forms: part of it
# While a backlog is split off, its tasks are claimed only while fewer than this many tasks
# are armed or being claimed (`Claimer.claim_due`): a task due now is claimed first, and then
# waits behind at most that many of the backlog's to be published (2,000 at 25,000/s: 80 ms).
CATCHUP_ARMED = 2_000
# A term's growth (`Catchup.for_growth`): the tasks of the gained partitions already due when
# they are read back are a backlog at once (lag 0), and go out beside the present, at most
# this many armed or being claimed at a time: on a 2-core host at capacity an engine
# publishes a few thousand a second, so a task due now waits behind ~250 of them for a few
# milliseconds (behind 2,000 it waited 100-300 ms: issue 37's kill, bench/README.md).
GROWTH_ARMED = 250


@dataclass(frozen=True, slots=True)
class Catchup:
    """`SCHEDULER_CATCHUP=on_time_first`: while tasks overdue by more than `lag_ms` wait
    (a backlog), the horizon keeps them apart from the present, and each claim takes what
    falls due now first, giving the backlog `share` of it (all of it when nothing else is
    due), and none while `armed` tasks are armed or being claimed. See `Horizon` and
    docs/operations.md. A term that grows in place splits so whatever the setting
    (`for_growth`)."""

    share: float
    lag_ms: int = CATCHUP_LAG_MS
    armed: int = CATCHUP_ARMED

    @staticmethod
    def of(settings: Settings) -> Catchup | None:
        if settings.catchup != "on_time_first":
            return None
        return Catchup(settings.catchup_backlog_share)

    @staticmethod
    def for_growth(settings: Settings) -> Catchup:
        """The split of a term that gained partitions (`Horizon.read_back`): another engine's
        overdue tasks must not hold up the partitions this one already fires (issue 37: a
        dead engine stalls only its own share), whatever `SCHEDULER_CATCHUP` says."""
        return Catchup(settings.catchup_backlog_share, lag_ms=0, armed=GROWTH_ARMED)


class Horizon:
    """The horizon of one term: the heap (fair or FIFO, `engine.delayed.fairness.horizon_heap`),
    the lock that keeps the loader's cursor consistent with what else is offered, and the
    claimer's wake-up, behind one small API; the parts of a term share this one object.

    Whatever puts a task on the heap after writing it to PostgreSQL (intake, a retry, the loader)
    does both under the lock (`arm` with the write): otherwise the loader could read past a task
    written but not yet offered, move its cursor beyond it, and the offer would be refused.
    `hungry` is set when the claimer has taken enough off the heap for the loader to read a
    page after a load found too little room for one, or after a trim gave up the heap's tail
    (the loader waits on it, else polls every second: with room to spare, intake and notices
    offer what falls due inside the loaded range, and a load per claim step would read an
    empty page 40 times a second).

    **Catch-up** (`catchup`, off by default: due order). When on and tasks overdue by more than
    its lag wait (on the heap, or in PostgreSQL behind the cursor), the horizon splits at
    `split_at` = that instant: the tasks with keys <= it go to a heap of their own, the
    *backlog*, with its own cursor, loaded from PostgreSQL up to `split_at` only; `heap` keeps
    the present, loaded from `split_at` on. Each range keeps the cursor rule on its own, and
    every offer, put-back and page goes to the range its key falls in, so nothing changes for
    correctness; each range gets half the bounds. `take_due` serves the present first and the
    backlog its share. When the backlog is loaded to `split_at` and empty, the two are one
    again (at the loader's next page, which the claimer asks for once it took the last).

    **Growth** (`read_back` with a `Catchup.for_growth`). A term that gains partitions reads
    their tasks up to the cursor back onto the heap; those already due (a dead engine's, due
    while its leases ran out) are split off as a backlog at once, whatever the setting, so
    they go out beside the present instead of before it. The split is the same as above.
    """

    def __init__(
        self, heap: HorizonHeap | None = None, page: int = 20_000, catchup: Catchup | None = None
    ) -> None:
        self.heap = heap if heap is not None else HorizonHeap()
        self.wake = asyncio.Event()  # set when tasks go on the heap (the claimer waits on it)
        self.hungry = asyncio.Event()  # set when the loader has room for a page again
        # a load found too little room for a page, or a trim gave up the heap's tail, since
        # the loader was last woken (`hungry` once the claimer makes room); trims seen so far
        self._starved = False
        self._evicted = 0
        self.page = page
        self.catchup = catchup
        self.backlog: HorizonHeap | None = None  # while split: the tasks with keys <= split_at
        self.split_at: Key | None = None
        self.split_by: Catchup | None = None  # while split: the rule in force (share, armed)
        self._bounds = (self.heap.max_tasks, self.heap.max_bytes)
        self._lock = asyncio.Lock()
        # the tasks this term may fire, by id (None: all): under P > 1 a term holds some of the
        # partitions, and intake or a notice may name a task of another's (the loader and the
        # sweep read the term's partitions only)
        self.owns: Callable[[str], bool] | None = None
        # after a term gave partitions back (`forget_unowned`): the loader's pages, read from
        # the stores' office until the office narrows it, keep only what `owns` accepts
        self._filter_pages = False

    def _offer(self, refs: Iterable[TaskRef]) -> int:
        owns = self.owns
        return sum(
            self._heap_for(ref.key).offer(ref) for ref in refs if owns is None or owns(ref.task_id)
        )

    def __len__(self) -> int:
        return len(self.heap) + (len(self.backlog) if self.backlog is not None else 0)

    def _heap_for(self, key: Key) -> HorizonHeap:
        backlog, at = self.backlog, self.split_at
        return backlog if backlog is not None and at is not None and key <= at else self.heap

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
            pushed = self._offer(refs_of(result))
        if pushed and wake:
            self.wake.set()
        return result, pushed

    async def offer(self, ref: TaskRef) -> bool:
        """Offer one task known to be pending (a reschedule notice); wake if it went on."""
        return await self.offer_all([ref]) > 0

    async def offer_all(self, refs: Iterable[TaskRef]) -> int:
        """Offer tasks known to be pending (notices, the sweep); wake if any went on."""
        async with self._lock:
            pushed = self._offer(refs)
        if pushed:
            self.wake.set()
        return pushed

    def page_size(self, heap: HorizonHeap | None = None) -> int:
        """The page the loader may read now into `heap` (the present's by default): its room,
        at most `page`; 0 while the room is less than a page (or half the bound), so a nearly
        full heap is not topped up a few tasks at a time."""
        heap = heap if heap is not None else self.heap
        room = min(heap.room(), self.page)
        return room if room >= min(self.page, max(1, heap.max_tasks // 2)) else 0

    async def load(
        self,
        fetch: Callable[[Key, int, int], Awaitable[list[TaskRef]]],
        until_ms: int,
        now_ms: int,
    ) -> tuple[int, bool]:
        """Load the next page past each range's cursor (`fetch(cursor, until ms, limit)`, in
        firing order) within the heap's room, under the lock: the present's up to `until_ms`,
        the backlog's (while split) up to `split_at`. Returns how many tasks were loaded and
        whether a page was full (more to load now). A short page means every task up to its
        limit is in. A page read while a trim moved its cursor back is dropped (read again)."""
        async with self._lock:
            self._split_or_merge(now_ms)
            got, more = await self._load_into(self.heap, fetch, until_ms)
            if self.backlog is not None and self.split_at is not None:
                b_got, b_more = await self._load_into(self.backlog, fetch, self.split_at[0])
                got, more = got + b_got, more or b_more
                self._split_or_merge(now_ms)
        if got:
            self.wake.set()
        return got, more

    async def _load_into(
        self,
        heap: HorizonHeap,
        fetch: Callable[[Key, int, int], Awaitable[list[TaskRef]]],
        until_ms: int,
    ) -> tuple[int, bool]:
        page = self.page_size(heap)
        start = heap.cursor
        if start >= (until_ms, *AFTER_ALL):
            return 0, False
        if page <= 0:
            self._starved = True  # the claimer wakes the loader once it made room
            return 0, False
        refs = await fetch(start, until_ms, page)
        if heap.cursor != start:
            return 0, False
        heap.loaded(refs, None if len(refs) >= page else until_ms, self.narrowed)
        return len(refs), len(refs) >= page

    async def read_back(
        self,
        fetch: Callable[[Key, int, int], Awaitable[list[TaskRef]]],
        now_ms: int | None = None,
        catchup: Catchup | None = None,
    ) -> int:
        """Offer the tasks `fetch(after, until ms, limit)` reads (in firing order) up to the
        cursor, a page at a time, each page read and offered under the lock: a term that gains
        partitions reads theirs so, and the cursor rule holds for them again (above the
        cursor the loader's pages read them). While a backlog is split off each task goes to
        the range its key falls in (one the backlog's cursor has not reached is its loader's
        to read). A cursor that moves between pages is harmless: forward, the loader read what
        it passed (a task pushed twice is harmless); back (a trim), what lies past it is the
        loader's again. With `catchup` (a growth), what is overdue by its lag at `now_ms` once
        a page is on is split off as a backlog, in the same hold of the lock, before the
        claimer can take it in due order. Returns how many were pushed."""
        after, pushed = BEFORE_ALL, 0
        while True:
            async with self._lock:
                cursor = self.heap.cursor
                if after >= cursor:
                    return pushed
                refs = await fetch(after, cursor[0], self.page)
                pushed += self._offer(refs)
                if catchup is not None and now_ms is not None and self.backlog is None:
                    self._split_or_merge(now_ms, catchup)
            if pushed:
                self.wake.set()
            if len(refs) < self.page:
                return pushed
            after = refs[-1].key

    def _split_or_merge(self, now_ms: int, catchup: Catchup | None = None) -> None:
        """Split a backlog off (catch-up on, or `catchup` given: tasks overdue by more than
        its lag on the heap or behind the cursor), or join it back once it is loaded and
        drained."""
        backlog, at = self.backlog, self.split_at
        if backlog is not None and at is not None:
            if self._caught_up():
                self.backlog = self.split_at = self.split_by = None
                self.heap.bound(*self._bounds)
                log.info("horizon.caught_up")
            return
        catchup = catchup if catchup is not None else self.catchup
        if catchup is None:
            return
        edge = now_ms - catchup.lag_ms
        first = self.heap.next_due_ms()
        if self.heap.cursor[0] >= edge and (first is None or first >= edge):
            return
        at = (edge, *AFTER_ALL)
        self.backlog = self.heap.split_off(at)
        self.split_at, self.split_by = at, catchup
        half = (max(1, self._bounds[0] // 2), max(1, self._bounds[1] // 2))
        self.backlog.bound(*half)
        self.heap.bound(*half)
        log.info("horizon.backlog_split at_ms=%d on_heap=%d", edge, len(self.backlog))

    def _caught_up(self) -> bool:
        """While split: the backlog is loaded up to `split_at` and empty (one range again)."""
        backlog, at = self.backlog, self.split_at
        return backlog is not None and at is not None and not backlog and backlog.cursor >= at

    @property
    def narrowed(self) -> Callable[[str], bool] | None:
        """Once this term gave partitions back (`forget_unowned`), `owns`: what the heap, a
        loader page, a claim or a page of orphans holds of theirs is dropped; else None."""
        return self.owns if self._filter_pages else None

    def forget_unowned(self) -> None:
        """The term gave partitions back (`owns` accepts them no more): their tasks on the
        heap are dropped as they come up (`take_due`: filtering the whole heap at once, a
        hash per entry, would hold the event loop for a large one), and the loader's pages,
        read from the stores' office until the office narrows it, keep only the others.
        Their next owner loads them from PostgreSQL."""
        self._filter_pages = self.owns is not None

    def put_back(self, refs: Iterable[TaskRef], wake: bool = False) -> None:
        """Push tasks taken but not claimed back (those of this term's partitions)."""
        owns = self.owns
        for ref in refs:
            if owns is not None and not owns(ref.task_id):
                continue  # (a partition given back meanwhile: its next owner loads it)
            self._heap_for(ref.key).push(ref)
            if wake:
                self.wake.set()

    def next_due(self) -> int | None:
        """The due time (epoch ms) of the first task on the heap."""
        first = self.heap.next_due_ms()
        if self.backlog is None:
            return first
        other = self.backlog.next_due_ms()
        return other if first is None else first if other is None else min(first, other)

    def take_due(self, until_ms: int, limit: int, backlog_limit: int | None = None) -> list[Entry]:
        """Pop up to `limit` tasks due by `until_ms`, in firing order; wake the loader when
        that made room for the page a load had no room for (or a trim gave up). While a
        backlog is split off: the present first, leaving the backlog its share of `limit` (at
        most `backlog_limit`), and all the rest when the present has nothing due."""
        backlog, split_by = self.backlog, self.split_by
        if backlog is None or split_by is None:
            out = self.heap.pop_due(until_ms, limit)
        else:
            cap = limit if backlog_limit is None else max(0, min(limit, backlog_limit))
            first = backlog.next_due_ms()
            reserve = 0
            if cap and first is not None and first <= until_ms:
                reserve = min(cap, max(1, int(limit * split_by.share)))
            out = self.heap.pop_due(until_ms, limit - reserve)
            out += backlog.pop_due(until_ms, min(cap, limit - len(out)))
        evicted = self.heap.evicted + (backlog.evicted if backlog is not None else 0)
        if evicted != self._evicted:  # a trim moved a cursor back: the loader reads past it
            self._evicted, self._starved = evicted, True
        if (
            out
            and self._starved
            and (self.page_size() or (backlog is not None and self.page_size(backlog)))
        ):
            self._starved = False
            self.hungry.set()
        if out and self._caught_up():  # the loader's next page joins the two ranges again
            self.hungry.set()
        owns = self.narrowed
        if owns is not None and out:
            out = [e for e in out if owns(e[3])]  # (a partition given back: not ours now)
        return out

    def disarm(self) -> None:
        """Forget every task (office lost: the next leader reloads from PostgreSQL)."""
        self.heap.reset()
        self.heap.bound(*self._bounds)
        self.backlog = self.split_at = self.split_by = None
        self._filter_pages = False

    def wake_up(self) -> None:
        self.wake.set()
