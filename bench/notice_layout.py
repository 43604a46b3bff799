"""Stored notices (scheduler/engine/delayed/stored.py): a subject per partition against one
subject for every partition, measured on a real nats-server.

N engines (`--engines`, 3: N connections in this process) over P partitions, each owning an
Nth. Engine 0 plays the storing engine: it sends `--batches` intake batches of B tasks each (due
soon, random ids, so spread over every partition), one batch every 10 ms, and notices the
tasks of the partitions it does not own:

- `per_partition` (as built): one notice per partition named in the batch, on
  `scheduler.v1.internal.stored.<n>`; each engine subscribes to its own partitions' subjects
  and decodes what it hears (every task in it is its own).
- `one_subject`: one notice per batch, the tasks of every partition, on one subject every
  engine subscribes to (the sender too); each decodes all of it and keeps its own tasks
  (`partition_of` per task).

Reported per layout and B: the process's CPU per noticed task (sender and receivers: one
process, one core), messages sent per batch, and the time from a batch's send to the last
of its tasks handled by its owner (p50, p99).

    python bench/notice_layout.py [--partitions 64] [--engines 3] [--batches 300] [--sizes ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

import nats
from nats.aio.msg import Msg

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import servers

from scheduler.engine.delayed import stored
from scheduler.partitions import partition_of
from scheduler.records import TaskRef

ONE_SUBJECT = "scheduler.v1.internal.stored"


async def run(
    url: str, layout: str, partitions: int, engines: int, size: int, batches: int
) -> dict[str, float]:
    conns = [await nats.connect(url) for _ in range(engines)]
    owner = {p: p % engines for p in range(partitions)}
    pending: dict[str, float] = {}  # task id -> when its batch was sent
    done: list[float] = []

    def handler(engine: int, filtering: bool) -> Callable[[Msg], Awaitable[None]]:
        async def on(msg: Msg) -> None:
            _, refs = stored.decode(msg.data)
            now = time.perf_counter()
            for r in refs:
                if filtering and owner[partition_of(r.task_id, partitions)] != engine:
                    continue
                sent = pending.pop(r.task_id, None)
                if sent is not None:
                    done.append(now - sent)

        return on

    subs = []
    for e, nc in enumerate(conns):
        if layout == "per_partition":
            for p in (p for p in range(partitions) if owner[p] == e):
                subs.append(await nc.subscribe(stored.subject(p), cb=handler(e, False)))
        else:
            subs.append(await nc.subscribe(ONE_SUBJECT, cb=handler(e, True)))
    for nc in conns:
        await nc.flush()
    sender, noticed, messages = conns[0], 0, 0
    began_cpu, latencies = time.process_time(), []
    for _ in range(batches):
        refs = [TaskRef(uuid.uuid4().hex, 1, 5, i) for i in range(size)]
        foreign = [r for r in refs if owner[partition_of(r.task_id, partitions)] != 0]
        at = time.perf_counter()
        for r in foreign:
            pending[r.task_id] = at
        noticed += len(foreign)
        if layout == "per_partition":
            groups: dict[int, list[TaskRef]] = {}
            for r in foreign:
                groups.setdefault(partition_of(r.task_id, partitions), []).append(r)
            for p, group in groups.items():
                for data in stored.encode(p, group):
                    await sender.publish(stored.subject(p), data)
                    messages += 1
        else:
            for data in stored.encode(0, foreign):
                await sender.publish(ONE_SUBJECT, data)
                messages += 1
        before = len(done)
        await asyncio.sleep(0.01)
        latencies.extend(done[before:])
    for nc in conns:
        await nc.flush()
    async with asyncio.timeout(5):
        while pending:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    cpu = time.process_time() - began_cpu
    for nc in conns:
        await nc.close()
    ms = sorted(x * 1000 for x in done)
    return {
        "cpu_us_per_task": cpu / noticed * 1e6,
        "messages_per_batch": messages / batches,
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[int(len(ms) * 0.99) - 1],
    }


async def main(args: argparse.Namespace) -> None:
    with servers(postgres=False) as env:
        print(f"P = {args.partitions}, {args.engines} engines, {args.batches} batches each")
        print("layout         batch  cpu us/task  msgs/batch  p50 ms  p99 ms")
        for size in args.sizes:
            for layout in ("per_partition", "one_subject"):
                runs = [
                    await run(
                        env.nats_url, layout, args.partitions, args.engines, size, args.batches
                    )
                    for _ in range(3)
                ]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                print(
                    f"{layout:<14} {size:>5}  {med['cpu_us_per_task']:>11.1f}"
                    f"  {med['messages_per_batch']:>10.1f}  {med['p50_ms']:>6.2f}"
                    f"  {med['p99_ms']:>6.2f}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 200, 1000])
    asyncio.run(main(parser.parse_args()))
