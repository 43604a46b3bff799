"""Accuracy: tasks published at R/s for D s, each due `delay` s after publishing, spread evenly.

Ours: the daemon (subprocess, fresh NATS + PostgreSQL) takes them off the delay lane and
delivers them to stream BENCH. Baseline, same run, same NATS server, same load: the broker's own
scheduler (`Nats-Schedule: @at`, see broker_at.py), measured first while the daemon is not yet
running. Lateness = arrival at a live JetStream consumer minus the envelope's `delay_until`.
Targets (issue 3): ours p50 <= 5 ms, p99 <= 25 ms, none early, none lost or doubled;
ours p99 x 10 <= broker p99.

    .venv/bin/python bench/accuracy.py [--rate 5000] [--duration 60] [--delay 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

import nats
from broker_at import run_broker_at
from common import CpuWindow, Daemon, add_target_stream, report, run, servers
from rawnats import RawCollector, RawProducer
from traffic import delay_items


async def run_ours(
    env: Any,
    rate: float,
    duration: float,
    delay: float,
    grace: float = 15.0,
    extra: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Drive the daemon with the paced load; bounded wait for every delivery. `extra` names
    more processes (by pid) whose CPU the window reports, e.g. contended.py's busy loop."""
    nc = await nats.connect(env.nats_url)
    daemon = Daemon(env)
    try:
        js = nc.jetstream()
        await add_target_stream(js)
        daemon.start()
        collector = await RawCollector(env.nats_url, js, "BENCH", "mq.bench.>").start()
        producer_conn = await RawProducer(env.nats_url).start()
        items = delay_items(uuid.uuid4().hex[:8], rate, duration, delay)
        last_due = items[-1][0] + delay if items else time.time()
        window = CpuWindow(daemon, extra)
        producer = await producer_conn.produce(items)
        complete = await collector.wait_for(len(items), last_due + grace - time.time())
        cores = window.finish()
        cpu = cores["cpu_seconds"]["daemon"]
        rss = daemon.rss_mb()
        inside = {
            "dispatch_lateness_ms": daemon.histogram("mq_scheduler_dispatch_lateness_seconds"),
            "event_loop_lag_ms": daemon.histogram("mq_scheduler_event_loop_lag_seconds"),
        }
        await collector.stop()
        await producer_conn.close()
    finally:
        daemon.stop()
        await nc.close()
    if not complete:
        print(
            f"accuracy: only {len(collector.ids)} of {len(items)} tasks delivered within "
            f"{grace:.0f} s after the last due time; is the daemon delivering? "
            f"daemon log: {daemon.log_tail()}",
            file=sys.stderr,
        )
    per_task = {k: round(v / max(len(items), 1) * 1e6, 1) for k, v in cores["cpu_seconds"].items()}
    return collector.summary(len(items)) | {
        "complete": complete,
        "daemon_cpu_us_per_task": round(cpu / max(len(items), 1) * 1e6, 1),
        # who used the two cores from the first publish to the last arrival, per task
        "cpu_us_per_task": per_task,
        # what the scheduler costs, the load generator (and any `extra`) apart (issue 19)
        "cpu_us_per_task_daemon_nats_pg": round(
            sum(per_task.get(k, 0.0) for k in ("daemon", "nats-server", "postgres")), 1
        ),
        "cores": cores,
        "daemon_rss_mb": round(rss),
        "daemon_histograms": inside,
        "producer": producer,
    }


async def measure(rate: float, duration: float, delay: float) -> dict[str, Any]:
    with servers() as env:
        window = CpuWindow(None, env=env)  # the broker's scheduler: nats-server's CPU
        broker = await run_broker_at(env.nats_url, rate, duration, delay)
        cores = window.finish()
        count = max(broker.get("expected", 0), 1)
        broker["cores"] = cores
        broker["cpu_us_per_task"] = {
            k: round(v / count * 1e6, 1) for k, v in cores["cpu_seconds"].items() if k != "postgres"
        }
        ours = await run_ours(env, rate, duration, delay)
    return {"ours": ours, "broker_at": broker}


def p99_ratio(ours: dict[str, Any], broker: dict[str, Any]) -> float:
    """The broker's `@at` lateness p99 over ours (0 when ours delivered nothing)."""
    m, b = ours["lateness_ms"], broker["lateness_ms"]
    return round(b.get("p99", 0) / max(m.get("p99", 0), 0.01), 1) if m.get("count") else 0.0


def clean(ours: dict[str, Any]) -> bool:
    """Every task delivered, none twice, none before its due time."""
    lat = ours["lateness_ms"]
    return bool(
        ours["complete"] and ours["missing"] == 0 and ours["duplicates"] == 0
        and lat.get("early", 1) == 0
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=5000)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--delay", type=float, default=2)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    r = run(measure(a.rate, a.duration, a.delay))
    ours, broker = r["ours"], r["broker_at"]
    m, b = ours["lateness_ms"], broker["lateness_ms"]
    r["broker_p99_over_ours"] = ratio = p99_ratio(ours, broker)
    passed = clean(ours) and m.get("p50", 1e9) <= 5 and m.get("p99", 1e9) <= 25 and ratio >= 10
    report(
        "accuracy",
        {k: v for k, v in vars(a).items() if k != "out"},
        r,
        {"p50_ms": 5, "p99_ms": 25, "early": 0, "missing": 0, "duplicates": 0, "p99_ratio": 10},
        passed,
        f"ours {ours['distinct']}/{ours['expected']} p50 {m.get('p50')} p99 {m.get('p99')} ms "
        f"early {m.get('early')} dup {ours['duplicates']}; broker @at p50 {b.get('p50')} "
        f"p99 {b.get('p99')} ms; broker/ours p99 {ratio}x",
        a.out,
    )


if __name__ == "__main__":
    main()
