"""Traffic for the benchmarks: envelopes, a paced pipelined JetStream producer, a live collector.

The producer publishes at absolute wall times (no sleep drift), with PubAcks collected on one
wildcard inbox so up to 1,000 publishes are in flight. The collector is an ordered push consumer
that timestamps each delivery on arrival and compares it with the task's due time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

STOPPING = asyncio.Event()  # set on Ctrl-C / SIGTERM by common.run()
Item = tuple[float, str, bytes, dict[str, str]]  # (publish at, subject, payload, headers)


def iso_ms(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds and Z, the way producers write envelope times."""
    ms = int(epoch * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def envelope(task_id: str, due: float | None, now: float | None = None) -> bytes:
    """A valid `hanzo.mq.v1` envelope (due and now as epoch seconds); cheap to build in a loop."""
    stamp = iso_ms(time.time() if now is None else now)
    delay = "" if due is None else f',"delay_until":"{iso_ms(due)}"'
    return (
        f'{{"schema":"hanzo.mq.v1","id":"{task_id}","type":"bench.task","source":"bench",'
        f'"timestamp":"{stamp}","priority":5{delay},"data":{{"n":1}}}}'
    ).encode()


def first_instant(count: int) -> float:
    """When a paced run of `count` pre-built items may start: after building them (~6 us each)."""
    return time.time() + 1.0 + count * 2e-5


def delay_items(prefix: str, rate: float, duration: float, delay: float) -> list[Item]:
    """Tasks for the delay lane published at `rate`/s, each due `delay` s after its instant."""
    items: list[Item] = []
    start = first_instant(int(rate * duration))
    for i in range(int(rate * duration)):
        at = start + i / rate
        task_id = f"{prefix}-{i}"
        body = envelope(task_id, at + delay, at)
        items.append((at, "mq.delay.bench.x", body, {"Nats-Msg-Id": task_id}))
    return items


class Pipeline:
    """JetStream publishing with PubAcks collected on one wildcard inbox, bounded in flight."""

    def __init__(self, nc: Client, inflight: int = 1000, timeout: float = 10.0) -> None:
        self.nc, self.timeout = nc, timeout
        self.slots = asyncio.Semaphore(inflight)
        self.sent = self.acked = self.errors = 0
        self.first_error = ""
        self.prefix = ""
        self._idle = asyncio.Event()

    async def start(self) -> Pipeline:
        self.prefix = self.nc.new_inbox()
        await self.nc.subscribe(self.prefix + ".*", cb=self._on_ack, pending_msgs_limit=-1)
        return self

    async def _on_ack(self, msg: Msg) -> None:
        self.slots.release()
        if (msg.headers and msg.headers.get("Status")) or b'"error"' in msg.data:
            self.errors += 1
            self.first_error = self.first_error or (msg.data.decode() or str(msg.headers))
        else:
            self.acked += 1
        if self.acked + self.errors >= self.sent:
            self._idle.set()

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        if STOPPING.is_set():  # nats-py's flush swallows a cancel landing inside publish
            raise asyncio.CancelledError
        if self.slots.locked():  # bounded: a lost ack must not wedge the producer forever
            await asyncio.wait_for(self.slots.acquire(), self.timeout)
        else:
            await self.slots.acquire()
        self.sent += 1
        self._idle.clear()
        await self.nc.publish(subject, payload, reply=f"{self.prefix}.{self.sent}", headers=headers)

    async def drain(self) -> dict[str, Any]:
        """Wait (bounded) for every outstanding PubAck; counts of sent, acked, errors."""
        if self.acked + self.errors < self.sent:
            try:
                await asyncio.wait_for(self._idle.wait(), self.timeout)
            except TimeoutError:
                pass  # reported below as unacked
        unacked = self.sent - self.acked - self.errors
        out = {"sent": self.sent, "acked": self.acked, "errors": self.errors, "unacked": unacked}
        return out | ({"first_error": self.first_error[:200]} if self.first_error else {})


async def produce(pipe: Pipeline, items: Iterable[Item]) -> dict[str, Any]:
    """Publish each item at its own wall time (absolute schedule, so sleeps do not drift)."""
    lags: list[float] = []
    it = iter(items)
    nxt = next(it, None)
    while nxt is not None:
        now = time.time()
        while nxt is not None and nxt[0] <= now:
            await pipe.publish(nxt[1], nxt[2], nxt[3])
            now = time.time()
            lags.append((now - nxt[0]) * 1000)
            nxt = next(it, None)
        if nxt is not None:
            await asyncio.sleep(max(0.0, nxt[0] - time.time()))
    result = await pipe.drain()
    return result | {"publish_lag_ms": stats(lags, early=False)}


class Tally:
    """Arrivals counted by task id: lateness at arrival and at store time, duplicates, and a
    bounded wait for a number of distinct ids. Shared by `Collector` and `rawnats.RawCollector`."""

    def __init__(self) -> None:
        self.late_ms: list[float] = []
        self.store_late_ms: list[float] = []
        self.ids: set[Any] = set()
        self.count = self.duplicates = 0
        self.first_arrival = self.last_arrival = 0.0
        self._want = 0
        self._enough = asyncio.Event()

    def record(self, task_id: Any, due: float, arrival: float, stored: float | None) -> None:
        self.late_ms.append((arrival - due) * 1000)
        if stored is not None:
            self.store_late_ms.append((stored - due) * 1000)
        self.count += 1
        self.first_arrival = self.first_arrival or arrival
        self.last_arrival = arrival
        if task_id in self.ids:
            self.duplicates += 1
        self.ids.add(task_id)
        if self._want and len(self.ids) >= self._want:
            self._enough.set()

    async def wait_for(self, count: int, timeout: float) -> bool:
        """True once `count` distinct ids arrived; False when `timeout` s pass first."""
        self._want = count
        if len(self.ids) >= count:
            return True
        try:
            await asyncio.wait_for(self._enough.wait(), max(timeout, 0.01))
            return True
        except TimeoutError:
            return False

    def summary(self, expected: int) -> dict[str, Any]:
        return {
            "expected": expected,
            "delivered": self.count,
            "distinct": len(self.ids),
            "missing": max(0, expected - len(self.ids)),
            "duplicates": self.duplicates,
            "lateness_ms": stats(self.late_ms),
            "store_lateness_ms": stats(self.store_late_ms),
        }


class Collector(Tally):
    """Live JetStream consumer (ordered push) recording arrival time minus due time per message.

    The due time is the `Mq-Scheduled-For` header when present (the daemon's deliveries), else
    the payload's `delay_until`; ids come from `Nats-Msg-Id`, else the payload's `id`. The store
    time (JetStream timestamp) is kept too, as a second view that excludes the consumer's hop.
    """

    def __init__(self, js: Any, stream: str, subject: str) -> None:
        super().__init__()
        self.js, self.stream, self.subject = js, stream, subject
        self._sub: Any = None

    async def start(self) -> Collector:
        self._sub = await self.js.subscribe(
            self.subject, stream=self.stream, ordered_consumer=True, cb=self._on_msg,
            pending_msgs_limit=-1, pending_bytes_limit=-1,
        )  # fmt: skip
        return self

    async def _on_msg(self, msg: Msg) -> None:
        arrival = time.time()
        headers = msg.headers or {}
        due_s, task_id = headers.get("Mq-Scheduled-For"), headers.get("Nats-Msg-Id")
        if due_s is None or task_id is None:
            doc = json.loads(msg.data)
            due_s, task_id = due_s or doc["delay_until"], task_id or doc["id"]
        due = datetime.fromisoformat(due_s).timestamp()
        self.record(task_id, due, arrival, msg.metadata.timestamp.timestamp())

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None


async def read_back(url: str, stream: str) -> list[Any]:
    """The messages of `stream` stored up to now (no acks), for measuring after a run, in
    stream order. Fails loudly rather than return part of the stream.

    Batches are sized to about 4 MB by the stream's mean message size: a batch of 1,000 dead
    letters of up to 1 MB each outran the server's per-client buffer on a busy host, the server
    cut the connection (slow consumer) and the messages in flight were gone (ack none). A gap
    left by such a cut is read again by a fresh consumer starting at its first missing sequence.
    """
    nc = await nats.connect(url)
    got: dict[int, Any] = {}
    try:
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        if not state.messages:
            return []
        batch = max(1, min(1000, (4 << 20) // max(1, state.bytes // state.messages)))
        want = state.messages  # messages deleted inside the range are not waited for
        start, rounds = state.first_seq, 0
        while len(got) < want:
            rounds += 1
            if rounds > 5:
                raise RuntimeError(f"read back {len(got)} messages of {stream}, which holds {want}")
            cfg = ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                max_ack_pending=-1,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start,
            )
            psub = await js.pull_subscribe(">", stream=stream, config=cfg)
            idle = 0  # empty fetches in a row: big messages may take longer than one timeout
            while idle < 5 and max(got, default=0) < state.last_seq:
                try:
                    msgs = await psub.fetch(batch, timeout=3)
                except (TimeoutError, nats.errors.TimeoutError):
                    msgs = []
                idle = 0 if msgs else idle + 1
                for m in msgs:
                    got[m.metadata.sequence.stream] = m
            await psub.unsubscribe()
            start = next(
                (q for q in range(state.first_seq, state.last_seq + 1) if q not in got),
                state.last_seq,
            )
    finally:
        await nc.close()
    return [got[q] for q in sorted(got)]


def stats(values: list[float], early: bool = True) -> dict[str, float]:
    """count, min, p50, p95, p99, max (nearest rank), and how many are below zero."""
    if not values:
        return {"count": 0}
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * len(v)))], 2)

    out = {"count": len(v), "min": round(v[0], 2), "p50": q(0.5), "p95": q(0.95)}
    out |= {"p99": q(0.99), "max": round(v[-1], 2)}
    return out | ({"early": sum(1 for x in v if x < 0)} if early else {})
