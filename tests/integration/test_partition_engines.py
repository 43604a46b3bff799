"""Firing partitioned across engines: daemons in this process over P = 8 on one NATS and one
database (lease TTL 3 s, horizon 2 s so the owner's loader, not intake, puts each task on its
heap): each fires only its own partitions, and nothing is lost or doubled through a kill and
a join (docs/decisions/2026-12-06-partition-ownership.md, steps 3 and 4)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from scheduler.daemon.lifecycle import Daemon
from scheduler.leadership.partitioned import PartitionedLeadership
from scheduler.partitions import partition_of
from scheduler.settings import Settings
from tests.integration.test_delayed import envelope
from tests.support.helpers import DaemonRunner
from tests.support.partitioned import partitioned_pool_fixture

P = 8
ALL = frozenset(range(P))
STREAM, LANE = "PT", "mq.delay.pt.work"


pool = partitioned_pool_fixture(P)


@pytest.fixture
async def runners(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[list[DaemonRunner]]:
    base = settings.with_overrides(partitions=P, horizon=timedelta(seconds=2))
    runners = [DaemonRunner(base.with_overrides(instance_id=f"pt-{n}")) for n in "abc"]
    yield runners
    await asyncio.gather(*(r.stop() for r in runners))


@pytest.fixture
async def nc(settings: Settings) -> AsyncIterator[Client]:
    nc = await nats.connect(settings.nats_servers)
    await nc.jetstream().add_stream(
        StreamConfig(name=STREAM, subjects=["mq.pt.>"], duplicate_window=120)
    )
    yield nc
    await nc.close()


def lead(d: Daemon) -> PartitionedLeadership:
    assert isinstance(d.leadership, PartitionedLeadership)
    return d.leadership


def term(d: Daemon) -> frozenset[int]:
    return lead(d).term if lead(d).may_act() else frozenset()


async def fair(*daemons: Daemon, within: float = 8.0) -> None:
    """Until every partition is in exactly one daemon's term, shares within one of each other."""
    async with asyncio.timeout(within):
        while True:
            terms = [term(d) for d in daemons]
            sizes = [len(t) for t in terms]
            if frozenset().union(*terms) == ALL and sum(sizes) == P:
                if max(sizes) - min(sizes) <= 1:
                    return
            await asyncio.sleep(0.02)


async def publish(nc: Client, dues: list[datetime]) -> dict[str, datetime]:
    """One task per due time on the lane; their ids and due times."""
    js, out = nc.jetstream(), {}
    for due in dues:
        doc = envelope(due)
        out[doc["id"]] = datetime.fromisoformat(doc["delay_until"])
        await js.publish(LANE, json.dumps(doc).encode())
    return out


async def delivered(nc: Client, count: int, within: float) -> list[Any]:
    """The target stream's messages once it holds `count` (and a quiet 0.5 s after)."""
    js = nc.jetstream()
    async with asyncio.timeout(within):
        while (await js.stream_info(STREAM)).state.messages < count:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    psub = await js.pull_subscribe(
        ">", durable=None, stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    out: list[Any] = []
    try:
        while True:
            try:
                out += await psub.fetch(500, timeout=1.0)
            except TimeoutError:
                return out
    finally:
        await psub.unsubscribe()


async def fired_by(pool: asyncpg.Pool) -> dict[str, list[str]]:
    """Each delayed task's fire_log rows: the instances that published it."""
    rows = await pool.fetch("SELECT key, instance FROM fire_log WHERE kind = 'delayed'")
    out: dict[str, list[str]] = {}
    for r in rows:
        out.setdefault(r["key"], []).append(r["instance"])
    return out


def lateness(msgs: list[Any], due: dict[str, datetime]) -> dict[str, float]:
    """Seconds from each task's due time to its storing in the target stream."""
    return {
        (i := m.headers["Nats-Msg-Id"]): (m.metadata.timestamp - due[i]).total_seconds()
        for m in msgs
    }


async def test_three_engines_each_fire_only_their_own_partitions(
    runners: list[DaemonRunner], nc: Client, pool: asyncpg.Pool
) -> None:
    """Three engines share the eight partitions (3, 3, 2); 120 tasks taken in on any engine,
    some due within the horizon (so intake, not the loader, meets them first), are each
    delivered once, by the engine holding its partition, none early; no term is fenced on
    the way (an engine never claims another's task), so every epoch stays as it was."""
    daemons = [await r.start() for r in runners]
    await fair(*daemons)
    owner = {p: d.settings.instance_id for d in daemons for p in term(d)}
    epochs = [lead(d).epoch for d in daemons]
    now = datetime.now(UTC)
    soon = [now + timedelta(milliseconds=300 + 25 * i) for i in range(40)]
    later = [now + timedelta(seconds=3, milliseconds=25 * i) for i in range(80)]
    due = await publish(nc, soon + later)
    msgs = await delivered(nc, len(due), within=15)
    assert [lead(d).epoch for d in daemons] == epochs
    assert Counter(m.headers["Nats-Msg-Id"] for m in msgs) == Counter(list(due))
    assert min(lateness(msgs, due).values()) >= -0.001
    assert {owner[p] for p in ALL} == {d.settings.instance_id for d in daemons}
    fired = await fired_by(pool)
    assert {i: by for i, by in fired.items() if i in due} == {
        i: [owner[partition_of(i, P)]] for i in due
    }


async def test_a_killed_engine_stalls_only_its_partitions_and_nothing_is_lost_or_doubled(
    runners: list[DaemonRunner], nc: Client, settings: Settings
) -> None:
    """Of two engines, one stops renewing and beating (a frozen process): tasks of the other's
    partitions keep firing (under a second late, never the TTL), the frozen one's are fired by
    the survivor once its leases expired (within TTL + campaign + 1.5 s of their due time),
    each exactly once."""
    a, b = [await r.start() for r in runners[:2]]
    await fair(a, b)
    mine = term(b)
    now = datetime.now(UTC)
    due = await publish(nc, [now + timedelta(seconds=2.5, milliseconds=50 * i) for i in range(120)])
    freeze(a)
    msgs = await delivered(nc, len(due), within=20)
    assert Counter(m.headers["Nats-Msg-Id"] for m in msgs) == Counter(list(due))
    late = lateness(msgs, due)
    assert min(late.values()) >= -0.001
    survivor = max(v for i, v in late.items() if partition_of(i, P) in mine)
    orphan = max(v for i, v in late.items() if partition_of(i, P) not in mine)
    bound = settings.lease_ttl + settings.campaign_interval.total_seconds() + 1.5
    assert survivor < 1.0, f"the survivor's own tasks were up to {survivor:.2f} s late"
    assert orphan < bound, f"the frozen engine's tasks were up to {orphan:.2f} s late"
    assert term(b) == ALL
    print(f"\n  survivor's tasks late <= {survivor * 1000:.0f} ms, orphans <= {orphan:.2f} s")


def freeze(d: Daemon) -> None:
    """Stop a daemon's renewals, campaigns and heartbeats, as SIGSTOP would (its engine loops
    go on, and self-fence at the deadline); `resign` (at stop) still ends the freeze."""
    leader = lead(d)

    async def frozen() -> None:
        while not leader.resigned:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def no_beat(*args: Any, **kwargs: Any) -> int:
        raise ConnectionError("frozen")

    leader.step = frozen  # type: ignore[method-assign]
    leader.renew_pass = frozen  # type: ignore[method-assign]
    d.core.state_kv.put = no_beat


async def test_a_joining_engine_takes_its_share_and_nothing_is_lost_or_doubled(
    runners: list[DaemonRunner], nc: Client, pool: asyncpg.Pool
) -> None:
    """While tasks fall due, a third engine joins two: the two hand their surplus over
    gracefully (no task published twice: one fire_log row each) and every task is delivered
    exactly once, none early."""
    a, b = [await r.start() for r in runners[:2]]
    await fair(a, b)
    now = datetime.now(UTC)
    due = await publish(nc, [now + timedelta(seconds=1, milliseconds=40 * i) for i in range(150)])
    await asyncio.sleep(1.5)
    t0 = time.monotonic()
    c = await runners[2].start()
    await fair(a, b, c)
    took = time.monotonic() - t0
    msgs = await delivered(nc, len(due), within=20)
    assert Counter(m.headers["Nats-Msg-Id"] for m in msgs) == Counter(list(due))
    assert min(lateness(msgs, due).values()) >= -0.001
    fired = await fired_by(pool)
    assert {i: len(fired.get(i, [])) for i in due} == {i: 1 for i in due}
    assert term(c), "the joining engine holds nothing"
    print(f"\n  join to fair shares: {took:.2f} s")


async def test_each_cron_job_fires_once_an_occurrence_on_the_engine_of_its_partition(
    runners: list[DaemonRunner], nc: Client, pool: asyncpg.Pool, settings: Settings
) -> None:
    """Eight jobs firing every second over two engines: each occurrence is logged once, by
    the engine holding the job's partition, and no term is fenced on the way."""
    names = [f"tick-{n}" for n in range(8)]
    jobs = "".join(
        f"  - name: {n}\n    subject: mq.pt.cron.{n}\n    cron: '* * * * * *'\n    data: {{}}\n"
        for n in names
    )
    (settings.schedules_dir / "jobs.yaml").write_text("scheduled_jobs:\n" + jobs)
    a, b = [await r.start() for r in runners[:2]]
    await fair(a, b)
    owner = {p: d.settings.instance_id for d in (a, b) for p in term(d)}
    epochs = [lead(d).epoch for d in (a, b)]
    await asyncio.sleep(3.2)
    rows = await pool.fetch(
        "SELECT key, scheduled_for, instance FROM fire_log WHERE kind = 'cron' AND epoch = ANY($1)",
        epochs,
    )
    assert [lead(d).epoch for d in (a, b)] == epochs
    per = Counter((r["key"], r["scheduled_for"]) for r in rows)
    assert per and max(per.values()) == 1
    assert {r["key"] for r in rows} == set(names)
    assert all(r["instance"] == owner[partition_of(r["key"], P)] for r in rows)


async def test_a_task_stored_by_another_engine_reaches_its_owners_loaded_horizon_at_once(
    runners: list[DaemonRunner], nc: Client
) -> None:
    """Tasks due 0.3-0.8 s after they are stored, inside their owners' loaded horizons (the
    loader has read past their due times), taken in by whichever engine pulls them (mostly
    not their owner: the lane's consumer is shared), are each delivered once, under 250 ms
    late: the storing engine's notice puts each on its owner's heap at once (without it such
    a task waited for its owner's sweep, over a second)."""
    daemons = [await r.start() for r in runners]
    await fair(*daemons)
    async with asyncio.timeout(5):  # every owner's loader has read past what is published next
        while any(cursor_ms(d) < time.time() * 1000 + 1_000 for d in daemons):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    now = datetime.now(UTC)
    due = await publish(nc, [now + timedelta(milliseconds=300 + 20 * i) for i in range(24)])
    msgs = await delivered(nc, len(due), within=10)
    assert Counter(m.headers["Nats-Msg-Id"] for m in msgs) == Counter(list(due))
    late = lateness(msgs, due)
    assert min(late.values()) >= -0.001
    worst = max(late.values())
    assert worst < 0.25, f"up to {worst:.3f} s late"
    sent = sum(d.engine.notices.sent for d in daemons if d.engine.notices is not None)
    assert sent > 0, "no task was stored by an engine other than its owner"
    print(f"\n  late <= {worst * 1000:.0f} ms, {sent} notices")


def cursor_ms(d: Daemon) -> int:
    """How far (epoch ms) a daemon's loader has read (its heap's cursor)."""
    return int(d.engine.horizon.heap.cursor[0])


async def test_survivors_grow_their_terms_in_place_and_fire_the_gains_once(
    runners: list[DaemonRunner],
    nc: Client,
    pool: asyncpg.Pool,
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Of three engines, one freezes: each survivor gains a share of its partitions in its
    running term (same epoch, no term ended: `leader.partitions_grown`), keeps firing its own
    partitions on time meanwhile, and every task (due before the gain, within the loaded
    horizon, past it) and every cron occurrence of the gained partitions is fired once."""
    names = [f"grow-{n}" for n in range(16)]
    jobs = "".join(
        f"  - name: {n}\n    subject: mq.ptc.{n}\n    cron: '* * * * * *'\n    data: {{}}\n"
        for n in names
    )
    # the cron messages in a stream of their own: the tasks' stream holds the tasks alone
    await nc.jetstream().add_stream(StreamConfig(name="PTC", subjects=["mq.ptc.>"]))
    (settings.schedules_dir / "jobs.yaml").write_text("scheduled_jobs:\n" + jobs)
    a, b, c = [await r.start() for r in runners]
    await fair(a, b, c)
    kept = {d: term(d) for d in (b, c)}
    epochs = {d: lead(d).epoch for d in (b, c)}
    now = datetime.now(UTC)
    due = await publish(nc, [now + timedelta(seconds=2, milliseconds=50 * i) for i in range(160)])
    with caplog.at_level(logging.INFO):
        freeze(a)
        frozen_at = datetime.now(UTC)
        msgs = await delivered(nc, len(due), within=25)
        await fair(b, c)
    assert {d: lead(d).epoch for d in (b, c)} == epochs, "a survivor began a new term"
    assert all(term(d) > kept[d] for d in (b, c)), "a survivor's term did not grow"
    assert all(f"engine.term_ended epoch={e}" not in caplog.text for e in epochs.values())
    assert "leader.partitions_grown" in caplog.text
    assert Counter(m.headers["Nats-Msg-Id"] for m in msgs) == Counter(list(due))
    late = lateness(msgs, due)
    assert min(late.values()) >= -0.001
    own = max(v for i, v in late.items() if any(partition_of(i, P) in t for t in kept.values()))
    assert own < 0.25, f"a survivor's own tasks were up to {own:.3f} s late"
    fired = await fired_by(pool)
    assert {i: len(fired.get(i, [])) for i in due} == {i: 1 for i in due}
    rows = await pool.fetch("SELECT key, scheduled_for, instance FROM fire_log WHERE kind = 'cron'")
    assert max(Counter((r["key"], r["scheduled_for"]) for r in rows).values()) == 1
    gained = {n for n in names if partition_of(n, P) not in kept[b] | kept[c]}
    after = {r["key"] for r in rows if r["scheduled_for"] > frozen_at + timedelta(seconds=5)}
    assert gained and gained <= after, "a gained cron job did not fire after the gain"
    print(f"\n  survivors' own tasks late <= {own * 1000:.0f} ms")
