"""Burst: N tasks (default 100,000) all due at the same instant T; how fast do they drain?

Drain rate = N / (store time of the last delivery - T). Baseline, same run: the daemon's own
publish path (`scheduler.bus.publisher.Publisher`, pipelined, with Nats-Msg-Id, no PostgreSQL)
pushing the same pre-built messages. Targets (issue 3): >= 25,000/s and >= 1/3 of the baseline.

    .venv/bin/python bench/burst.py [--count 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

import nats
from common import Daemon, envelope, read_back, report, run, servers

from scheduler.bus.publisher import Publisher


async def wait_drained(js, stream: str, consumer: str, timeout: float) -> float:
    """Seconds until the intake consumer has nothing pending or unacked."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        info = await js.consumer_info(stream, consumer)
        if info.num_pending == 0 and info.num_ack_pending == 0:
            return time.monotonic() - start
        await asyncio.sleep(0.1)
    raise TimeoutError("intake did not drain")


async def measure(count: int) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        js = nc.jetstream()
        await js.add_stream(name="BENCH", subjects=["mq.bench.>"], duplicate_window=120)
        await js.add_stream(name="BASE", subjects=["base.>"], duplicate_window=120)
        daemon = Daemon(env).start()
        try:
            due = datetime.now(UTC) + timedelta(seconds=max(20, count / 5000))
            bodies = [envelope(due) for _ in range(count)]
            for task_id, body in bodies:
                await nc.publish("mq.delay.bench.x", body, headers={"Nats-Msg-Id": task_id})
            await nc.flush()
            intake_s = await wait_drained(js, "MQ_DELAY", "scheduler-intake", 120)
            await asyncio.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds()) + 2)
            msgs = await read_back(env.nats_url, "BENCH")
            while len(msgs) < count and (datetime.now(UTC) - due).total_seconds() < 60:
                await asyncio.sleep(1)
                msgs = await read_back(env.nats_url, "BENCH")
        finally:
            daemon.stop()
        last = max(m.metadata.timestamp for m in msgs)
        first = min(m.metadata.timestamp for m in msgs)
        drain_s = (last - due).total_seconds()
        publisher = await Publisher(nc).start()
        start = time.perf_counter()
        results = await publisher.publish_many(
            [("base.x", body, {"Nats-Msg-Id": f"b{task_id}"}) for task_id, body in bodies]
        )
        base_s = time.perf_counter() - start
        await publisher.close()
        await nc.close()
    ok = sum(1 for r in results if not isinstance(r, Exception))
    return {
        "count": count,
        "delivered": len(msgs),
        "duplicates": len(msgs) - len({m.headers["Nats-Msg-Id"] for m in msgs}),
        "early": sum(1 for m in msgs if m.metadata.timestamp < due),
        "first_after_due_ms": round((first - due).total_seconds() * 1000, 1),
        "drain_seconds": round(drain_s, 3),
        "drain_rate": round(count / drain_s),
        "intake_seconds": round(intake_s, 2),
        "intake_rate": round(count / intake_s),
        "baseline_publish_rate": round(ok / base_s),
        "baseline_acked": ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=100_000)
    a = ap.parse_args()
    r = run(measure(a.count))
    ratio = round(r["drain_rate"] / r["baseline_publish_rate"], 2)
    r["ratio_to_baseline"] = ratio
    passed = (
        r["drain_rate"] >= 25_000
        and ratio >= 1 / 3
        and r["delivered"] == a.count
        and r["early"] == 0
    )
    report(
        "burst",
        vars(a),
        r,
        {"drain_rate_min": 25_000, "ratio_min": 0.333},
        passed,
        f"{r['delivered']} due at once drained at {r['drain_rate']}/s "
        f"(baseline publish {r['baseline_publish_rate']}/s, ratio {ratio}); "
        f"intake {r['intake_rate']}/s",
    )


if __name__ == "__main__":
    main()
