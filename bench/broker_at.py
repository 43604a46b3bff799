"""Baseline: the broker's own scheduler (`Nats-Schedule: @at`) under the accuracy benchmark's load.

A stream with `allow_msg_schedules` on `sched.bench.>`; task n is published to its own schedule
subject `sched.bench.s.<n>` (one schedule per subject) with `Nats-Schedule: @at <due>` and
`Nats-Schedule-Target: sched.bench.t.<n>`. Publishing is paced at `rate`/s for `duration` s, each
task due `delay` s after its publish instant, so due instants are spread evenly. Lateness is the
arrival at a JetStream consumer on `sched.bench.t.>` minus the envelope's `delay_until` (a core
subscriber never sees fired messages).

    .venv/bin/python bench/broker_at.py [--rate 5000] [--duration 10] [--delay 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import nats
from common import report, run, servers
from nats.js.api import StorageType, StreamConfig
from rawnats import RawCollector, RawProducer
from traffic import Item, envelope, first_instant, iso_ms

STREAM = "BENCH_SCHED"


def schedule_items(rate: float, duration: float, delay: float) -> list[Item]:
    """One `@at` schedule per task, on its own subject, targeting its own literal subject."""
    prefix, start = uuid.uuid4().hex[:8], first_instant(int(rate * duration))
    items: list[Item] = []
    for i in range(int(rate * duration)):
        at = start + i / rate
        due = at + delay
        headers = {
            "Nats-Schedule": f"@at {iso_ms(due)}",
            "Nats-Schedule-Target": f"sched.bench.t.{i}",
        }
        items.append((at, f"sched.bench.s.{i}", envelope(f"{prefix}-{i}", due, at), headers))
    return items


async def run_broker_at(
    nats_url: str, rate: float, duration: float, delay: float, grace: float = 15.0
) -> dict[str, Any]:
    """Drive the broker's `@at` scheduling on `nats_url` and measure lateness; cleans up after."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name=STREAM,
                subjects=["sched.bench.>"],
                storage=StorageType.FILE,
                allow_msg_schedules=True,
            )
        )
        try:
            collector = await RawCollector(nats_url, js, STREAM, "sched.bench.t.>").start()
            producer_conn = await RawProducer(nats_url).start()
            items = schedule_items(rate, duration, delay)
            last_due = items[-1][0] + delay if items else time.time()
            producer = await producer_conn.produce(items)
            complete = await collector.wait_for(len(items), last_due + grace - time.time())
            await collector.stop()
            await producer_conn.close()
        finally:
            await js.delete_stream(STREAM)
    finally:
        await nc.close()
    return collector.summary(len(items)) | {"complete": complete, "producer": producer}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=5000)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--delay", type=float, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    async def go() -> dict[str, Any]:
        with servers(postgres=False) as env:
            return await run_broker_at(env.nats_url, a.rate, a.duration, a.delay)

    r = run(go())
    lat = r["lateness_ms"]
    report(
        "broker_at",
        {k: v for k, v in vars(a).items() if k != "out"},
        r,
        {"note": "baseline only; field notes on 2.15.1: p50 ~210 ms, p99 ~345 ms"},
        bool(r["complete"] and r["duplicates"] == 0),
        f"broker @at {r['distinct']}/{r['expected']} delivered, lateness p50 {lat.get('p50')} "
        f"p99 {lat.get('p99')} max {lat.get('max')} ms, early {lat.get('early')}",
        a.out,
    )


if __name__ == "__main__":
    main()
