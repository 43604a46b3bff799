"""The intake puller's bookkeeping of pull requests across reconnects, silences and outages."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import pytest
from nats.errors import OutboundBufferLimitError

from scheduler.bus.nats import puller as puller_module
from scheduler.bus.nats.puller import Puller


class FakeClient:
    """Just what the puller's request path touches: stats, connection state, publish."""

    def __init__(self) -> None:
        self.stats = {"reconnects": 0}
        self.is_connected = True
        self.sent: list[dict[str, Any]] = []
        self.fail_with: Exception | None = None

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.sent.append(json.loads(payload))


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    return clock


def make(nc: FakeClient, now: list[float]) -> Puller:
    p = Puller(nc, "S", "C", batch=100, expires=5.0)  # type: ignore[arg-type]
    p._heard = now[0]
    return p


async def test_requests_are_asked_again_after_a_reconnect(now: list[float]) -> None:
    """Outstanding requests die with the old connection: after a reconnect the whole batch
    is requested again, although no status said the old requests ended."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100]
    nc.stats["reconnects"] = 1
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100, 100]


async def test_requests_are_asked_again_after_two_missed_heartbeats(now: list[float]) -> None:
    """Every request asks for idle heartbeats; no message and no status for two of them (a
    consumer leader that died or froze with the request) and the requests are taken as lost
    and asked again; a delivery or status in between keeps them."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    assert nc.sent[0]["idle_heartbeat"] == int(puller_module.HEARTBEAT * 1e9)
    silence = puller_module.HEARTBEAT * puller_module.MISSED_HEARTBEATS
    now[0] += silence - 0.05
    await p._top_up()
    assert len(nc.sent) == 1
    p._on_raw(b"inbox", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")  # heard something
    now[0] += silence - 0.05
    await p._top_up()
    assert len(nc.sent) == 1
    now[0] += 0.1
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100, 100]


async def test_a_request_nobody_took_is_sent_again_after_a_short_pause(now: list[float]) -> None:
    """A 503 (no server leads the consumer during its election) ends the requests: they are
    sent again once NO_LEADER_PAUSE has passed, not after a request's expiry."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    p._on_raw(b"inbox", b"", b"", b"NATS/1.0 503\r\n\r\n")
    assert p._requested == 0
    await p._top_up()
    assert len(nc.sent) == 1  # within the pause: no storm of requests
    assert p._next_check(1.0) == pytest.approx(puller_module.NO_LEADER_PAUSE)
    now[0] += puller_module.NO_LEADER_PAUSE
    await p._top_up()
    assert len(nc.sent) == 2 and p._requested == 100


async def test_a_waiting_take_wakes_when_a_heartbeat_is_missed(now: list[float]) -> None:
    """`take()` sleeps no longer than the missed-heartbeat deadline, so a lost request is
    replaced within two heartbeats even while the caller asks for a long wait; then it goes on
    waiting (with nothing come it returns after its timeout, not sooner) and hands over what
    the new request brings."""
    nc = FakeClient()
    p = make(nc, now)
    await p._top_up()
    silence = puller_module.HEARTBEAT * puller_module.MISSED_HEARTBEATS
    assert p._next_check(30.0) == pytest.approx(silence + 0.01)
    now[0] += silence + 0.02  # the clock is frozen: the wait ends only by an arrival
    waiting = asyncio.ensure_future(p.take(timeout=30.0, linger=0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(nc.sent) == 2 and not waiting.done()  # asked again, still waiting
    _deliver(p, 1)
    assert len(await waiting) == 1


async def test_an_outage_is_back_pressure_not_an_error(now: list[float]) -> None:
    """While disconnected nothing is sent and nothing counted; a publish refused because the
    link dropped just then (OutboundBufferLimitError) is swallowed and asked again later."""
    nc = FakeClient()
    p = make(nc, now)
    nc.is_connected = False
    await p._top_up()
    assert nc.sent == [] and p._requested == 0
    nc.is_connected = True
    nc.fail_with = OutboundBufferLimitError()
    await p._top_up()
    assert nc.sent == [] and p._requested == 0
    nc.fail_with = None
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100] and p._requested == 100


def _deliver(p: Puller, n: int) -> None:
    for i in range(n):
        p._on_raw(b"mq.delay.x", f"$JS.ACK.S.C.1.{i}.{i}.1.0".encode(), b"{}", None)


async def test_a_batch_lingers_from_its_oldest_message_not_from_the_call(
    now: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages that came while the caller handled the last batch wait with the next ones until
    the oldest is `linger` old, so a handful is not committed alone; older ones go at once."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        slept.append(round(delay, 6))
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    nc = FakeClient()
    p = make(nc, now)
    p._requested = 100
    _deliver(p, 2)  # at 100.0
    now[0] += 0.004
    assert len(await p.take(timeout=1, linger=0.01)) == 2
    assert slept == [0.006]  # until the oldest is 10 ms old, not 10 ms more
    _deliver(p, 3)
    now[0] += 0.02  # already older than the linger: taken at once
    assert len(await p.take(timeout=1, linger=0.01)) == 3
    assert slept == [0.006]
    _deliver(p, 100)  # a whole batch is in: no linger at all
    assert len(await p.take(timeout=1, linger=0.01)) == 100
    assert slept == [0.006]


class LaneClient(FakeClient):
    """A FakeClient that also answers the two requests of a recovery from a pretend lane: the
    consumer's `CONSUMER.INFO` (its delivered and ack-floor sequences) and `STREAM.MSG.GET`."""

    def __init__(self, stored: dict[int, bytes]) -> None:
        super().__init__()
        self.stored = stored
        self.info: dict[str, Any] = {
            "delivered": {"consumer_seq": 0, "stream_seq": 0},
            "ack_floor": {},
        }
        self.gets: list[int] = []
        self.checks: list[float] = []  # the timeout of every CONSUMER.INFO asked
        self.leaderless = False  # CONSUMER.INFO gets no answer (the consumer has no leader)

    async def request(self, subject: str, payload: bytes, timeout: float = 1.0) -> Any:
        if subject.startswith("$JS.API.CONSUMER.INFO."):
            self.checks.append(timeout)
            if self.leaderless:
                raise TimeoutError
            return _Reply(json.dumps(self.info).encode())
        assert subject == "$JS.API.STREAM.MSG.GET.S"
        ask = json.loads(payload)
        seq = ask["seq"]
        self.gets.append(seq)
        if ask.get("next_by_subj") == ">":  # the first stored at or after `seq`
            seq = min((s for s in self.stored if s >= seq), default=seq)
        if seq not in self.stored:
            return _Reply(b'{"error": {"code": 404, "description": "no message found"}}')
        body = {
            "subject": "mq.delay.x",
            "seq": seq,
            "data": base64.b64encode(self.stored[seq]).decode(),
            "time": "2026-12-03T07:29:47.123456789Z",
        }
        return _Reply(json.dumps({"message": body}).encode())


class _Reply:
    def __init__(self, data: bytes) -> None:
        self.data = data


def _deliver_seqs(p: Puller, pairs: list[tuple[int, int]]) -> None:
    for sseq, cseq in pairs:
        p._on_raw(b"mq.delay.x", f"$JS.ACK.S.C.1.{sseq}.{cseq}.1.0".encode(), b"{}", None)


def _info(delivered: tuple[int, int], floor: int, pending: int) -> dict[str, Any]:
    """The consumer's `CONSUMER.INFO`: delivered (consumer, stream sequence), the ack floor's
    stream sequence and how many deliveries are unacknowledged."""
    return {
        "delivered": {"consumer_seq": delivered[0], "stream_seq": delivered[1]},
        "ack_floor": {"stream_seq": floor},
        "num_ack_pending": pending,
    }


def _new_term(nc: LaneClient, now: list[float]) -> Puller:
    """A puller as `start()` leaves it (the rest of `start()` needs a subscription)."""
    p = make(nc, now)
    p._fresh = True
    return p


async def test_deliveries_lost_between_two_others_are_read_back_at_once(now: list[float]) -> None:
    """Deliveries whose consumer sequence jumps (4-6 went to an inbox on a node that froze)
    are read back from the stream by sequence and handed over first, without an ack subject,
    with the stream's sequence and store time as their metadata: not 10 s later."""
    nc = LaneClient({4: b"four", 5: b"five", 6: b"six"})
    p = make(nc, now)
    p._requested = 100
    _deliver_seqs(p, [(1, 1), (2, 2), (3, 3), (7, 7)])
    got = await p.take(timeout=1, linger=0)
    assert [m.data for m in got[:3]] == [b"four", b"five", b"six"]
    assert len(got) == 7 and nc.gets == [4, 5, 6]
    first = got[0]
    assert first.reply == "" and first.metadata.sequence.stream == 4
    assert first.metadata.timestamp.timestamp() == pytest.approx(1796282987.123456789)
    await first.ack()  # no ack subject: nothing to do (the redelivery is acked instead)
    await first.in_progress()
    assert p.recovered == 3
    assert await p.take(timeout=0, linger=0) == [] and nc.gets == [4, 5, 6]  # asked once


async def test_a_redelivery_is_no_gap(now: list[float]) -> None:
    """A redelivered message raises the consumer sequence with an older stream sequence:
    nothing is missing, nothing is read back."""
    nc = LaneClient({})
    p = make(nc, now)
    p._requested = 100
    _deliver_seqs(p, [(5, 1), (6, 2), (2, 4)])
    assert len(await p.take(timeout=1, linger=0)) == 3
    assert nc.gets == []


async def test_after_a_reconnect_the_consumers_count_shows_what_never_came(
    now: list[float],
) -> None:
    """Deliveries lost with nothing delivered after them: RECHECK_AFTER past a reconnect the
    consumer is asked, and what it delivered beyond the last delivery seen here is read back."""
    nc = LaneClient({3: b"three", 4: b"four"})
    p = make(nc, now)
    p._requested = 100
    _deliver_seqs(p, [(1, 1), (2, 2)])
    assert len(await p.take(timeout=1, linger=0)) == 2
    nc.info = {"delivered": {"consumer_seq": 4, "stream_seq": 4}, "ack_floor": {"stream_seq": 0}}
    nc.stats["reconnects"] = 1
    await p.take(timeout=0, linger=0)  # notices the reconnect, asks again, schedules the check
    assert nc.gets == []
    now[0] += puller_module.RECHECK_AFTER
    got = await p.take(timeout=0, linger=0)
    assert [m.data for m in got] == [b"three", b"four"]


async def test_a_new_puller_reads_back_what_a_previous_holder_left_unacknowledged(
    now: list[float],
) -> None:
    """FRESH_CHECK after it starts, a new puller asks the consumer and reads back everything
    delivered above the ack floor (a leader's in-flight messages when it died) but what it
    was handed itself meanwhile; sequences acknowledged since (gone from the work queue) are
    skipped."""
    nc = LaneClient({8: b"eight", 10: b"ten"})
    nc.info = _info((12, 10), 7, 2)
    p = _new_term(nc, now)
    p._requested = 100
    _deliver_seqs(p, [(9, 12)])  # handed to this puller after it started
    found = await p._recover()
    assert [m.data for m in found] == [b"eight", b"ten"] and nc.gets == [8, 10]


async def test_a_range_read_back_is_not_read_back_again_by_a_later_check(
    now: list[float],
) -> None:
    """What a check read back (a previous holder's deliveries, a reconnect's gap) counts as
    seen: the next check, an incident's watch with the consumer unchanged, reads nothing
    again (it did, every 0.5 s of the watch, handing the same task over twice)."""
    nc = LaneClient({8: b"eight"})
    nc.info = _info((9, 8), 7, 1)
    p = _new_term(nc, now)
    p._requested = 100
    p._watch()
    assert [m.data for m in await p._recover()] == [b"eight"]
    now[0] += puller_module.RECHECK_AFTER
    assert await p._recover() == [] and nc.gets == [8]


async def test_a_read_back_costs_a_read_per_message_still_stored_not_per_sequence(
    now: list[float],
) -> None:
    """After a kill the range between the ack floor and the last delivery spans every engine's
    deliveries since the oldest unacknowledged one, mostly acknowledged and gone from the work
    queue: 300 sequences holding 3 messages are read with at most a read per segment and
    one per message found, not 300 reads (1.2 s for 1,762 on a busy host)."""
    nc = LaneClient({105: b"a", 106: b"b", 390: b"c", 450: b"beyond"})
    nc.info = _info((400, 400), 100, 3)
    p = _new_term(nc, now)
    found = await p._recover()
    assert [m.data for m in found] == [b"a", b"b", b"c"]
    assert [m.metadata.sequence.stream for m in found] == [105, 106, 390]
    assert len(nc.gets) <= puller_module.RECOVER_AT_ONCE + 3
    assert p.recovered == 3


async def test_a_gap_larger_than_a_few_batches_is_left_to_the_ack_wait(now: list[float]) -> None:
    """A backlog is not a loss: over RECOVER_MAX batches missing, nothing is read back."""
    nc = LaneClient({})
    nc.info = _info((100_000, 100_000), 0, 100_000)
    p = make(nc, now)
    assert await p._recover() == [] and nc.gets == []


async def test_a_long_range_with_little_unacknowledged_is_read_back(now: list[float]) -> None:
    """A new term's range spans every delivery since the oldest unacknowledged one (6,000
    sequences 3 s after a kill at 2,000 tasks/s), nearly all acknowledged and gone: it is read
    back, a read per message still stored and one per segment, not left to the ack wait. Past
    RECOVER_SPAN batches it is left, whatever is unacknowledged."""
    stored = {2_000: b"a", 4_500: b"b", 7_900: b"c"}
    nc = LaneClient(stored)
    nc.info = _info((9_000, 8_000), 1_999, 3)
    p = _new_term(nc, now)
    found = await p._recover()
    assert [m.data for m in found] == [b"a", b"b", b"c"]
    assert len(nc.gets) <= puller_module.RECOVER_AT_ONCE + len(stored)
    span = puller_module.RECOVER_SPAN * p.batch
    nc.info["delivered"] = {"consumer_seq": span + 9_000, "stream_seq": span + 2_000}
    nc.gets = []
    p._fresh = True
    assert await p._recover() == [] and nc.gets == []


async def test_an_unanswered_check_is_short_and_asked_again_once_the_consumer_is_heard(
    now: list[float],
) -> None:
    """take() waits for the consumer check, so a check nobody answers (a frozen consumer
    leader) holds intake at most CHECK_TIMEOUT, not a second; and when deliveries come again
    the check is made at once, not a RECHECK_PAUSE later, so what was handed to the frozen node
    is read back as soon as the consumer answers."""
    nc = LaneClient({4: b"four", 5: b"five"})
    p = make(nc, now)
    p._requested = 100
    _deliver_seqs(p, [(1, 1), (2, 2)])
    assert len(await p.take(timeout=1, linger=0)) == 2
    nc.stats["reconnects"] = 1
    await p.take(timeout=0, linger=0)  # the reconnect schedules a check
    now[0] += puller_module.RECHECK_AFTER
    nc.leaderless = True
    assert await p.take(timeout=0, linger=0) == []
    assert len(nc.checks) == 1 and nc.checks[0] <= 0.25
    assert p._check_at == now[0] + puller_module.RECHECK_PAUSE  # asked again later
    nc.leaderless = False
    nc.info = {"delivered": {"consumer_seq": 5, "stream_seq": 5}, "ack_floor": {"stream_seq": 0}}
    now[0] += 0.01  # well inside the pause: the consumer delivers again (no gap in sequence)
    _deliver_seqs(p, [(3, 3)])
    got = await p.take(timeout=0, linger=0)
    assert len(nc.checks) == 2  # asked at once
    assert [m.data for m in got] == [b"four", b"five", b"{}"]


async def test_requests_kept_alive_but_unserved_are_asked_again(now: list[float]) -> None:
    """After a frozen consumer leader thaws, requests sent into the freeze may get idle
    heartbeats and no message until they expire (5 s) while the lane fills. A check that finds
    the consumer holding undelivered messages while nothing came here for RECHECK_AFTER asks
    again at once and checks once more; once deliveries flow, no more."""
    nc = LaneClient({})
    p = make(nc, now)
    await p._top_up()
    assert [r["batch"] for r in nc.sent] == [100]
    _deliver_seqs(p, [(1, 1)])
    assert len(await p.take(timeout=0, linger=0)) == 1
    nc.info = {"delivered": {"consumer_seq": 1, "stream_seq": 1}, "num_pending": 40}
    now[0] += puller_module.RECHECK_AFTER
    p._on_raw(b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")  # alive, no message
    assert await p._recover() == []
    await p._top_up()
    assert len(nc.sent) == 2 and nc.sent[1]["batch"] == 100  # asked again, in full
    assert p._check_at == now[0] + puller_module.RECHECK_AFTER  # and looked at once more
    now[0] += 0.1
    _deliver_seqs(p, [(2, 2)])  # the new request is served
    assert len(await p.take(timeout=0, linger=0)) == 1
    now[0] += puller_module.RECHECK_AFTER - 0.1
    nc.info = {"delivered": {"consumer_seq": 2, "stream_seq": 2}, "num_pending": 39}
    assert await p._recover() == []
    await p._top_up()
    assert len(nc.sent) == 2 and p._check_at is None  # served: nothing more


async def test_after_an_incident_a_lane_that_fills_later_is_looked_at_again(
    now: list[float],
) -> None:
    """After a reconnect the first checks may find the lane empty (its own leader is still
    being elected) and the lane fill afterwards while the requests, kept alive by heartbeats,
    stay unserved: within INCIDENT_WATCH of the incident the puller keeps checking while
    nothing comes, and asks again once a check finds messages undelivered (seen: intake
    waiting out a request's 5 s expiry after a frozen node thawed)."""
    nc = LaneClient({})
    p = make(nc, now)
    await p._top_up()
    nc.stats["reconnects"] = 1
    await p._top_up()  # the reconnect: asked again, a check scheduled, the watch begins
    assert len(nc.sent) == 2
    nc.info = {"delivered": {"consumer_seq": 0, "stream_seq": 0}, "num_pending": 0}
    for _ in range(3):  # the lane is empty: no reason to ask again, but looked at again
        now[0] += puller_module.RECHECK_AFTER
        p._on_raw(b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")  # alive
        assert await p._recover() == []
        await p._top_up()
        assert len(nc.sent) == 2 and p._check_at == now[0] + puller_module.RECHECK_AFTER
    nc.info = {"delivered": {"consumer_seq": 0, "stream_seq": 0}, "num_pending": 40}
    now[0] += puller_module.RECHECK_AFTER  # the lane filled; the requests are not served
    p._on_raw(b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")
    assert await p._recover() == []
    await p._top_up()
    assert len(nc.sent) == 3 and nc.sent[2]["batch"] == 100  # asked again, not left to expire
    # past the watch, an idle lane with live requests is left alone again
    nc.info = {"delivered": {"consumer_seq": 0, "stream_seq": 0}, "num_pending": 0}
    now[0] += puller_module.INCIDENT_WATCH
    p._on_raw(b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")
    assert await p._recover() == []
    assert p._check_at is None


async def test_unserved_requests_are_asked_again_a_bounded_number_of_times(
    now: list[float],
) -> None:
    """Requests that stay unserved check after check are asked again UNSERVED_TRIES times, not
    for ever: then their own expiry is left to end them."""
    nc = LaneClient({})
    p = make(nc, now)
    await p._top_up()
    nc.info = {"delivered": {"consumer_seq": 0, "stream_seq": 0}, "num_pending": 40}
    for _ in range(puller_module.UNSERVED_TRIES + 3):
        now[0] += puller_module.RECHECK_AFTER
        p._on_raw(b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")  # alive
        assert await p._recover() == []
        await p._top_up()
    assert len(nc.sent) == 1 + puller_module.UNSERVED_TRIES
    assert p._check_at is None


async def test_no_request_is_sent_again_for_a_consumer_idle_or_at_its_ack_limit(
    now: list[float],
) -> None:
    """An idle lane (nothing undelivered) with live requests is no reason to ask again, nor is
    a consumer holding undelivered messages because max_ack_pending is reached (it serves
    no request until acks come, whatever is asked)."""
    nc = LaneClient({})
    p = make(nc, now)
    await p._top_up()
    for info in (
        {"num_pending": 0},
        {"num_pending": 40, "num_ack_pending": 100, "config": {"max_ack_pending": 100}},
    ):
        nc.info = {"delivered": {"consumer_seq": 0, "stream_seq": 0}, **info}
        now[0] += 1.0
        p._on_raw(b"_INBOX.x", b"", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n")  # alive
        assert await p._recover() == []
        await p._top_up()
        assert len(nc.sent) == 1 and p._check_at is None, info


async def test_a_shared_puller_reads_back_nothing_the_others_were_handed(
    now: list[float],
) -> None:
    """A puller sharing its consumer with others (every engine's intake under P > 1) takes a
    jump in the sequences and deliveries beyond its own as the others' (they are handling
    them), and reads none of them back: each engine re-reading the others' tasks multiplied
    the intake work (bench/partitions.py). (At its start it still reads back what was
    unacknowledged then, once: a killed engine's batch in flight is among it.)"""
    nc = LaneClient({s: b"x" for s in range(1, 13)})
    nc.info = _info((12, 12), 2, 9)
    p = Puller(nc, "S", "C", batch=100, expires=5.0, shared=True)  # type: ignore[arg-type]
    p._heard, p._requested = now[0], 100
    _deliver_seqs(p, [(3, 3), (7, 7), (9, 9)])
    assert len(await p.take(timeout=1, linger=0)) == 3
    assert await p._recover() == []
    nc.stats["reconnects"] = 1
    await p.take(timeout=0, linger=0)
    now[0] += puller_module.RECHECK_AFTER
    await p.take(timeout=0, linger=0)
    assert nc.gets == [] and p.recovered == 0


async def test_a_new_puller_reads_back_soon_after_it_starts(
    now: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new term's puller, shared (P > 1) or not, looks for what a dead leader or engine was
    handed FRESH_CHECK after it starts, not RECHECK_AFTER: those tasks are a lease TTL late
    already, and what is still on its way is stored twice harmlessly whenever it looks."""

    async def subscribe(nc: Any, subject: str, handler: Any) -> object:
        return object()

    monkeypatch.setattr(puller_module, "raw_subscribe", subscribe)
    waits = {}
    for shared in (False, True):
        nc = FakeClient()
        nc.new_inbox = lambda: "_INBOX.x"  # type: ignore[attr-defined]
        p = Puller(nc, "S", "C", batch=100, shared=shared)  # type: ignore[arg-type]
        await p.start()
        assert p._fresh and p._check_at is not None and nc.sent  # asked for messages at once
        waits[shared] = p._check_at - now[0]
    assert waits[False] == pytest.approx(puller_module.FRESH_CHECK)
    assert waits[True] == pytest.approx(puller_module.FRESH_CHECK)
    assert puller_module.FRESH_CHECK < puller_module.RECHECK_AFTER


async def test_a_shared_puller_asks_for_a_small_window_that_grows_with_a_backlog(
    now: list[float],
) -> None:
    """Under P > 1 a puller asks for SHARED_WINDOW messages while the lane flows steadily (a
    killed engine holds no more than that unstored), twice what came in while takes come back
    full (a backlog drains in large batches), up to the batch, and falls back as they shrink.
    A puller of its own (P = 1) always asks for the whole batch."""
    nc = FakeClient()
    p = Puller(nc, "S", "C", batch=100, expires=5.0, shared=True)  # type: ignore[arg-type]
    p._heard = now[0]
    await p._top_up()  # as start() asks
    assert [r["batch"] for r in nc.sent] == [puller_module.SHARED_WINDOW]
    _deliver(p, 32)
    assert len(await p.take(timeout=0, linger=0)) == 32
    assert p.window == 64 and nc.sent[-1]["batch"] == 64
    _deliver(p, 64)
    assert len(await p.take(timeout=0, linger=0)) == 64
    assert p.window == 100 and nc.sent[-1]["batch"] == 100  # never past the batch
    _deliver(p, 3)
    await p.take(timeout=0, linger=0)
    assert p.window == puller_module.SHARED_WINDOW
    alone = FakeClient()
    q = make(alone, now)
    await q._top_up()
    _deliver(q, 3)
    await q.take(timeout=0, linger=0)
    assert q.window == 100 and [r["batch"] for r in alone.sent] == [100]
