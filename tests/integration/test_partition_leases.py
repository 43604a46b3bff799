"""Leases per partition and fair shares (`scheduler.leadership.partitioned`) against a real
nats-server and PostgreSQL, P = 8, lease TTL 3 s (docs/decisions/2026-12-06-partition-ownership.md,
steps 3 and 4)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any, cast

import asyncpg
import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from scheduler.aio import first_of
from scheduler.bus.nats.connection import ensure_bucket
from scheduler.clock import SystemClock
from scheduler.errors import FencedError
from scheduler.leadership import partitioned
from scheduler.leadership.partitioned import PartitionedLeadership, lease_key
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.postgres.epoch import fenced
from tests.support.partitioned import partitioned_pool_fixture

P = 8
ALL = frozenset(range(P))
MARK = (
    "w AS (UPDATE partition_offices o SET instance = $2 FROM lead "
    "WHERE o.partition = lead.partition RETURNING 1)"
)


class Engines:
    """`PartitionedLeadership`s, each on its own NATS connection with its heartbeat, sharing
    one database; `kill` stops one's renewals and heartbeat without giving anything back."""

    def __init__(self, settings: Settings, pool: asyncpg.Pool) -> None:
        self.settings = settings.with_overrides(partitions=P)
        self.pool = pool
        self.stops: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.conns: list[Client] = []
        self.kv: KeyValue | None = None
        self.kvs: dict[str, KeyValue] = {}  # each engine's own handle on the bucket
        self.changes: dict[str, list[list[int]]] = {}  # each engine's terms, in order

    async def start(self, instance: str, **options: Any) -> PartitionedLeadership:
        nc = await nats.connect(self.settings.nats_servers)
        self.conns.append(nc)
        js = nc.jetstream()
        await ensure_bucket(js, self.settings.leader_bucket, self.settings.lease_ttl)
        await ensure_bucket(js, self.settings.state_bucket, None)
        kv = await js.key_value(self.settings.leader_bucket)
        self.kv = self.kv or kv
        self.kvs[instance] = kv
        state = await js.key_value(self.settings.state_bucket)
        settings = self.settings.with_overrides(instance_id=instance)
        terms = self.changes[instance] = []
        lead = PartitionedLeadership(
            kv,
            self.pool,
            settings,
            SystemClock(),
            Metrics(),
            state,
            on_term=lambda partitions: terms.append(list(partitions)),
            **options,
        )
        stop = self.stops[instance] = asyncio.Event()
        self.tasks[instance] = [
            asyncio.create_task(lead.run(stop), name=instance),
            asyncio.create_task(lead.heartbeat(state, stop), name=f"{instance}-beat"),
        ]
        return lead

    def kill(self, instance: str) -> None:
        """As a SIGKILL would: no renewal, no heartbeat, no key given back."""
        for task in self.tasks.pop(instance):
            task.cancel()

    async def kill_leases_first(self, instance: str, beat_for: float) -> None:
        """A death in two steps: its leadership loop stops (no renewal, no key given back; its
        term ends), and its heartbeat `beat_for` s later."""
        run, beat = self.tasks.pop(instance)
        run.cancel()
        await asyncio.sleep(beat_for)
        beat.cancel()

    async def resign(self, instance: str, lead: PartitionedLeadership) -> None:
        """As the daemon leaves on SIGTERM: `resign`, then its loops stop."""
        await lead.resign()
        self.stops[instance].set()

    async def close(self) -> None:
        for stop in self.stops.values():
            stop.set()
        tasks = [t for ts in self.tasks.values() for t in ts]
        async with asyncio.timeout(5):
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for nc in self.conns:
            await nc.close()
        assert [r for r in results if r is not None] == []


pool = partitioned_pool_fixture(P)


@pytest.fixture
async def engines(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Engines]:
    engines = Engines(settings, pool)
    yield engines
    await engines.close()


async def until(check: Callable[[], bool], within: float = 5.0) -> float:
    """Seconds until `check()` holds (polled every 10 ms); fails after `within`."""
    t0 = time.monotonic()
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return time.monotonic() - t0


def terms(*leads: PartitionedLeadership) -> list[frozenset[int]]:
    return [lead.term if lead.may_act() else frozenset() for lead in leads]


def shared_fairly(*leads: PartitionedLeadership) -> bool:
    """Every partition in exactly one term, each term within one of the others' size."""
    held = terms(*leads)
    sizes = [len(t) for t in held]
    union = frozenset().union(*held)
    return union == ALL and sum(sizes) == P and max(sizes) - min(sizes) <= 1


async def offices(pool: asyncpg.Pool) -> dict[int, tuple[int, str | None]]:
    rows = await pool.fetch("SELECT partition, epoch, instance FROM partition_offices")
    return {r["partition"]: (r["epoch"], r["instance"]) for r in rows}


async def test_alone_an_engine_holds_every_partition_in_one_term_with_a_key_each(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """Alone, an engine takes all P partitions in one term: a key `p.<n>` each, naming it and
    the term's epoch once renewed, and every partition's office row at that epoch."""
    a = await engines.start("a")
    epoch = await asyncio.wait_for(a.wait_for_office(), 5)
    assert a.term == ALL and all(a.may_act(p) for p in ALL)
    assert await offices(pool) == {p: (epoch, "a") for p in ALL}
    assert engines.kv is not None
    await asyncio.sleep(a.renew_every + 0.2)  # one renew pass writes the epoch into each key
    for p in ALL:
        doc = json.loads((await engines.kv.get(lease_key(p))).value or b"{}")
        assert (doc["instance"], doc["epoch"]) == ("a", epoch)


async def test_a_lost_key_fences_only_its_partition_and_the_next_term_leaves_it_out(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """When another writer takes partition 3's key, the engine's next renew pass drops it
    alone (`may_act(3)` false, the others true) and a new term over the other seven takes
    office above the old epoch; the old term's late write is fenced there."""
    a = await engines.start("a")
    old = await asyncio.wait_for(a.wait_for_office(), 5)
    assert engines.kv is not None
    await asyncio.sleep(0.2)  # (after the renew pass that writes the term's epoch at once)
    entry = await engines.kv.get(lease_key(3))
    assert entry.revision is not None
    await engines.kv.update(lease_key(3), b'{"instance": "thief"}', last=entry.revision)
    # at the next renew pass, not at the key's deadline (TTL - margin after its last renew)
    await until(lambda: a.may_act() and a.term == ALL - {3}, within=a.renew_every + 0.6)
    assert not a.may_act(3) and all(a.may_act(p) for p in ALL - {3})
    new = a.epoch
    assert new is not None and new > old
    async with pool.acquire() as proxy:
        conn = cast(asyncpg.Connection, proxy)
        with pytest.raises(FencedError):
            await fenced(conn, old, MARK, "old term", partitions=[0])
        await fenced(conn, new, MARK, "new term", partitions=[0])
    assert (await offices(pool))[3] == (old, "a")  # nobody took office over it since


async def test_a_joining_engine_gets_its_fair_share_from_the_surplus_given_back(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """A second engine joining one that holds all eight partitions ends up with four: the
    first gives back its surplus (keys deleted, a new term over the rest), the second takes
    them; no partition is in both terms, and each office row names its holder."""
    a = await engines.start("a")
    await asyncio.wait_for(a.wait_for_office(), 5)
    b = await engines.start("b")
    await until(lambda: shared_fairly(a, b), within=6)
    assert a.term.isdisjoint(b.term)
    rows = await offices(pool)
    assert all(rows[p] == (a.epoch, "a") for p in a.term)
    assert all(rows[p] == (b.epoch, "b") for p in b.term)


async def test_a_dead_engines_partitions_are_taken_within_ttl_and_a_campaign(
    engines: Engines, settings: Settings
) -> None:
    """After one of two engines stops renewing (killed), the other holds all eight partitions
    within TTL + one campaign interval + the server's expiry slack of its last renewal, and
    its own partitions may act throughout."""
    a = await engines.start("a")
    await asyncio.wait_for(a.wait_for_office(), 5)
    b = await engines.start("b")
    await until(lambda: shared_fairly(a, b), within=6)
    mine = b.term
    engines.kill("a")
    killed = time.monotonic()
    stalled = False

    def b_has_all() -> bool:
        nonlocal stalled
        stalled = stalled or not all(b.may_act(p) for p in mine)
        return b.may_act() and b.term == ALL

    took = await until(b_has_all, within=8)
    bound = settings.lease_ttl + settings.campaign_interval.total_seconds() + 1.0
    assert took <= bound, f"took {took:.2f} s after the kill, bound {bound:.2f} s"
    assert not stalled, "the surviving engine stopped acting on its own partitions"
    assert time.monotonic() - killed >= settings.lease_ttl - 1.5  # not before A's keys expired


async def test_a_slow_wind_down_keeps_the_partitions_it_does_not_give_back(
    engines: Engines, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """While an engine waits for its term to wind down before giving partitions to a joining
    engine (here a term that never says it ended: publishes waiting out their timeout), it
    keeps renewing its keys: no key lapses, it keeps the four it does not give back (the
    lowest), and the joiner holds the others at once, not after they expired."""
    monkeypatch.setattr(partitioned, "HANDOVER_GRACE", 4.0)  # beyond a key's TTL - margin
    a = await engines.start("a")
    epoch = await asyncio.wait_for(a.wait_for_office(), 5)
    assert a.partitions_of(epoch) == ALL  # an engine runs the term, and never ends it
    b = await engines.start("b")
    took = await until(lambda: shared_fairly(a, b), within=10)
    assert a.term == frozenset(range(P // 2))
    assert "leader.partition_lost" not in caplog.text
    assert took < partitioned.HANDOVER_GRACE + 1.5


async def present(kv: KeyValue, key: str) -> bool:
    try:
        await kv.get(key)
    except KeyNotFoundError:
        return False
    return True


async def test_resign_gives_back_a_key_whose_renewal_is_in_flight(
    engines: Engines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resigning (SIGTERM) while a renew pass is stored at the server but not yet answered
    still deletes every key: none is left to expire and stall its partition for a TTL."""
    a = await engines.start("a")
    await asyncio.wait_for(a.wait_for_office(), 5)
    kv = engines.kvs["a"]
    real = kv.update
    stored = asyncio.Event()

    async def answered_late(key: str, value: bytes, last: int | None = None) -> int:
        revision = await real(key, value, last=last)  # stored at the server...
        stored.set()
        await asyncio.sleep(0.3)  # ...its answer still on the way
        return revision

    monkeypatch.setattr(kv, "update", answered_late)
    await asyncio.wait_for(stored.wait(), a.renew_every + 1)
    await a.resign()
    await asyncio.sleep(0.5)  # the renewals' answers arrive
    left = [p for p in ALL if await present(kv, lease_key(p))]
    assert left == [], f"keys left to expire after resign: {left}"


async def test_a_term_writes_its_epoch_into_its_keys_at_once(engines: Engines) -> None:
    """Once a term takes office its keys carry its epoch within a few hundred milliseconds
    (a renew pass right after the take), not only at the next renew pass a second later: the
    partition map shows a partition in office as soon as it is."""
    a = await engines.start("a")
    epoch = await asyncio.wait_for(a.wait_for_office(), 5)
    assert engines.kv is not None
    kv = engines.kv

    async def epochs() -> set[Any]:
        docs = [json.loads((await kv.get(lease_key(p))).value or b"{}") for p in ALL]
        return {d.get("epoch") for d in docs}

    t0 = time.monotonic()
    async with asyncio.timeout(3):
        while await epochs() != {epoch}:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    took = time.monotonic() - t0
    assert took < 0.3, f"the term's epoch reached its keys {took:.2f} s after it took office"


async def test_renewals_go_on_while_the_rebalancing_waits(
    engines: Engines, caplog: pytest.LogCaptureFixture
) -> None:
    """While the rebalancing waits on something slow (here the count of live engines, 2.6 s,
    beyond a key's TTL - margin of 2.4 s: a read of the state bucket on a loaded host), the
    keys are renewed on time: none lapses and the term holds throughout."""
    calls = 0

    async def slow_live() -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            await asyncio.sleep(2.6)
        return 1

    a = await engines.start("a", live=slow_live)
    await asyncio.wait_for(a.wait_for_office(), 5)
    lapsed = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.5:
        lapsed = lapsed or not (a.may_act() and a.term == ALL)
        await asyncio.sleep(0.02)
    assert calls >= 2
    assert not lapsed, "the term lost office while the rebalancing waited"
    assert "leader.partition_lost" not in caplog.text


async def test_a_dead_engine_leaves_the_count_before_its_keys_lapse_one_term_change_each(
    engines: Engines, settings: Settings
) -> None:
    """Of three engines, one stops renewing just before its renew pass is due, while its
    heartbeat task lives on a little (it even beats once more, as its term ends): the others
    stop counting it by its keys' self-fence deadline, before the keys expire, so each takes
    its new share (four) in one term change, not one partition at the old share (three) and
    the rest at the next, each change a stall of every partition it holds."""
    leads = {n: await engines.start(n) for n in "abc"}
    await until(lambda: shared_fairly(*leads.values()), within=8)
    victim = next(n for n, lead in leads.items() if len(lead.term) == 3)
    survivors = {n: lead for n, lead in leads.items() if n != victim}
    dead = leads[victim]
    async with asyncio.timeout(3):  # its renew pass about due: its keys renewed ~1 s ago
        while not 0.02 < dead._next_renew - time.monotonic() < 0.12:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    before = {n: len(engines.changes[n]) for n in survivors}
    await engines.kill_leases_first(victim, beat_for=0.5)
    took = await until(lambda: frozenset().union(*terms(*survivors.values())) == ALL, within=8)
    await asyncio.sleep(1.0)  # (a late second change would show here)
    changes = {n: engines.changes[n][before[n] :] for n in survivors}
    assert {n: len(c) for n, c in changes.items()} == {n: 1 for n in survivors}, changes
    assert sorted(len(lead.term) for lead in survivors.values()) == [4, 4]
    assert took <= settings.lease_ttl + settings.campaign_interval.total_seconds() + 1.0


async def test_a_resigning_engines_partitions_are_taken_at_once_in_one_term(
    engines: Engines,
) -> None:
    """When one of two engines resigns (SIGTERM), the other holds all eight partitions within
    a few hundred milliseconds, in one term change: it watches the keys and campaigns when
    they are deleted, not at its next pass (here up to 2 s away), and the resigning engine's
    heartbeat is gone before its keys are, so the other takes all of them at once."""
    engines.settings = engines.settings.with_overrides(campaign_interval=timedelta(seconds=2))
    a = await engines.start("a")
    b = await engines.start("b")
    await until(lambda: shared_fairly(a, b), within=8)
    async with asyncio.timeout(3):  # just after a's renew pass: its next wake is ~1 s away
        while a._next_renew - time.monotonic() < 0.85:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    before = len(engines.changes["a"])
    t0 = time.monotonic()
    await engines.resign("b", b)
    await until(lambda: a.may_act() and a.term == ALL, within=5)
    took = time.monotonic() - t0
    assert took < 0.5, f"the resigned engine's partitions were taken {took:.2f} s after"
    await asyncio.sleep(0.6)
    assert len(engines.changes["a"]) - before == 1, engines.changes["a"][before:]


async def test_engines_give_back_their_surplus_as_soon_as_an_engine_joins(
    engines: Engines,
) -> None:
    """With passes 10 s apart, a third engine joining two that hold four partitions each has
    its share within a second: its first heartbeat wakes the other two (they watch the
    heartbeats), which give back their surplus at once instead of at their next pass, and it
    takes what both gave back in one term, not piece by piece."""
    engines.settings = engines.settings.with_overrides(campaign_interval=timedelta(seconds=10))
    a = await engines.start("a")
    b = await engines.start("b")
    await until(lambda: shared_fairly(a, b), within=5)
    before = {n: len(engines.changes[n]) for n in "ab"}
    t0 = time.monotonic()
    c = await engines.start("c")
    await until(lambda: shared_fairly(a, b, c), within=5)
    took = time.monotonic() - t0
    assert took < 1.0, f"the joiner had its share {took:.2f} s after it started"
    await asyncio.sleep(0.5)  # (a second term of the joiner's would show here)
    assert engines.changes["c"] == [sorted(c.term)]
    assert {n: len(engines.changes[n]) - before[n] for n in "ab"} == {"a": 1, "b": 1}


async def stand_in(lead: PartitionedLeadership, stop: asyncio.Event, grows: bool) -> None:
    """The engine's side of `engine.office.Shares`, without firing: each term runs until it is
    handed over or lost, answering each growth it is handed with `grows`."""
    while not stop.is_set():
        waiting = asyncio.ensure_future(lead.wait_for_office())
        await first_of(waiting, stop.wait())
        if not waiting.done() or waiting.cancelled():
            return
        epoch = waiting.result()
        if lead.partitions_of(epoch) is None:
            continue
        while lead.tenure.recorded()[0] == epoch and not lead.handover.is_set():
            growth = asyncio.ensure_future(lead.resized(epoch))
            await first_of(growth, lead.handover.wait(), lead.lost.wait(), stop.wait())
            if not growth.done() or growth.cancelled():
                break
            lead.resize_applied(epoch, grows)
            if not grows:
                await first_of(lead.handover.wait(), lead.lost.wait(), stop.wait())
                break
        lead.term_ended(epoch)


async def with_stand_ins(
    engines: Engines, names: str, grows: bool
) -> dict[str, PartitionedLeadership]:
    leads = {}
    for n in names:
        leads[n] = lead = await engines.start(n)
        engines.tasks[n].append(asyncio.create_task(stand_in(lead, engines.stops[n], grows)))
    return leads


async def test_survivors_take_a_dead_engines_partitions_into_their_running_terms(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """Of three engines whose engine side waits to grow, one dies: each survivor takes its
    share of the dead one's partitions into its running term (same epoch, the gained
    partitions' offices at that epoch and this instance), not a new term."""
    leads = await with_stand_ins(engines, "abc", grows=True)
    await until(lambda: shared_fairly(*leads.values()), within=8)
    victim = next(n for n, lead in leads.items() if len(lead.term) == 3)
    survivors = {n: lead for n, lead in leads.items() if n != victim}
    epochs = {n: lead.epoch for n, lead in survivors.items()}
    kept = {n: lead.term for n, lead in survivors.items()}
    engines.kill(victim)
    await until(lambda: frozenset().union(*terms(*survivors.values())) == ALL, within=8)
    assert {n: lead.epoch for n, lead in survivors.items()} == epochs
    assert all(lead.term > kept[n] for n, lead in survivors.items())
    found = await offices(pool)
    for n, lead in survivors.items():
        assert {p: found[p] for p in lead.term} == {p: (epochs[n], n) for p in lead.term}


async def test_a_growth_the_engine_cannot_apply_falls_back_to_a_new_term(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """When the engine side answers that it could not grow, the office hands the term over and
    takes office over the grown set with a new epoch (above every one issued), so nothing is
    left half grown."""
    leads = await with_stand_ins(engines, "ab", grows=False)
    await until(lambda: shared_fairly(*leads.values()), within=8)
    a = leads["a"]
    old = a.epoch
    assert old is not None
    engines.kill("b")
    # (grown for as long as the engine side takes to answer, then handed over)
    await until(lambda: a.may_act() and a.term == ALL and a.epoch != old, within=8)
    assert a.epoch is not None and a.epoch > old
    assert ALL in [frozenset(t) for t in engines.changes["a"]]  # the growth was tried first
    assert {e for e, _ in (await offices(pool)).values()} == {a.epoch}


async def test_a_term_gives_its_surplus_back_in_place_to_an_engine_that_joins(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """Two engines whose engine side waits to resize hold four partitions each; a third
    joins. Each of the two gives its surplus back without ending its term (same epoch, its
    kept partitions' offices unchanged, never out of office), narrowing its stores' office
    before the keys go; the joiner takes them at a number above both."""
    leads = await with_stand_ins(engines, "ab", grows=True)
    await until(lambda: shared_fairly(*leads.values()), within=8)
    epochs = {n: lead.epoch for n, lead in leads.items()}
    before = {n: lead.term for n, lead in leads.items()}
    out_of_office = False

    def watch() -> bool:
        nonlocal out_of_office
        out_of_office = out_of_office or not all(lead.may_act() for lead in leads.values())
        return False

    c = await engines.start("c")
    engines.tasks["c"].append(asyncio.create_task(stand_in(c, engines.stops["c"], True)))
    await until(lambda: watch() or shared_fairly(*leads.values(), c), within=6)
    assert {n: lead.epoch for n, lead in leads.items()} == epochs, "no new term"
    assert not out_of_office, "a term that shrank was out of office meanwhile"
    assert all(lead.term < before[n] for n, lead in leads.items())
    assert all(engines.changes[n][-1] == sorted(lead.term) for n, lead in leads.items())
    found = await offices(pool)
    for n, lead in leads.items():
        assert {p: found[p] for p in lead.term} == {p: (epochs[n], n) for p in lead.term}
    assert c.epoch is not None and all(c.epoch > e for e in epochs.values() if e is not None)
    assert {p: found[p] for p in c.term} == {p: (c.epoch, "c") for p in c.term}


async def test_a_term_takes_back_in_place_what_it_gave_away(
    engines: Engines, pool: asyncpg.Pool
) -> None:
    """One engine gives partitions back in place to a second that joined, which then dies:
    the first takes them back into the same term (the taker's take moved their epochs, so
    `grow_office` finds nothing of them at the term's number), never out of office."""
    leads = await with_stand_ins(engines, "a", grows=True)
    a = leads["a"]
    await until(lambda: a.may_act() and a.term == ALL, within=5)
    first = a.epoch
    b = await engines.start("b")
    engines.tasks["b"].append(asyncio.create_task(stand_in(b, engines.stops["b"], True)))
    await until(lambda: shared_fairly(a, b), within=6)
    assert a.epoch == first, "the give-back kept the term"
    engines.kill("b")
    await until(lambda: a.may_act() and a.term == ALL, within=8)
    assert a.epoch == first, "taken back into the same term"
    assert await offices(pool) == {p: (first, "a") for p in ALL}
