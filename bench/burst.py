"""Burst: N tasks (default 100,000) all due at the same instant T; how fast do they drain?

The tasks are published ahead of time (T = now + lead, long enough for the daemon to commit them
all) and a live JetStream consumer on the target stream times each arrival. Drain rate =
N / (last arrival - T). Baseline, same run, after the daemon has stopped: the daemon's own publish
path (`Publisher` from `scheduler.bus`, pipelined, with `Nats-Msg-Id`, no PostgreSQL) pushing the
same pre-built messages with the same headers; if it cannot be imported, the bench's own pipeline
(core publish + one wildcard reply inbox, 1,000 in flight), and the JSON says which one ran.
Targets: >= 25,000/s (issue 3) and >= 1/2 of the baseline (issue 19; issue 3 asked 1/3).

    .venv/bin/python bench/burst.py [--count 100000] [--lead S] [--baseline-only]
    [--own-publisher] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import time
import uuid
from typing import Any

import nats
from common import CpuWindow, Daemon, Env, add_target_stream, report, run, servers
from rawnats import RawCollector
from traffic import Pipeline, envelope, iso_ms

Msg3 = tuple[str, bytes, dict[str, str]]

PROFHOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profhook")


def build(count: int, due: float) -> list[tuple[str, bytes]]:
    prefix, now = uuid.uuid4().hex[:8], time.time()
    return [(f"{prefix}-{i}", envelope(f"{prefix}-{i}", due, now)) for i in range(count)]


async def baseline(
    nc: Any, tasks: list[tuple[str, bytes]], due: float, own: bool = False
) -> dict[str, Any]:
    """The same messages with the daemon's delivery headers, through the daemon's publisher."""
    await nc.jetstream().add_stream(name="BASE", subjects=["base.>"], duplicate_window=120)
    fired = iso_ms(time.time())
    items: list[Msg3] = [
        (
            "base.x",
            body,
            {
                "Nats-Msg-Id": task_id,
                "Mq-Scheduled-For": iso_ms(due),
                "Mq-Fired-At": fired,
                "Mq-Attempt": "1",
            },
        )
        for task_id, body in tasks
    ]
    publisher_cls, which = (None, "") if own else daemon_publisher()
    which = which or "bench Pipeline (core publish + reply inbox, 1000 in flight)"
    start = time.perf_counter()
    if publisher_cls is not None:
        publisher = await publisher_cls(nc).start()
        results = await publish_many(publisher, items)
        await publisher.close()
        acked = sum(1 for r in results if not isinstance(r, Exception))
    else:
        pipe = await Pipeline(nc).start()
        for item in items:
            await pipe.publish(*item)
        acked = (await pipe.drain())["acked"]
    seconds = time.perf_counter() - start
    rate = round(acked / seconds)
    return {"publisher": which, "acked": acked, "seconds": round(seconds, 3), "rate": rate}


def daemon_publisher() -> tuple[Any, str]:
    """The daemon's pipelined publisher class, wherever the engine keeps it, or (None, "")."""
    for module in ("scheduler.bus.nats.publisher", "scheduler.bus.nats.connection"):
        try:
            return importlib.import_module(module).Publisher, f"{module}.Publisher"
        except (ImportError, AttributeError):
            continue
    return None, ""


async def publish_many(publisher: Any, items: list[Any]) -> list[Any]:
    """Publish all `items` pipelined through the daemon's publisher and return, in order, a
    PubAck or the exception each ended with."""
    futures = [await publisher.publish(*item) for item in items]
    results: list[Any] = []
    for fut in futures:
        try:
            results.append(await fut)
        except Exception as exc:  # a PublishError: counted as not acked by the caller
            results.append(exc)
    return results


async def intake_drained(js: Any, deadline: float) -> float | None:
    """Seconds until MQ_DELAY (work queue) is empty, or None if `deadline` passes first."""
    start = time.time()
    while time.time() < deadline:
        if (await js.stream_info("MQ_DELAY")).state.messages == 0:
            return time.time() - start
        await asyncio.sleep(0.1)
    return None


async def ours(
    env: Env, tasks: list[tuple[str, bytes]], due: float, profile: str | None = None
) -> dict[str, Any]:
    nc = await nats.connect(env.nats_url)
    daemon = Daemon(env)
    if profile:  # cProfile in the daemon from intake done to the last arrival (profhook/)
        daemon.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (PROFHOOK, daemon.env.get("PYTHONPATH")) if p
        )
        daemon.env["MQS_PROFILE"] = profile
    try:
        js = nc.jetstream()
        await add_target_stream(js)
        daemon.start()
        collector = await RawCollector(env.nats_url, js, "BENCH", "mq.bench.>").start()
        pipe = await Pipeline(nc).start()
        t0 = time.time()
        for task_id, body in tasks:
            await pipe.publish("mq.delay.bench.x", body, {"Nats-Msg-Id": task_id})
        producer = await pipe.drain()
        publish_s = time.time() - t0
        intake_s = await intake_drained(js, due)
        window = CpuWindow(daemon)  # intake is done: from here on the daemon only fires
        if profile:
            os.kill(daemon.pid, signal.SIGUSR1)
        complete = await collector.wait_for(len(tasks), due + 60 - time.time())
        if profile:
            os.kill(daemon.pid, signal.SIGUSR2)
            await asyncio.sleep(1.0)  # let it write the stats
        cores = window.finish()
        cpu = cores["cpu_seconds"]["daemon"]
        waited = time.time() - due  # the CPU figures span the wait for T too (idle, a few s)
        await collector.stop()
    finally:
        daemon.stop()
        await nc.close()
    summary = collector.summary(len(tasks))
    last_s = summary["lateness_ms"].get("max", float("nan")) / 1000
    last_store_s = summary["store_lateness_ms"].get("max", float("nan")) / 1000
    return summary | {
        "complete": complete,
        "drain_seconds": round(last_s, 3),
        "drain_rate": round(summary["distinct"] / last_s) if last_s > 0 else 0,
        "drain_rate_store_time": round(summary["distinct"] / last_store_s) if last_s > 0 else 0,
        "first_after_due_ms": summary["lateness_ms"].get("min"),
        "daemon_cpu_us_per_task": round(cpu / max(len(tasks), 1) * 1e6, 1),
        # from intake done to the last arrival: who used the two cores while the burst drained
        "cores": cores,
        "after_due_wall_seconds": round(waited, 2),
        "publish_seconds": round(publish_s, 2),
        "intake_seconds_after_publish": None if intake_s is None else round(intake_s, 2),
        "intake_done_before_due": intake_s is not None,
        "producer": producer,
    }


async def measure(
    count: int, lead: float, baseline_only: bool, own: bool, profile: str | None = None
) -> dict[str, Any]:
    with servers(postgres=not baseline_only) as env:
        due = time.time() + lead
        tasks = build(count, due)
        r = {} if baseline_only else {"ours": await ours(env, tasks, due, profile)}
        nc = await nats.connect(env.nats_url)
        try:
            r["baseline"] = await baseline(nc, tasks, due, own)
        finally:
            await nc.close()
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--lead", type=float, default=None, help="s from start to T")
    ap.add_argument("--baseline-only", action="store_true", help="only the publish baseline")
    ap.add_argument("--own-publisher", action="store_true", help="baseline: bench's pipeline")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", default=None, help="cProfile the daemon's drain into FILE")
    a = ap.parse_args()
    if a.profile:
        a.profile = os.path.abspath(a.profile)
    lead = a.lead if a.lead is not None else 10 + a.count / 10_000
    r = run(measure(a.count, lead, a.baseline_only, a.own_publisher, a.profile))
    base = r["baseline"]
    params = {"count": a.count, "lead": lead, "baseline_only": a.baseline_only}
    params["own_publisher"] = a.own_publisher
    targets = {"drain_rate_min": 25_000, "ratio_to_baseline_min": 0.5}
    if a.baseline_only:
        line = f"baseline {base['publisher']}: {base['acked']} at {base['rate']}/s"
        report("burst", params, r, targets, base["acked"] == a.count, line, a.out)
        return
    o = r["ours"]
    r["ratio_to_baseline"] = ratio = round(o["drain_rate"] / max(base["rate"], 1), 3)
    passed = bool(
        o["complete"]
        and o["duplicates"] == 0
        and o["lateness_ms"].get("early", 1) == 0
        and o["drain_rate"] >= 25_000
        and ratio >= 0.5
    )
    report(
        "burst",
        params,
        r,
        targets,
        passed,
        f"{o['distinct']}/{a.count} due at once drained at {o['drain_rate']}/s in "
        f"{o['drain_seconds']} s (early {o['lateness_ms'].get('early')}, dup {o['duplicates']}); "
        f"baseline {base['rate']}/s, ratio {ratio}; daemon {o['daemon_cpu_us_per_task']} us "
        f"CPU/task; intake done before T: {o['intake_done_before_due']}",
        a.out,
    )


if __name__ == "__main__":
    main()
