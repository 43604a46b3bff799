"""Fairness: org A floods N tasks (default 200,000) due at one instant T; org B schedules M
(1,000) due evenly over [T, T + 1 s]. How late is B while A drains, fair firing against FIFO?

Both modes run in the same invocation, on the same nats-server and PostgreSQL, one after the
other with a fresh daemon each (`SCHEDULER_FAIR_FIRING=false` first: today's FIFO order; then
`true`). Each mode publishes its tasks ahead of time (T = now + lead, long enough for the daemon
to commit them all), each org to its own target subject (`mq.bench.<mode>.a` / `.b`), and two
raw-socket push consumers time every arrival. Reported per mode and org: p50/p99/max lateness,
A's drain rate (N / (A's last arrival - T)), and who used the two cores from intake done to the
last arrival (daemon, nats-server, postgres, the bench), and a trace of B's tasks from their rows
(`b_trace`: claimed how long before due, acknowledged how long after). Target (issue 18): with
fair firing,
B's p99 lateness <= 50 ms while A drains.

    .venv/bin/python bench/fairness.py [--a 200000] [--b 1000] [--shares a=1,b=1]
    [--modes fifo,fair] [--lead S] [--out FILE]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import asyncpg
import nats
from burst import intake_drained
from common import CpuWindow, Daemon, Env, add_target_stream, report, run, servers
from rawnats import RawCollector
from traffic import Pipeline, iso_ms, stats

B_SPREAD = 1.0  # B's tasks are due evenly over this many seconds from T


def envelope(task_id: str, org: str, due: float, now: float) -> bytes:
    """A valid `hanzo.mq.v1` envelope with an `org_id`."""
    return (
        f'{{"schema":"hanzo.mq.v1","id":"{task_id}","type":"bench.task","source":"bench",'
        f'"org_id":"{org}","timestamp":"{iso_ms(now)}","priority":5,'
        f'"delay_until":"{iso_ms(due)}","data":{{"n":1}}}}'
    ).encode()


def build(mode: str, a: int, b: int, due: float) -> list[tuple[str, str, bytes]]:
    """(lane subject, id, body): A's all at `due`, B's spread over B_SPREAD, interleaved so
    B's are published among A's, not after them."""
    prefix, now = uuid.uuid4().hex[:6], time.time()
    a_items = [
        (f"mq.delay.bench.{mode}.a", f"{prefix}-a-{i}", envelope(f"{prefix}-a-{i}", "a", due, now))
        for i in range(a)
    ]
    b_items = []
    for i in range(b):
        at = due + B_SPREAD * i / max(b, 1)
        body = envelope(f"{prefix}-b-{i}", "b", at, now)
        b_items.append((f"mq.delay.bench.{mode}.b", f"{prefix}-b-{i}", body))
    step = max(a // max(b, 1), 1)
    out: list[tuple[str, str, bytes]] = []
    for i, item in enumerate(a_items):
        out.append(item)
        if i % step == 0 and b_items:
            out.append(b_items.pop(0))
    return out + b_items


async def one_mode(env: Env, mode: str, a: int, b: int, lead: float, shares: str) -> dict:
    nc = await nats.connect(env.nats_url)
    settings = {"fair_firing": "true" if mode == "fair" else "false"}
    if shares:
        settings["org_shares"] = shares
    daemon = Daemon(env, **settings)
    try:
        js = nc.jetstream()
        daemon.start()
        col_a = await RawCollector(env.nats_url, js, "BENCH", f"mq.bench.{mode}.a").start()
        col_b = await RawCollector(env.nats_url, js, "BENCH", f"mq.bench.{mode}.b").start()
        due = time.time() + lead
        items = build(mode, a, b, due)
        pipe = await Pipeline(nc).start()
        t0 = time.time()
        for subject, task_id, body in items:
            await pipe.publish(subject, body, {"Nats-Msg-Id": task_id})
        producer = await pipe.drain()
        publish_s = time.time() - t0
        intake_s = await intake_drained(js, due)
        window = CpuWindow(daemon)
        done_a = await col_a.wait_for(a, due + 120 - time.time())
        # B's last arrive 1 s after T, or (FIFO) right behind A's last: 10 s more either way
        done_b = await col_b.wait_for(b, max(due + 10 - time.time(), 10))
        cores = window.finish()
        await col_a.stop()
        await col_b.stop()
        cpu = cores["cpu_seconds"]["daemon"]
        lateness = daemon.histogram("mq_scheduler_dispatch_lateness_seconds")
        trace = await trace_b(env, f"mq.bench.{mode}.b")
        loop_lag = daemon.histogram("mq_scheduler_event_loop_lag_seconds")
        log_tail = "" if done_a and done_b else daemon.log_tail()
    finally:
        daemon.stop()
        await nc.close()
    sa, sb = col_a.summary(a), col_b.summary(b)
    last_a = (col_a.last_arrival - due) if col_a.last_arrival else float("nan")
    # B's arrivals come in due order: its lateness per tenth of its second shows when it waited
    tenth = max(len(col_b.late_ms) // 10, 1)
    b_by_tenth = [
        round(max(col_b.late_ms[i : i + tenth]), 1) for i in range(0, len(col_b.late_ms), tenth)
    ]
    return {
        "complete": done_a and done_b,
        "b_max_lateness_ms_per_tenth": b_by_tenth,
        "a": sa,
        "b": sb,
        "a_drain_seconds": round(last_a, 3),
        "a_drain_rate": round(sa["distinct"] / last_a) if last_a > 0 else 0,
        "daemon_cpu_us_per_task": round(cpu / max(a + b, 1) * 1e6, 1),
        "cores": cores,
        "daemon_dispatch_lateness": lateness,
        "b_trace": trace,
        "daemon_event_loop_lag": loop_lag,
        "publish_seconds": round(publish_s, 2),
        "intake_seconds_after_publish": None if intake_s is None else round(intake_s, 2),
        "intake_done_before_due": intake_s is not None,
        "producer": producer,
        **({"daemon_log_tail": log_tail} if log_tail else {}),
    }


async def trace_b(env: Env, target: str) -> dict[str, Any]:
    """How late B's tasks were acknowledged, from the fire log (a fired task's row is deleted,
    so how long before its due time it was claimed is no longer stored): the daemon's clock at
    the PubAck against the due time, for the tasks acked more than 50 ms late and for all."""
    conn = await asyncpg.connect(env.database_url)
    try:
        rows = await conn.fetch(
            "SELECT extract(epoch FROM fired_at - scheduled_for) * 1000 AS late FROM fire_log "
            "WHERE kind = 'delayed' AND subject = $1",
            target,
        )
    finally:
        await conn.close()
    return {
        "acked_over_50ms": sum(1 for r in rows if r["late"] > 50),
        "ack_lateness_ms": stats([float(r["late"]) for r in rows], early=False),
    }


async def measure(a: int, b: int, lead: float, shares: str, modes: list[str]) -> dict:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        try:
            await add_target_stream(nc.jetstream())
        finally:
            await nc.close()
        return {mode: await one_mode(env, mode, a, b, lead, shares) for mode in modes}


def _p(s: dict[str, Any], q: str) -> Any:
    return s["lateness_ms"].get(q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", type=int, default=200_000, help="org A's tasks, due at one instant")
    ap.add_argument("--b", type=int, default=1_000, help="org B's tasks, spread over 1 s")
    ap.add_argument("--shares", default="", help="SCHEDULER_ORG_SHARES, e.g. a=1,b=1")
    ap.add_argument("--modes", default="fifo,fair")
    ap.add_argument("--lead", type=float, default=None, help="s from publishing to T")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    lead = args.lead if args.lead is not None else 10 + (args.a + args.b) / 10_000
    modes = [m for m in args.modes.split(",") if m]
    r = run(measure(args.a, args.b, lead, args.shares, modes))
    params = {"a": args.a, "b": args.b, "b_spread_s": B_SPREAD, "lead": lead}
    params |= {"shares": args.shares, "modes": modes}
    targets = {"fair_b_p99_ms_max": 50}
    fair = r.get("fair")
    passed = bool(
        fair
        and all(m["complete"] for m in r.values())
        and all(m[o]["duplicates"] == 0 for m in r.values() for o in ("a", "b"))
        and all(m[o]["lateness_ms"].get("early", 1) == 0 for m in r.values() for o in ("a", "b"))
        and _p(fair["b"], "p99") <= 50
    )
    parts = []
    for mode, m in r.items():
        parts.append(
            f"{mode}: B p50/p99 {_p(m['b'], 'p50')}/{_p(m['b'], 'p99')} ms, "
            f"A p50/p99 {_p(m['a'], 'p50')}/{_p(m['a'], 'p99')} ms, A drained at "
            f"{m['a_drain_rate']}/s, daemon {m['daemon_cpu_us_per_task']} us CPU/task"
        )
    report("fairness", params, r, targets, passed, "; ".join(parts), args.out)


if __name__ == "__main__":
    main()
