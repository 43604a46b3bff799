"""Load and measurement for faults on a JetStream cluster (tests/faults, bench/cluster_faults.py).

`Producer` publishes delayed tasks at a steady rate, each due `lead` s after it is sent, and
resends (same `Nats-Msg-Id`) a publish that has no PubAck after `RETRY_AFTER`, as a user's
producer would through an election: a task is *accepted* once it has its PubAck. `Probe` writes
to the target stream every `PROBE_EVERY` s: the broker's own unwritable window after a fault is
the time to its first stored write (and to the producer's first PubAck from the lane, and to
the lane consumer's first answer: `ConsumerProbe`); `NodeProbes` time it as the clients of one
node see it.
`lateness` reads the target stream back: per task id, store time minus due time of each copy.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

PROBE_EVERY = 0.1
RETRY_AFTER = 1.0  # the producer resends a publish with no PubAck after this long


def iso_ms(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def envelope(task_id: str, due: float, now: float) -> bytes:
    return json.dumps(
        {"schema": "hanzo.mq.v1", "id": task_id, "type": "fault.task", "source": "faults",
         "timestamp": iso_ms(now), "delay_until": iso_ms(due), "data": {}}
    ).encode()  # fmt: skip


class Producer:
    """Paced delayed tasks to `subject`; each resent (same id) until it has a PubAck."""

    def __init__(self, nc: Any, subject: str, rate: float, lead: float, prefix: str = "t") -> None:
        self.nc, self.subject, self.rate, self.lead, self.prefix = nc, subject, rate, lead, prefix
        self.accepted: set[str] = set()
        self.acked_at: list[float] = []  # wall time of each acceptance, in order
        self.first_sent: dict[str, float] = {}  # task id -> wall time of its first send
        self.ack_of: dict[str, float] = {}  # task id -> wall time of its PubAck
        self.sent = 0
        self.retries = 0
        self._inflight: dict[str, tuple[bytes, float]] = {}
        self._inbox = ""

    async def start(self) -> Producer:
        self._inbox = self.nc.new_inbox()
        await self.nc.subscribe(self._inbox + ".*", cb=self._on_ack, pending_msgs_limit=-1)
        return self

    async def _on_ack(self, msg: Any) -> None:
        task_id = msg.subject.rsplit(".", 1)[1]
        if (msg.headers and msg.headers.get("Status")) or b'"error"' in msg.data:
            return  # no stream answered, or refused: resent later
        if self._inflight.pop(task_id, None) is not None:
            self.accepted.add(task_id)
            self.acked_at.append(now := time.time())
            self.ack_of[task_id] = now

    async def _send(self, task_id: str, body: bytes) -> None:
        self._inflight[task_id] = (body, time.monotonic())
        try:
            await self.nc.publish(
                self.subject, body, reply=f"{self._inbox}.{task_id}",
                headers={"Nats-Msg-Id": task_id},
            )  # fmt: skip
        except Exception:  # reconnecting: resent later
            pass

    async def run(self, stop: asyncio.Event) -> None:
        start = time.time()
        while not stop.is_set():
            while self.sent < int((time.time() - start) * self.rate):
                task_id = f"{self.prefix}{self.sent}"
                now = self.first_sent[task_id] = time.time()
                await self._send(task_id, envelope(task_id, now + self.lead, now))
                self.sent += 1
            await self._resend_overdue()
            await asyncio.sleep(0.005)

    async def _resend_overdue(self) -> None:
        mono = time.monotonic()
        for task_id, (body, at) in list(self._inflight.items()):
            if mono - at > RETRY_AFTER:
                self.retries += 1
                await self._send(task_id, body)

    async def settle(self, timeout: float) -> int:
        """Resend until every publish is accepted or `timeout` passes; how many never were."""
        deadline = time.monotonic() + timeout
        while self._inflight and time.monotonic() < deadline:
            await self._resend_overdue()
            await asyncio.sleep(0.05)
        return len(self._inflight)

    def first_ack_after(self, at: float) -> float | None:
        return next((t for t in self.acked_at if t > at), None)

    def back_after(self, at: float) -> float | None:
        """When the lane took writes again after its last outage since `at` (see `back_after`)."""
        return back_after(self.acked_at, at)


class Probe:
    """A JetStream publish to `subject` every PROBE_EVERY s; the wall times of stored ones."""

    def __init__(self, js: Any, subject: str, tag: str = "") -> None:
        """`tag` sets this probe's message ids apart from another probe's on the same subject:
        the server refuses a publish whose `Nats-Msg-Id` is still in process for another
        ("duplicate message id is in process", 10158), which would read as an outage."""
        self.js, self.subject, self.tag = js, subject, tag
        self.ok: list[float] = []

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            sent = time.time()
            try:
                await self._write(n)
                self.ok.append(sent)
            except Exception:  # an election, a lost ack: the window goes on
                pass
            await asyncio.sleep(max(0.0, sent + PROBE_EVERY - time.time()))

    async def _write(self, n: int) -> None:
        await self.js.publish(
            self.subject, b"p", timeout=0.5, headers={"Nats-Msg-Id": f"probe{self.tag}-{n}"}
        )

    def first_after(self, at: float) -> float | None:
        return next((t for t in self.ok if t > at), None)

    def back_after(self, at: float) -> float | None:
        """When writes were stored again after the last outage since `at` (see `back_after`)."""
        return back_after(self.ok, at)


GAP = 0.35  # s without a stored probe write (sent every PROBE_EVERY): an outage


def back_after(times: list[float], at: float) -> float | None:
    """The end of the last outage (a gap over GAP s between successes) that ended after `at`,
    or the first success after `at` when there was none: a node thawed after a SIGSTOP can make
    the broker step its leaders down again, a second outage the first answer would hide."""
    after = [t for t in times if t > at]
    if not after:
        return None
    chain = [t for t in times if t <= at][-1:] + after
    ends = [b for a, b in itertools.pairwise(chain) if b - a > GAP]
    return ends[-1] if ends else after[0]


class ConsumerProbe(Probe):
    """`$JS.API.CONSUMER.INFO` of the lane's durable consumer every PROBE_EVERY s: only the
    consumer's leader answers it, so it is down for the consumer's own election (a raft group
    of its own, which may lose its leader while the lane's stream keeps its)."""

    def __init__(self, js: Any, stream: str, consumer: str) -> None:
        super().__init__(js, f"{stream}/{consumer}")
        self.stream, self.consumer = stream, consumer

    async def _write(self, n: int) -> None:
        await self.js.consumer_info(self.stream, self.consumer, timeout=0.5)


class NodeProbes:
    """The probes of one node on a connection pinned to it (it never moves to another node):
    the broker's outage as a client of that node sees it. The other probes time the outage
    from whichever node their connection landed on, and a node can be out for its clients
    while another answers (a thawed node's return can make a raft group elect again; a client
    of another node may be answered sooner, or not at all: measured per node, not assumed).
    `subjects`: the streams' subjects to write a probe to; `consumer`: (stream, durable) whose
    info to ask for."""

    def __init__(self, node: str, nc: Any, probes: list[Probe]) -> None:
        self.node, self.nc, self.probes = node, nc, probes

    @classmethod
    async def open(
        cls,
        node: str,
        url: str,
        subjects: list[str],
        consumer: tuple[str, str],
        follow: bool = False,
    ) -> NodeProbes:
        """`follow`: when its node goes (killed, restarted), reconnect to that node again and
        only to it (a bench restarts the nodes it kills); else the connection just ends."""
        if not follow:
            nc = await nats.connect(url, allow_reconnect=False, name=f"probe {node}")
            return cls(node, nc, cls._probes(node, nc, subjects, consumer))
        port = urlsplit(url).port

        def same_node(servers: list[Any], info: dict[str, Any]) -> tuple[Any, float]:
            own = next((s for s in servers if s.uri.port == port), servers[0])
            return own, 0.2

        nc = await nats.connect(
            url, name=f"probe {node}", max_reconnect_attempts=-1,
            reconnect_to_server_handler=same_node,
        )  # fmt: skip
        return cls(node, nc, cls._probes(node, nc, subjects, consumer))

    @staticmethod
    def _probes(node: str, nc: Any, subjects: list[str], consumer: tuple[str, str]) -> list[Probe]:
        js = nc.jetstream()
        probes = [Probe(js, subject, tag=node) for subject in subjects]
        probes.append(ConsumerProbe(js, *consumer))
        return probes

    def back_after(self, at: float) -> float | None:
        """When this node's probes were all answered again after `at` (`Probe.back_after`)."""
        ends = [p.back_after(at) for p in self.probes]
        return None if None in ends else max(e for e in ends if e is not None)

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()


async def lateness(urls: list[str], stream: str) -> dict[str, tuple[float, list[float]]]:
    """{task id: (due, [store time - due in ms, per copy])} of the daemon's deliveries in
    `stream` (messages with `Mq-Scheduled-For`; probes are left out)."""
    nc = await nats.connect(urls)
    out: dict[str, tuple[float, list[float]]] = {}
    try:
        js = nc.jetstream()
        state = (await js.stream_info(stream)).state
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
        sub = await js.pull_subscribe(">", stream=stream, config=cfg)
        seen, deadline = 0, time.monotonic() + 30
        while seen < state.messages:
            try:
                batch = await sub.fetch(1000, timeout=5)
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                # a fresh consumer on a replicated stream may have no leader for a moment
                assert time.monotonic() < deadline, f"read {seen} of {state.messages}"
                await asyncio.sleep(0.2)
                continue
            for m in batch:
                seen += 1
                headers = m.headers or {}
                task_id, due_text = headers.get("Nats-Msg-Id", ""), headers.get("Mq-Scheduled-For")
                if due_text is None:
                    continue
                due = datetime.fromisoformat(due_text).timestamp()
                late = (m.metadata.timestamp.timestamp() - due) * 1000
                out.setdefault(task_id, (due, []))[1].append(late)
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


def p99(values: list[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))] if v else 0.0
