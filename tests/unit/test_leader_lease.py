"""The leader lease protocol against an in-memory KV on a fake clock (no NATS, no PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import asyncpg
import nats.errors
import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoStreamResponseError
from nats.js.kv import KeyValue

from scheduler.clock import FakeClock, to_rfc3339
from scheduler.leadership.election import Leadership
from scheduler.leadership.lease import LEASE_KEY, UNANSWERED_AFTER
from scheduler.metrics import Metrics
from scheduler.settings import Settings

TTL = 3.0  # margin max(0.5, TTL/5) = 0.6: the self-fence deadline is 2.4 s after a renew is sent
RENEW = 1.0
CAMPAIGN = 0.5


@dataclass
class Entry:
    key: str
    value: bytes
    revision: int
    operation: str | None = None


class FakeWatcher:
    """Async-iterates entries like nats-py's KeyWatcher; `stop` ends the iteration."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Entry | None] = asyncio.Queue()
        self.stopped = False

    def __aiter__(self) -> FakeWatcher:
        return self

    async def __anext__(self) -> Entry | None:
        if self.stopped:
            raise StopAsyncIteration
        return await self.queue.get()

    async def stop(self) -> None:
        self.stopped = True


class FakeKV:
    """One key space with revisions, revision checks, and expiry `ttl` seconds after each write."""

    def __init__(self, clock: FakeClock, ttl: float = TTL) -> None:
        self.clock, self.ttl = clock, ttl
        self.seq = 0
        self.live: dict[str, tuple[Entry, float]] = {}
        self.watchers: list[FakeWatcher] = []
        self.watchable = True
        self.fail_updates = False
        self.leaderless = 0  # updates answered 503 (no stream leader) this many times
        self.gate: asyncio.Event | None = None  # updates wait for it while it is unset
        self.link_down = False  # updates refused as nats-py refuses a publish on no link
        self.updates = 0  # updates sent (refused ones included)
        # the next this many updates get no answer ever (a node that resumed from a freeze
        # while the bucket changed leaders); stored first when `unanswered_stored`
        self.unanswered = 0
        self.unanswered_stored = False
        self.creates_hang = False  # creates get no answer ever while set

    def current(self, key: str) -> Entry | None:
        if key in self.live and self.clock.monotonic() - self.live[key][1] >= self.ttl:
            del self.live[key]  # max_age removed the message; no marker (pre-2.11 behaviour)
        return self.live[key][0] if key in self.live else None

    def _write(self, key: str, value: bytes, operation: str | None = None) -> int:
        self.seq += 1
        entry = Entry(key, value, self.seq, operation)
        if operation is None:
            self.live[key] = (entry, self.clock.monotonic())
        else:
            self.live.pop(key, None)
        for watcher in self.watchers:
            watcher.queue.put_nowait(entry)
        return self.seq

    def _check(self, key: str, last: int | None) -> None:
        entry = self.current(key)
        if (entry.revision if entry else 0) != (last or 0):
            raise KeyWrongLastSequenceError(description="wrong last sequence")

    async def create(self, key: str, value: bytes) -> int:
        if self.creates_hang:
            await asyncio.Event().wait()  # sent to a bucket leader that froze: no answer
        self._check(key, 0)
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self.updates += 1
        if self.link_down:
            raise nats.errors.OutboundBufferLimitError
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_updates:
            raise nats.errors.TimeoutError
        if self.leaderless:
            self.leaderless -= 1
            raise NoStreamResponseError
        if self.unanswered:
            self.unanswered -= 1
            if self.unanswered_stored:
                self._check(key, last)
                self._write(key, value)
            await asyncio.Event().wait()  # the answer never comes
        self._check(key, last)
        return self._write(key, value)

    async def put(self, key: str, value: bytes) -> int:
        return self._write(key, value)

    async def delete(self, key: str, last: int | None = None) -> bool:
        if last:
            self._check(key, last)
        self._write(key, b"", "DEL")
        return True

    async def get(self, key: str) -> Entry:
        entry = self.current(key)
        if entry is None:
            raise KeyNotFoundError
        return entry

    async def watch(self, key: str) -> FakeWatcher:
        if not self.watchable:
            raise nats.errors.NoRespondersError
        watcher = FakeWatcher()
        self.watchers.append(watcher)
        return watcher


class Epochs:
    """Stands in for `take_office`: counts epochs up from the greater of its own and the floor
    (as PostgreSQL's `greatest(epoch, floor) + 1`), or fails like an unreachable database."""

    def __init__(self) -> None:
        self.epoch = 0
        self.fail = False
        self.counts: list[int | None] = []  # the partition count each take named

    async def __call__(
        self, pool: asyncpg.Pool, instance: str, floor: int = 0, count: int | None = None
    ) -> int:
        self.counts.append(count)
        if self.fail:
            raise ConnectionRefusedError("database down")
        self.epoch = max(self.epoch, floor) + 1
        return self.epoch


async def settle(until: Callable[[], bool] | None = None) -> None:
    """Let the loops run (no time passes); with `until`, fail unless it becomes true."""
    for _ in range(2000):
        if until is None or until():
            break
        await asyncio.sleep(0)
    assert until is None or until(), "condition never became true"
    for _ in range(100):
        await asyncio.sleep(0)


async def step(clock: FakeClock, seconds: float, by: float = 0.125) -> None:
    """Advance the fake clock in small steps (exact in binary), letting the loops run after each."""
    for _ in range(round(seconds / by)):
        clock.advance(by)
        await settle()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def kv(clock: FakeClock) -> FakeKV:
    return FakeKV(clock)


@pytest.fixture
def epochs() -> Epochs:
    return Epochs()


Start = Callable[[str], tuple[Leadership, "asyncio.Task[None]"]]


@pytest.fixture
async def start(clock: FakeClock, kv: FakeKV, epochs: Epochs) -> AsyncIterator[Start]:
    """Starts `Leadership(...).run` for an instance id; stops every loop after the test."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def start(instance: str) -> tuple[Leadership, asyncio.Task[None]]:
        settings = Settings(instance_id=instance, lease_ttl=TTL)
        lead = Leadership(
            cast(KeyValue, kv), cast(asyncpg.Pool, None), settings, clock, Metrics(), None, epochs
        )
        tasks.append(asyncio.create_task(lead.run(stop), name=f"leader-{instance}"))
        return lead, tasks[-1]

    yield start
    stop.set()
    if kv.gate is not None:
        kv.gate.set()
    async with asyncio.timeout(2):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if r is not None and not isinstance(r, asyncio.CancelledError)]
    assert errors == []


def value(kv: FakeKV) -> dict[str, Any]:
    entry = kv.current(LEASE_KEY)
    assert entry is not None
    return dict(json.loads(entry.value))


def gauge(lead: Leadership, name: str) -> float | None:
    assert isinstance(lead.events, Metrics)  # the daemon's listener, holding the registry
    return lead.events.registry.get_sample_value(f"mq_scheduler_{name}")


async def test_create_takes_office(start: Start, kv: FakeKV, epochs: Epochs) -> None:
    """A successful create takes office with a PostgreSQL epoch written back into the lease,
    naming the engine's partition count (1), which the take checks is still recorded."""
    a, _ = start("a")
    async with asyncio.timeout(1):
        assert await a.wait_for_office() == 1
    assert epochs.counts == [1]
    assert a.may_act() and a.role == "leader" and not a.lost.is_set()
    since = a.info()["since"]
    assert value(kv) == {"instance": "a", "epoch": 1, "since": since, "run": a.lease.run}
    assert a.info()["epoch"] == 1 and a.info()["role"] == "leader"
    assert gauge(a, "is_leader") == 1 and gauge(a, "leader_epoch") == 1


async def test_renew_keeps_office(start: Start, kv: FakeKV, clock: FakeClock) -> None:
    """Renewing every TTL/3 keeps office, and the epoch, well past one TTL."""
    a, _ = start("a")
    await settle(a.may_act)
    first = kv.current(LEASE_KEY)
    await step(clock, 3 * TTL)
    assert a.may_act() and a.epoch == 1
    assert kv.current(LEASE_KEY).revision > first.revision  # type: ignore[union-attr]
    assert gauge(a, "lease_renew_seconds_count") == pytest.approx(3 * TTL / RENEW, abs=1)


async def test_failed_renew_loses_office_at_once(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """A renew that errors ends the term at once, long before the deadline, then it campaigns."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.fail_updates = True
    await step(clock, RENEW)
    assert a.lost.is_set() and not a.may_act() and a.epoch is None and a.role == "standby"
    assert gauge(a, "is_leader") == 0 and gauge(a, "leader_epoch") == 0
    kv.fail_updates = False
    await step(clock, CAMPAIGN)
    assert a.may_act() and a.epoch is not None and a.epoch > 1


async def test_a_renew_outlasts_the_buckets_election(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """While the bucket's stream elects a new leader its writes get 503 (nothing stored): the
    renew is sent again shortly and the term goes on, same epoch, once the bucket answers."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.leaderless = 5  # 0.05 + 0.1 + 0.2 + 0.25 * 2 = 0.85 s of 503s, inside the deadline
    await step(clock, RENEW + 1.0)
    assert a.may_act() and a.epoch == 1 and not a.lost.is_set()
    assert kv.leaderless == 0 and value(kv)["epoch"] == 1


async def test_a_bucket_without_a_leader_past_the_deadline_ends_the_term(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """The retries never outlive the self-fence: with the bucket leaderless for longer, office
    ends at the deadline (sent + TTL - margin), as with a hung renew."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.leaderless = 1000
    await step(clock, 2.375)
    assert a.may_act()
    await step(clock, 0.125)
    assert not a.may_act() and a.lost.is_set() and a.epoch is None
    kv.leaderless = 0  # let a campaign's write through, so the loops can stop
    await step(clock, 0.5)


async def test_self_fence_when_renew_hangs(start: Start, kv: FakeKV, clock: FakeClock) -> None:
    """With the renew stuck, may_act turns false exactly at sent + TTL - margin."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.gate = asyncio.Event()
    await step(clock, 2.375)
    assert a.may_act()
    clock.advance(0.125)
    assert not a.may_act() and a.lost.is_set() and a.epoch is None


async def test_a_renew_on_a_link_since_replaced_is_sent_again_on_the_new_one(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """A renew that went out on a link to a node that froze gets no answer; once the bus has
    left that node (bus/nats/link.py) the renew is sent again on the new link, and the term
    goes on with the same epoch, well past the deadline the hung renew would have hit."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.gate = asyncio.Event()  # the node froze: the renew hangs
    await step(clock, RENEW + 0.5)
    sent = kv.updates
    assert a.may_act() and sent >= 2
    kv.gate = None
    a.lease.on_link(False)
    a.lease.on_link(True)  # reconnected to another node
    await settle()
    assert kv.updates == sent + 1, "the hung renew was not sent again"
    await step(clock, 2 * TTL)
    assert a.may_act() and a.epoch == 1 and not a.lost.is_set()


async def test_a_renew_refused_while_the_link_is_down_goes_out_when_it_is_back(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """nats-py refuses a publish while it reconnects (no reconnect buffer): nothing went out,
    so the renew waits for the link and is sent then; office is not lost for a reconnect."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.link_down = True
    await step(clock, RENEW + 0.5)
    assert a.may_act() and not a.lost.is_set()
    kv.link_down = False
    a.lease.on_link(True)
    await step(clock, 2 * TTL)
    assert a.may_act() and a.epoch == 1 and value(kv)["epoch"] == 1


async def test_a_renew_nobody_answers_is_sent_again_and_the_term_goes_on(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """A renew that goes out on a live link and is never answered (nothing stored) is sent
    again `UNANSWERED_AFTER` later, same revision check; the copy is stored and the term goes
    on with the same epoch, instead of ending at the deadline."""
    a, _ = start("a")
    await settle(a.may_act)
    revision = kv.current(LEASE_KEY).revision  # type: ignore[union-attr]
    kv.unanswered = 1
    await step(clock, RENEW + UNANSWERED_AFTER + 0.125)
    assert kv.unanswered == 0 and kv.current(LEASE_KEY).revision > revision  # type: ignore[union-attr]
    await step(clock, 2 * TTL)
    assert a.may_act() and a.epoch == 1 and not a.lost.is_set() and value(kv)["epoch"] == 1


async def test_a_renew_stored_but_unanswered_is_taken_back_when_its_copy_is_refused(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """The first copy of a renew was stored but its answer never came: the copy sent again
    is refused "wrong last sequence", the key is found still ours and taken back with a
    checked update, and the term goes on, same epoch."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.unanswered, kv.unanswered_stored = 1, True
    await step(clock, RENEW + UNANSWERED_AFTER + 0.125)
    assert kv.unanswered == 0
    await step(clock, 2 * TTL)
    assert a.may_act() and a.epoch == 1 and not a.lost.is_set()
    assert value(kv)["epoch"] == 1 and value(kv)["run"] == a.lease.run


async def test_an_unanswered_renew_never_takes_back_another_instances_write(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """While a renew waits unanswered another instance writes the key: the copy sent again is
    refused, the key is not ours, and the term ends at once."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.unanswered = 1
    await step(clock, RENEW + 0.125)
    kv._write(LEASE_KEY, json.dumps({"instance": "b", "epoch": 2, "run": "other"}).encode())
    await step(clock, UNANSWERED_AFTER)
    assert not a.may_act() and a.lost.is_set() and value(kv)["instance"] == "b"


async def test_a_campaign_whose_create_gets_no_answer_tries_again_next_tick(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """A standby's create sent to a bucket leader that froze gets no answer: it is given up
    after TTL/3 and sent again on the next tick, so the standby takes office within a tick of
    the bucket answering again, not after the client's whole request timeout."""
    kv.creates_hang = True
    a, _ = start("a")
    await step(clock, 2.0)
    assert not a.may_act()
    kv.creates_hang = False  # the bucket has a leader again
    await step(clock, TTL / 3 + CAMPAIGN + 0.125)
    assert a.may_act() and a.epoch == 1


async def test_a_late_renewal_stored_after_the_term_ended_is_taken_back_not_waited_out(
    start: Start, kv: FakeKV, clock: FakeClock, epochs: Epochs
) -> None:
    """A renewal sent on a link whose node froze is stored seconds later, after the term ended
    at its deadline: the key is ours, nobody acts on it, and every create fails. The next
    campaign takes it back with a revision-checked update and a fresh epoch, instead of
    waiting a whole TTL for it to expire; another instance's key is never taken that way."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.gate = asyncio.Event()  # the node froze: the renewal hangs
    await step(clock, 2.375)
    assert a.may_act()
    late = json.dumps({"instance": "a", "epoch": 1, "since": None, "run": a.lease.run}).encode()
    kv._write(LEASE_KEY, late)  # the thawed node forwards the renewal it had read: stored now
    kv.gate = None
    clock.advance(0.125)
    assert not a.may_act() and a.lost.is_set()  # the deadline passed first
    await step(clock, CAMPAIGN + 0.25)
    assert a.may_act() and a.epoch == 2 and epochs.epoch == 2
    assert value(kv)["epoch"] == 2 and value(kv)["run"] == a.lease.run


async def test_another_processs_lease_is_never_adopted(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """A key naming this instance but written by another process (same instance id, another
    `run`) is left alone: the campaign loses until it expires."""
    b, _ = start("b")
    kv._write(LEASE_KEY, json.dumps({"instance": "b", "epoch": 5, "run": "other"}).encode())
    await step(clock, TTL - 0.25)
    assert not b.may_act() and value(kv)["run"] == "other"
    await step(clock, 1.0)
    assert b.may_act() and value(kv)["run"] == b.lease.run


async def test_a_link_that_stays_down_still_ends_the_term_at_the_deadline(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """Waiting for the link never outlives the self-fence (sent + TTL - margin)."""
    a, _ = start("a")
    await settle(a.may_act)
    kv.link_down = True
    await step(clock, 2.375)
    assert a.may_act()
    await step(clock, 0.125)
    assert not a.may_act() and a.lost.is_set()
    kv.link_down = False
    a.lease.on_link(True)  # let a campaign through, so the loops can stop
    await step(clock, 0.5)


async def test_two_instances_one_leader(start: Start, clock: FakeClock, epochs: Epochs) -> None:
    """Two instances on one bucket: exactly one leads, and keeps leading while it renews."""
    a, _ = start("a")
    b, _ = start("b")
    await settle(lambda: a.may_act() or b.may_act())
    leader = a if a.may_act() else b
    for _ in range(10):
        await step(clock, CAMPAIGN)
        assert [x.may_act() for x in (a, b)].count(True) == 1 and leader.may_act()
    assert epochs.epoch == 1
    other = b if leader is a else a
    assert other.info()["leader"] == leader.instance and other.info()["epoch"] is None


async def test_resign_hands_over_through_watch(start: Start, kv: FakeKV) -> None:
    """Resigning deletes the lease; the watching standby takes office with no time passing."""
    a, a_task = start("a")
    await settle(a.may_act)
    b, _ = start("b")
    await settle()
    waiter = asyncio.create_task(b.wait_for_office())
    await a.resign()
    assert a.lost.is_set() and not a.may_act()
    async with asyncio.timeout(1):
        assert await waiter == 2
    assert value(kv)["instance"] == "b"
    await settle(a_task.done)


async def test_resign_without_watch_hands_over_at_next_campaign(
    start: Start, kv: FakeKV, clock: FakeClock
) -> None:
    """Without a watcher the standby takes over at its next periodic campaign."""
    kv.watchable = False
    a, _ = start("a")
    await settle(a.may_act)
    b, _ = start("b")
    await settle()
    await a.resign()
    assert kv.current(LEASE_KEY) is None
    await settle()
    assert not b.may_act()
    await step(clock, CAMPAIGN)
    assert b.epoch == 2


async def test_crashed_leader_is_replaced_after_expiry(start: Start, clock: FakeClock) -> None:
    """A leader that stops renewing without resigning is replaced once its lease expires."""
    a, a_task = start("a")
    await settle(a.may_act)
    b, _ = start("b")
    a_task.cancel()
    await settle(a_task.done)
    await step(clock, TTL - 0.2)
    assert not b.may_act()
    await step(clock, 0.2 + CAMPAIGN)
    assert b.epoch == 2 and not a.may_act()


async def test_depose_ends_the_term(start: Start, clock: FakeClock) -> None:
    """A fenced write deposes the leader at once; it hands its lease back and campaigns again."""
    a, _ = start("a")
    await settle(a.may_act)
    a.depose()
    assert a.lost.is_set() and not a.may_act() and a.epoch is None
    await step(clock, CAMPAIGN)
    assert a.epoch == 2


async def test_epoch_never_goes_back_after_a_restore(
    start: Start, clock: FakeClock, epochs: Epochs
) -> None:
    """With the database restored to an older epoch, the next leader takes one above every
    epoch it saw in the lease, so no epoch a leader held before the restore is handed out."""
    a, a_task = start("a")
    await settle(a.may_act)
    for _ in range(4):  # terms 1..5: four depositions
        a.depose()
        await step(clock, CAMPAIGN)
    assert a.epoch == 5
    b, _ = start("b")
    await step(clock, RENEW)  # b's watcher sees a renew of term 5
    epochs.epoch = 2  # the database restored from a backup taken during term 2
    a_task.cancel()
    await settle(a_task.done)
    await step(clock, TTL + CAMPAIGN)
    assert b.epoch == 6


async def test_database_down_gives_the_lease_back(
    start: Start, kv: FakeKV, clock: FakeClock, epochs: Epochs
) -> None:
    """If PostgreSQL cannot give an epoch the lease is deleted and the instance stays standby."""
    epochs.fail = True
    a, _ = start("a")
    await settle()
    assert not a.may_act() and kv.current(LEASE_KEY) is None and kv.seq >= 2
    epochs.fail = False
    await step(clock, CAMPAIGN)
    assert a.epoch == 1


async def test_heartbeat_writes_instance_state(start: Start, kv: FakeKV) -> None:
    """The heartbeat records role, epoch and since when under instances.<id> in the state
    bucket, and deletes the record when it stops."""
    a, _ = start("a")
    await settle(a.may_act)
    stop = asyncio.Event()
    beat = asyncio.create_task(a.heartbeat(cast(KeyValue, kv), stop))
    await settle(lambda: kv.current("instances.a") is not None)
    record = json.loads(kv.current("instances.a").value)  # type: ignore[union-attr]
    assert record["role"] == "leader" and record["epoch"] == 1 and record["instance"] == "a"
    assert a.since is not None and record["since"] == to_rfc3339(a.since)
    stop.set()
    async with asyncio.timeout(1):
        await beat
    assert kv.current("instances.a") is None


async def test_a_clock_check_that_times_out_gives_the_lease_back(
    kv: FakeKV, clock: FakeClock, epochs: Epochs
) -> None:
    """A clock check that fails (it timed out on a loop starved of CPU) before taking office
    hands the lease back and keeps campaigning; it never ends the election (it did: both
    daemons of bench/edge_attacks.py exited under an endless chunked body)."""
    failing = {"on": True}

    async def check() -> bool:
        if failing["on"]:
            raise TimeoutError("deadline passed before the call finished")
        return True

    settings = Settings(instance_id="a", lease_ttl=TTL)
    lead = Leadership(
        cast(KeyValue, kv),
        cast(asyncpg.Pool, None),
        settings,
        clock,
        Metrics(),
        None,
        epochs,
        clock_check=check,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(lead.run(stop))
    try:
        await settle()
        assert not task.done() and not lead.may_act() and kv.current(LEASE_KEY) is None
        failing["on"] = False
        await step(clock, CAMPAIGN)
        assert lead.may_act()
    finally:
        stop.set()
        async with asyncio.timeout(2):
            await task
