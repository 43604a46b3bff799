"""The horizon heap: firing order, the loader cursor, and bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scheduler.engine.delayed.horizon import HorizonHeap
from scheduler.records import TaskRef


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


def test_an_entry_is_one_small_bytes_object() -> None:
    """A heap entry packs the key before the id, so bytes order is firing order, and costs
    well under half the ~217 B of the tuple it replaced."""
    import sys

    from scheduler.engine.delayed.horizon import pack, unpack

    refs = [ref("b", 100, 5, 2), ref("a", 100, 1, 9), ref("c", -5, 9, 1), ref("d", 101, 1, 0)]
    assert sorted(map(pack, refs)) == [pack(r) for r in sorted(refs, key=lambda r: r.key)]
    assert unpack(pack(ref("x" * 26, 1_764_000_000_123, 3, 2**40))) == (
        1_764_000_000_123, 3, 2**40, "x" * 26
    )  # fmt: skip
    assert sys.getsizeof(pack(ref("01JDQ4B8Z5W3M0X2K9V7C6N1PA", 1_764_000_000_123, 5, 10**9))) < 90


def test_a_full_heap_gives_up_its_tail_and_moves_the_cursor_back() -> None:
    """Past its count bound the heap keeps the earliest 7/8 and sets the cursor just before
    the first task it gave up, so those are offered no more and loaded again in order."""
    heap = HorizonHeap(max_tasks=16)
    heap.loaded([ref(f"t{i}", 100, 5, i) for i in range(1, 17)], 1000)  # exactly full
    assert len(heap) == 16 and heap.cursor == (1000, 11, 2**63 - 1)
    assert heap.offer(ref("early", 50, 5, 99))  # 17 > 16: trimmed to 14
    assert len(heap) == 14 and heap.cursor == (100, 5, 14 - 1)  # early, t1..t13 kept
    assert not heap.offer(ref("t14-again", 100, 5, 14))  # past the cursor now
    assert [e[3] for e in heap.pop_due(1000, 100)] == ["early", *(f"t{i}" for i in range(1, 14))]


def test_the_byte_bound_trims_long_ids_first_come() -> None:
    """Long ids fill the byte bound before the count bound: the heap keeps within both."""
    heap = HorizonHeap(max_tasks=1_000, max_bytes=10_000)
    heap.loaded([ref(f"{i:03d}" + "x" * 197, 100, 5, i) for i in range(100)], 1000)
    assert heap.bytes <= 10_000 and len(heap) < 100
    assert heap.cursor == (100, 5, len(heap) - 1)  # kept 0..n-1, the rest to be read again
    assert heap.room() < len(heap) // 7 + 1


def test_room_is_what_the_bounds_leave() -> None:
    """The loader's page is the room left: by count, or by bytes at the mean entry cost."""
    heap = HorizonHeap(max_tasks=100, max_bytes=1 << 30)
    assert heap.room() == 100
    heap.loaded([ref(str(i), 1, seq=i) for i in range(40)], None)
    assert heap.room() == 60


@st.composite
def _ops(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    kinds = st.sampled_from(["load", "offer", "offer", "offer", "pop", "put_back"])
    return draw(
        st.lists(st.tuples(kinds, st.integers(0, 40), st.integers(1, 12)), min_size=5, max_size=150)
    )


@settings(max_examples=300, deadline=None)
@given(_ops(), st.sampled_from([10, 16, 33]), st.booleans())
@example([("load", 0, 1)] + [("offer", 40 - i, 3) for i in range(40)], 10, False)
@example([("load", 0, 1)] + [("offer", 40 - i, 3) for i in range(40)], 10, True)
def test_a_bounded_heap_never_loses_doubles_or_reorders(
    ops: list[tuple[str, int, int]], bound: int, fair: bool
) -> None:
    """Against a model store: loader pages (within the room), intake offers at any key,
    claims popping what is due, and put-backs, with the heap at a small bound. Every pop
    is the earliest pending task, the bound holds after every step, and once everything
    is loaded and popped each task came out exactly once."""
    from scheduler.engine.delayed.fairness import FairHeap

    heap: HorizonHeap = FairHeap(max_tasks=bound) if fair else HorizonHeap(max_tasks=bound)
    pending: dict[tuple[int, int, int], TaskRef] = {}  # the store: not yet claimed
    popped: list[str] = []
    seq = 0

    def load(limit: int) -> None:
        room = min(limit, heap.room())
        if room <= 0:
            return
        page = sorted(k for k in pending if k > heap.cursor)[:room]
        heap.loaded([pending[k] for k in page], None if len(page) == room else 10_000)

    def pop(until: int, limit: int) -> list[TaskRef]:
        out = []
        for due, priority, s, task_id in heap.pop_due(until, limit):
            key = (due, priority, s)
            if key not in pending:  # a duplicate entry: the claim skips it
                continue
            earliest = min(k for k in pending if k[0] <= until)
            assert key == earliest or fair, (key, earliest)
            out.append(pending.pop(key))
            popped.append(task_id)
        return out

    for kind, a, b in ops:
        if kind == "load":
            load(b * 3)
        elif kind == "offer":
            seq += 1
            r = TaskRef(f"t{seq}", a * 10, 1 + b % 10, seq)
            pending[r.key] = r
            heap.offer(r)
        elif kind == "pop":
            pop(a * 10, b)
        else:  # a claim that failed: its tasks go back
            taken = pop(a * 10, b)
            for r in taken:
                pending[r.key] = r
                popped.remove(r.task_id)
            for r in taken:
                heap.push(r)
        assert len(heap) <= bound
        assert heap.bytes <= heap.max_bytes
    for _ in range(10_000):
        if not pending:
            break
        load(bound)
        pop(10_000, bound)
    assert not pending
    assert sorted(popped) == sorted(f"t{i}" for i in range(1, seq + 1))


def test_split_off_keeps_the_cursor_rule_on_both_sides() -> None:
    """Splitting at a key moves the entries up to it to a heap of their own; the backlog's
    cursor stops at the split, the present's starts there (each range complete on its own)."""
    heap = HorizonHeap(max_tasks=100)
    heap.loaded([ref(f"t{i}", i * 10, 5, i) for i in range(10)], None)  # cursor: t9's key
    backlog = heap.split_off((45, 11, 2**63 - 1))
    assert [e[3] for e in backlog.pop_due(1000, 100)] == ["t0", "t1", "t2", "t3", "t4"]
    assert backlog.cursor == (45, 11, 2**63 - 1) and heap.cursor == (90, 5, 9)
    assert [e[3] for e in heap.pop_due(1000, 100)] == ["t5", "t6", "t7", "t8", "t9"]
    behind = HorizonHeap(max_tasks=100)
    behind.loaded([ref("a", 10, 5, 1)], None)  # PostgreSQL holds more past a's key
    older = behind.split_off((45, 11, 2**63 - 1))
    assert older.cursor == (10, 5, 1) and behind.cursor == (45, 11, 2**63 - 1)
    assert not older.offer(ref("b", 20, 5, 2)) and not behind.offer(ref("c", 46, 5, 3))


def test_a_large_heap_trims_at_a_sampled_cut_and_keeps_the_cursor_rule() -> None:
    """A heap past `EXACT_TRIM` entries cuts at a sampled quantile: it keeps about 7/8 of its
    bound, everything it keeps is at or before the cursor, and every task it dropped is past
    the cursor (so the loader reads it again)."""
    import random as rnd

    from scheduler.engine.delayed.horizon import EXACT_TRIM

    bound = 3 * EXACT_TRIM
    heap = HorizonHeap(max_tasks=bound)
    refs = [ref(f"t{i}", i, 5, i) for i in range(bound)]
    heap.loaded(refs, None)
    extra = [ref(f"x{i}", rnd.randrange(bound), 1, bound + i) for i in range(500)]
    for r in extra:
        assert heap.offer(r) or r.key > heap.cursor
    assert 0.85 * bound <= len(heap) <= bound
    kept = {e[3] for e in heap.pop_due(10 * bound, bound)}
    assert heap.evicted > 0
    for r in refs + extra:
        assert (r.task_id in kept) == (r.key <= heap.cursor)


async def _model_run(seed: int, catchup_on: bool) -> int:
    """One random run against a model store (see the test below); how many loads found the
    horizon split."""
    import random as rnd

    from scheduler.engine.delayed.horizon import Catchup, Horizon

    r = rnd.Random(seed)
    bound = r.choice([10, 16, 40])
    catchup = Catchup(0.5, lag_ms=20) if catchup_on else None
    horizon = Horizon(HorizonHeap(max_tasks=bound), page=8, catchup=catchup)
    pending: dict[str, TaskRef] = {}
    claimed: list[str] = []
    splits = now = seq = 0

    async def fetch(after: tuple[int, int, int], until: int, limit: int) -> list[TaskRef]:
        if pending and r.random() < 0.3:  # meanwhile a put-back overfills it: a trim
            horizon.put_back(r.sample(list(pending.values()), min(len(pending), bound)))
        keys = sorted(
            (t.key, t.task_id) for t in pending.values() if after < t.key <= (until, 99, 0)
        )
        return [pending[i] for _, i in keys[:limit]]

    def claim(until: int, limit: int, backlog_limit: int | None = None) -> list[TaskRef]:
        out = []
        for due, priority, s, task_id in horizon.take_due(until, limit, backlog_limit):
            task = pending.get(task_id)
            if task is None or task.key != (due, priority, s):
                continue  # claimed already, or a stale entry: the claim skips it
            assert task.due_ms <= until
            out.append(pending.pop(task_id))
            claimed.append(task_id)
        return out

    for _ in range(150):
        op = r.random()
        if op < 0.3:
            now += r.randrange(0, 30)
            await horizon.load(fetch, now + 100, now)
            splits += horizon.backlog is not None
        elif op < 0.65:
            seq += 1
            t = TaskRef(f"t{seq}", now + r.randrange(-200, 150), r.randrange(1, 11), seq)
            pending[t.task_id] = t
            await horizon.offer_all([t])
        elif op < 0.9:
            claim(now + 5, r.randrange(1, 12), r.choice([None, 0, 3]))
        else:
            taken = claim(now + 5, r.randrange(1, 6))
            for t in taken:  # the claim failed: pending again, back on the heap
                pending[t.task_id] = t
                claimed.remove(t.task_id)
            horizon.put_back(taken)
        assert len(horizon) <= bound
    for _ in range(2_000):
        if not pending:
            break
        now += 50
        await horizon.load(fetch, now + 100, now)
        claim(now + 5, bound)
    assert not pending, seed
    assert sorted(claimed) == sorted(f"t{i}" for i in range(1, seq + 1)), seed
    return splits


@pytest.mark.parametrize("catchup_on", [False, True])
async def test_the_horizon_never_loses_or_doubles_against_a_model_store(catchup_on: bool) -> None:
    """With catch-up off, and on (`Catchup`): random loads as time moves on, offers at any
    key, claims (pops; a popped task is claimed if still pending) and failed claims put back,
    trims while a page is read, with small bounds, so the horizon trims, and splits a backlog
    off and joins it again, many times. Every claim takes a pending task that is due, the
    bounds hold, and once time has moved past every due time and all is loaded, each task was
    claimed exactly once."""
    splits = [await _model_run(seed, catchup_on) for seed in range(60)]
    assert (sum(splits) > 100) == catchup_on, splits  # split and joined, when on


async def test_claims_wake_the_loader_only_after_a_load_found_no_room() -> None:
    """With room to spare, a claim does not wake the loader (it polls each second, and a
    load per claim step read an empty page forty times a second); once a load found too
    little room for a page, the claim that makes room wakes it, once."""
    from scheduler.engine.delayed.horizon import Horizon

    horizon = Horizon(HorizonHeap(max_tasks=40), page=8)
    stored = [ref(f"t{i}", 100 + i) for i in range(60)]

    async def fetch(after: tuple[int, int, int], until: int, limit: int) -> list[TaskRef]:
        return [t for t in stored if after < t.key <= (until, 99, 0)][:limit]

    assert await horizon.load(fetch, 110, 0) == (8, True)  # a full page: more to read
    horizon.take_due(105, 2)
    assert not horizon.hungry.is_set()  # room to spare: the loader's poll suffices

    while (await horizon.load(fetch, 200, 0))[1]:
        pass  # pages until the heap has no room for another
    assert len(horizon) > 40 - 8
    horizon.take_due(105, 1)  # not yet a page's room
    assert not horizon.hungry.is_set()
    horizon.take_due(120, 8)
    assert horizon.hungry.is_set()  # the room the last load lacked: wake it
    horizon.hungry.clear()
    horizon.take_due(125, 2)
    assert not horizon.hungry.is_set()  # once, until a load finds no room again


async def test_a_trim_wakes_the_loader_once_the_claimer_made_room() -> None:
    """Offers that overfill the heap trim its tail and move the cursor back: the loader must
    read the tail again, so the claim that makes a page's room wakes it (its page had room
    when it last read: only the trim says so)."""
    from scheduler.engine.delayed.horizon import Horizon

    horizon = Horizon(HorizonHeap(max_tasks=16), page=4)
    assert await horizon.load(_no_more, 1_000, 0) == (0, False)  # all loaded up to 1,000
    await horizon.offer_all([ref(f"t{i}", 100 + i) for i in range(20)])  # over the bound
    assert horizon.heap.evicted > 0
    horizon.take_due(101, 1)  # a page's room not yet made: nothing to wake for
    assert not horizon.hungry.is_set()
    horizon.take_due(110, 8)
    assert horizon.hungry.is_set()


async def _no_more(after: tuple[int, int, int], until: int, limit: int) -> list[TaskRef]:
    return []
