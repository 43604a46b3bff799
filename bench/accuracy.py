"""Accuracy: tasks published at R/s for D s, each due `delay` s after publishing, spread evenly.

Ours: the daemon delivers from the delay lane. Baseline, same run, same load: the broker's own
scheduler (`Nats-Schedule: @at`, a stream with allow_msg_schedules, one schedule subject per
task). Lateness = JetStream store time of the delivered message minus its due time.
Targets (issue 3): ours p50 <= 5 ms, p99 <= 25 ms, none early; ours p99 x 10 <= broker p99.

    .venv/bin/python bench/accuracy.py [--rate 5000] [--duration 60] [--delay 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime

import nats
from common import (
    Daemon,
    delay_until_of,
    envelope,
    lateness_ms,
    paced_publish,
    read_back,
    report,
    run,
    servers,
    stats,
)
from nats.js.api import StreamConfig


def schedule(
    rate: int, duration: float, delay: float, start: float
) -> list[tuple[float, datetime]]:
    n = int(rate * duration)
    return [
        (start + i / rate, datetime.fromtimestamp(start + i / rate + delay, UTC)) for i in range(n)
    ]


async def ours(rate: int, duration: float, delay: float) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        await nc.jetstream().add_stream(name="BENCH", subjects=["mq.bench.>"], duplicate_window=120)
        daemon = Daemon(env).start()
        try:
            plan = schedule(rate, duration, delay, time.time() + 1)
            items = []
            for at, due in plan:
                task_id, body = envelope(due)
                items.append((at, "mq.delay.bench.x", body, {"Nats-Msg-Id": task_id}))
            cpu0 = daemon.cpu_seconds()
            lag = await paced_publish(nc, items)
            await asyncio.sleep(delay + 2)
            cpu = daemon.cpu_seconds() - cpu0
            msgs = await read_back(env.nats_url, "BENCH")
        finally:
            daemon.stop()
            await nc.close()
    lat = stats(lateness_ms(msgs, delay_until_of))
    return {
        "lateness_ms": lat,
        "sent": len(plan),
        "delivered": len(msgs),
        "duplicates": len(msgs) - len({m.headers["Nats-Msg-Id"] for m in msgs}),
        "daemon_cpu_us_per_task": round(cpu / max(len(plan), 1) * 1e6, 1),
        "producer_max_lag_ms": round(lag * 1000, 1),
    }


async def broker(rate: int, duration: float, delay: float) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(name="SCHED", subjects=["sched.>"], allow_msg_schedules=True)
        )
        plan = schedule(rate, duration, delay, time.time() + 1)
        items = []
        for i, (at, due) in enumerate(plan):
            stamp = due.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            headers = {"Nats-Schedule": f"@at {stamp}", "Nats-Schedule-Target": f"sched.t.{i}"}
            items.append((at, f"sched.s.{i}", envelope(due)[1], headers))
        lag = await paced_publish(nc, items)
        await asyncio.sleep(delay + 3)
        msgs = await read_back(env.nats_url, "SCHED", "sched.t.>")
        await nc.close()
    return {
        "lateness_ms": stats(lateness_ms(msgs, delay_until_of)),
        "sent": len(plan),
        "delivered": len(msgs),
        "producer_max_lag_ms": round(lag * 1000, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--delay", type=float, default=2)
    a = ap.parse_args()
    mine = run(ours(a.rate, a.duration, a.delay))
    theirs = run(broker(a.rate, a.duration, a.delay))
    m, t = mine["lateness_ms"], theirs["lateness_ms"]
    ratio = round(t.get("p99", 0) / max(m.get("p99", 1e-9), 1e-9), 1)
    passed = (
        m.get("p50", 1e9) <= 5
        and m.get("p99", 1e9) <= 25
        and m.get("early", 1) == 0
        and mine["delivered"] == mine["sent"]
        and ratio >= 10
    )
    report(
        "accuracy",
        vars(a),
        {"ours": mine, "broker_at": theirs, "broker_p99_over_ours": ratio},
        {"p50_ms": 5, "p99_ms": 25, "early": 0, "p99_ratio_min": 10},
        passed,
        f"ours p50 {m.get('p50')} p99 {m.get('p99')} ms early {m.get('early')}; "
        f"broker @at p50 {t.get('p50')} p99 {t.get('p99')} ms; ratio {ratio}x",
    )


if __name__ == "__main__":
    main()
