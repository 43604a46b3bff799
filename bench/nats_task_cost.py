"""nats-server CPU per delayed task, step by step (no daemon, no PostgreSQL).

A delayed task costs nats-server work in five places: the producer's JetStream publish into
the delay lane (`MQ_DELAY`, work queue, file storage, `Nats-Msg-Id`), its delivery to the
daemon's pull consumer, the daemon's ack (which, on a work queue, removes the message), the
daemon's publish of the delivery to the target stream (`Nats-Msg-Id`), and that stream's
delivery to whoever consumes it. This script replays each step alone, at the pace of the
accuracy bench (R messages a second, in 1 ms ticks), with raw-socket clients shaped like the
daemon's (pull requests topped up, acks of a batch in one write; publishes pipelined through
a reply inbox), and reads this run's nats-server CPU from /proc before and after each step:

- `publish_lane`: JetStream publishes to a work-queue stream, PubAck per message;
- `pull_ack`: the same messages pulled and acked one ack each (explicit ack policy:
  the daemon's intake consumer);
- `pull_ack_limits`: the same again from a copy of the lane with limits retention (the acked
  message stays in the stream): what the work queue's removal of an acked message costs.
  (An ack-all consumer is not an option: nats-server refuses it on a work-queue stream,
  error 10098 "workqueue stream requires explicit ack".)
- `publish_target`: the deliveries, JetStream publishes with `Nats-Msg-Id` to the target
  stream (limits retention, file storage), PubAck per message;
- `consume_target`: a push consumer (ack none) reading the target stream, as the accuracy
  bench's collector does (the bench's share, not the daemon's).

    .venv/bin/python bench/nats_task_cost.py [--count 50000] [--rate 5000] [--reps 3] [--cluster]
        [--out F]

`--cluster` runs each step on a 3-node JetStream cluster on loopback (tests/support/cluster.py)
with every stream at 3 replicas, the clients on one node, and sums the three servers' CPU: what
a task costs JetStream as production runs it (the capacity model in bench/README.md).

Prints JSON (`results.steps_us_per_msg`: median and range per step over the repetitions)
and a one-line summary on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
from nats.js import api as js_api

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import cpu_seconds, report, run, servers
from rawnats import _Conn

PAYLOAD = (
    b'{"id":"%s","type":"bench.task","source":"bench","timestamp":"2026-11-26T00:00:00.000Z",'
    b'"priority":5,"delay_until":"2026-11-26T00:00:02.000Z","data":{"n":1,"pad":"%s"}}'
)


class Raw(_Conn):
    """A raw connection (`rawnats._Conn`'s parser) handing each delivery's subject and reply to
    `on_reply`; `done` is set once `expect` deliveries have come."""

    def __init__(self, url: str, expect: int = 0) -> None:
        super().__init__(url)
        self.on_reply: Callable[[bytes, bytes], None] = lambda subject, reply: None
        self.expect, self.seen = expect, 0
        self.done = asyncio.Event()

    def on_msg(self, subject: bytes, reply: bytes, hdr: bytes, payload: bytes, at: float) -> None:
        self.seen += 1
        if self.expect and self.seen >= self.expect:
            self.done.set()
        self.on_reply(subject, reply)

    async def started(self, subscribe: str) -> Raw:
        await self.open(subscribe)
        return self


TICK = 0.001


async def paced(conn: Raw, frames: list[bytes], rate: int) -> None:
    """Write `frames` at `rate` a second, in ticks of `TICK` (all frames due by a tick in one
    write; the daemon publishes at each due millisecond, so 1 ms is its shape)."""
    start = time.monotonic()
    sent = 0
    while sent < len(frames):
        due = min(len(frames), int((time.monotonic() - start) * rate) + 1)
        if due > sent:
            conn.writer.write(b"".join(frames[sent:due]))
            sent = due
        await asyncio.sleep(TICK)


async def publish(url: str, subject_of: Any, count: int, rate: int, tag: str) -> None:
    """`count` JetStream publishes with `Nats-Msg-Id`, paced, every PubAck awaited."""
    inbox = f"_INBOX.{tag}"
    conn = await Raw(url, expect=count).started(f"{inbox}.*")  # every PubAck
    frames = []
    for i in range(count):
        msg_id = f"{tag}-{i}"
        payload = PAYLOAD % (msg_id.encode(), b"x" * 60)
        hdr = f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n".encode()
        frames.append(
            b"HPUB %s %s.%d %d %d\r\n%s%s\r\n"
            % (
                subject_of(i).encode(),
                inbox.encode(),
                i,
                len(hdr),
                len(hdr) + len(payload),
                hdr,
                payload,
            )
        )
    await paced(conn, frames, rate)
    await asyncio.wait_for(conn.done.wait(), 60)
    await conn.close()


async def pull(url: str, stream: str, consumer: str, count: int) -> None:
    """Pull everything from `consumer` as the daemon's intake does (requests topped up to a
    batch of 500, a batch handled every 10 ms, its acks in one write)."""
    inbox = f"_INBOX.pull.{stream}"
    conn = await Raw(url).started(inbox)
    buffer: list[bytes] = []
    got = 0
    requested = 0
    api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}".encode()

    def on_msg(subject: bytes, reply: bytes) -> None:
        nonlocal got, requested
        if reply:
            buffer.append(reply)
            got += 1
            requested -= 1
        else:
            requested = 0  # a status: the request ended

    conn.on_reply = on_msg
    while got < count:
        if requested < 250:
            req = json.dumps({"batch": 500 - requested, "expires": 2_000_000_000}).encode()
            conn.writer.write(b"PUB %s %s %d\r\n%s\r\n" % (api, inbox.encode(), len(req), req))
            requested = 500
        await asyncio.sleep(0.01)
        batch, buffer[:] = list(buffer), []
        if not batch:
            continue
        conn.writer.write(b"".join(b"PUB %s 0\r\n\r\n" % r for r in batch))
    await asyncio.sleep(0.2)  # let the last acks land
    await conn.close()


async def consume(url: str, subject: str, count: int) -> None:
    """Read `count` messages from a push consumer's deliver subject (ack none)."""
    conn = await Raw(url, expect=count).started(subject)
    await asyncio.wait_for(conn.done.wait(), 120)
    await conn.close()


@contextmanager
def nats_servers(cluster: bool) -> Iterator[tuple[str, list[int]]]:
    """One fresh nats-server, or with `cluster` a 3-node JetStream cluster on loopback
    (tests/support/cluster.py): a URL and the servers' pids."""
    if not cluster:
        with servers(postgres=False) as env:
            yield env.nats_url, [env.nats_pid]
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.cluster import NatsCluster

    work = Path(tempfile.mkdtemp(prefix="mqs-bench-"))
    nodes: Any = None
    try:
        nodes = NatsCluster(root=work / "nats").start()
        yield nodes.nodes[0].url, [n.proc.pid for n in nodes.nodes if n.proc is not None]
    finally:
        if nodes is not None:
            nodes.stop()
        shutil.rmtree(work, ignore_errors=True)


def servers_cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


async def one_rep(count: int, rate: int, rep: int, cluster: bool) -> dict[str, float]:
    replicas = 3 if cluster else 1
    with nats_servers(cluster) as (url, pids):
        nc = await nats.connect(url)
        js = nc.jetstream()
        file = js_api.StorageType.FILE
        for name, subjects, retention in (
            ("LANE", ["lane.>"], js_api.RetentionPolicy.WORK_QUEUE),
            ("LANE2", ["lane2.>"], js_api.RetentionPolicy.LIMITS),
        ):
            await js.add_stream(
                js_api.StreamConfig(
                    name=name,
                    subjects=subjects,
                    retention=retention,
                    storage=file,
                    duplicate_window=120,
                    num_replicas=replicas,
                )
            )
        await js.add_stream(
            js_api.StreamConfig(
                name="TARGET",
                subjects=["target.>"],
                storage=file,
                duplicate_window=120,
                num_replicas=replicas,
            )
        )
        for stream, durable in (("LANE", "intake"), ("LANE2", "intake")):
            await js.add_consumer(
                stream,
                js_api.ConsumerConfig(
                    durable_name=durable,
                    ack_policy=js_api.AckPolicy.EXPLICIT,
                    ack_wait=30,
                    max_ack_pending=100_000,
                    max_waiting=16,
                ),
            )
        out: dict[str, float] = {}

        async def step(name: str, coro: Any) -> None:
            before = servers_cpu(pids)
            await coro
            await asyncio.sleep(0.3)  # the server's own flushes after the last reply
            out[name] = round((servers_cpu(pids) - before) / count * 1e6, 2)

        await step(
            "publish_lane",
            publish(url, lambda i: f"lane.t.{i % 16}", count, rate, f"l{rep}"),
        )
        await publish(url, lambda i: f"lane2.t.{i % 16}", count, rate, f"m{rep}")
        await step("pull_ack", pull(url, "LANE", "intake", count))
        await step("pull_ack_limits", pull(url, "LANE2", "intake", count))
        out["lane_messages_left"] = float((await js.stream_info("LANE")).state.messages)
        deliver = "_DELIVER.target"
        await js.add_consumer(
            "TARGET",
            js_api.ConsumerConfig(
                ack_policy=js_api.AckPolicy.NONE,
                deliver_subject=deliver,
                deliver_policy=js_api.DeliverPolicy.NEW,
            ),
        )
        reader = asyncio.create_task(consume(url, deliver, count))
        await asyncio.sleep(0.2)
        before = servers_cpu(pids)
        await publish(url, lambda i: "target.work", count, rate, f"t{rep}")
        await reader
        await asyncio.sleep(0.3)
        both = (servers_cpu(pids) - before) / count * 1e6
        out["publish_target_and_consume"] = round(both, 2)
        await nc.close()
        return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--rate", type=int, default=5_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tick-ms", type=float, default=1.0, help="publish every N ms (default 1)")
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="on a 3-node JetStream cluster, every stream at 3 replicas: the three servers' CPU",
    )
    ap.add_argument("--out")
    a = ap.parse_args()
    global TICK
    TICK = a.tick_ms / 1000
    reps = [await one_rep(a.count, a.rate, r, a.cluster) for r in range(a.reps)]
    steps = {}
    for key in reps[0]:
        values = [r[key] for r in reps]
        steps[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    per_task = sum(
        steps[k]["median"] for k in ("publish_lane", "pull_ack", "publish_target_and_consume")
    )
    results = {"steps_us_per_msg": steps, "per_task_us": round(per_task, 1), "runs": reps}
    removal = steps["pull_ack"]["median"] - steps["pull_ack_limits"]["median"]
    summary = (
        f"nats_task_cost: {per_task:.1f} us/task of nats-server CPU"
        f"{' (3 nodes, R3, all three)' if a.cluster else ''}: lane publish "
        f"{steps['publish_lane']['median']}, pull+ack {steps['pull_ack']['median']} "
        f"(of which the work queue's removal {removal:.1f}), target publish+consume "
        f"{steps['publish_target_and_consume']['median']}"
    )
    report("nats_task_cost", vars(a), results, {}, True, summary, a.out)


if __name__ == "__main__":
    run(main())
