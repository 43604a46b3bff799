"""Read crowd: delivery lateness with and without operators hammering the management API.

One daemon (fresh nats-server and PostgreSQL) holds P (200,000) pending tasks due an hour to a
day ahead (COPYed into `delayed_messages`, target `mq.far.x`, none falls due during the run),
and takes a steady stream of due tasks: R/s (500) for D s (30), each due `delay` (2 s) after its
publish instant, through the delay lane (raw-socket producer, as accuracy.py). Two phases in
one run, on the same daemon: first without the crowd (`quiet`, target `mq.bench.quiet`), then
the same load while C (24) read-token clients loop `GET /v1/delayed?status=pending&limit=500`
and T (3) console tabs poll the overview's five API calls every 5 s (`crowd`, target
`mq.bench.crowd`). The crowd runs in a child process (`--crowd-only`) so its HTTP work does not
slow the producer's pacing; a client honours `Retry-After` on a 503 as a well-behaved client
does. Lateness is the JetStream store time of the delivery minus its due time. Reported: p50/p99
per phase, their ratio, the crowd's answers by status (200/503/...) and requests per second,
each process's share of a core. Target (issue 25): crowd p99 <= 2x quiet p99, nothing lost,
doubled or early.

    .venv/bin/python bench/read_crowd.py [--pending 200000] [--rate 500] [--duration 30]
    [--delay 2] [--clients 24] [--tabs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import nats
from common import CpuWindow, Daemon, Env, add_target_stream, report, run, servers
from rawnats import RawCollector, RawProducer
from scale import COLUMNS
from traffic import Item, envelope, first_instant

from scheduler.daemon import migrate

TOKEN = "bench-read-token"
LIST = "/v1/delayed?status=pending&limit=500"
OVERVIEW = ["/v1/stats", "/v1/instances", "/readyz", "/v1/leader", "/v1/schedules?limit=1"]


async def fill_far(dsn: str, count: int, chunk: int = 100_000) -> float:
    """`count` pending rows due 1 h to 1 day ahead (none fires during the run); seconds taken."""
    t0 = time.time()
    await migrate.upgrade_async(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        for start in range(0, count, chunk):
            rows = []
            for i in range(start, min(start + chunk, count)):
                due = t0 + 3600 + random.random() * 86_400
                at = datetime.fromtimestamp(due, UTC)
                body = envelope(f"far{i}", due, t0)
                rows.append((f"far{i}", "mq.far.x", body, "{}", 5, at, at, None, "pending"))
            await conn.copy_records_to_table("delayed_messages", records=rows, columns=COLUMNS)
        await conn.execute("ANALYZE delayed_messages")
    finally:
        await conn.close()
    return time.time() - t0


def due_items(phase: str, rate: float, duration: float, delay: float) -> list[Item]:
    """Tasks published to `mq.delay.bench.<phase>` at `rate`/s, each due `delay` s after."""
    prefix, start = f"{phase}-{uuid.uuid4().hex[:6]}", first_instant(int(rate * duration))
    items: list[Item] = []
    for i in range(int(rate * duration)):
        at, task_id = start + i / rate, f"{prefix}-{i}"
        body = envelope(task_id, at + delay, at)
        items.append((at, f"mq.delay.bench.{phase}", body, {"Nats-Msg-Id": task_id}))
    return items


async def run_phase(
    env: Env, daemon: Daemon, phase: str, rate: float, duration: float, delay: float
) -> dict[str, Any]:
    """Publish the phase's load and wait (bounded) for every delivery; lateness and cores."""
    nc = await nats.connect(env.nats_url)
    try:
        js = nc.jetstream()
        collector = await RawCollector(env.nats_url, js, "BENCH", f"mq.bench.{phase}").start()
        producer_conn = await RawProducer(env.nats_url).start()
        items = due_items(phase, rate, duration, delay)
        window = CpuWindow(daemon)
        producer = await producer_conn.produce(items)
        last_due = items[-1][0] + delay
        complete = await collector.wait_for(len(items), last_due + 20 - time.time())
        cores = window.finish()
        await collector.stop()
        await producer_conn.close()
    finally:
        await nc.close()
    if not complete:
        print(
            f"read_crowd: {phase}: only {len(collector.ids)} of {len(items)} delivered; "
            f"daemon log: {daemon.log_tail()}",
            file=sys.stderr,
        )
    return collector.summary(len(items)) | {
        "complete": complete,
        "cores": cores,
        "producer": producer,
        "dispatch_lateness_ms": daemon.histogram("mq_scheduler_dispatch_lateness_seconds"),
    }


# -- the crowd (a child process) ------------------------------------------------------------


async def client_loop(
    http: aiohttp.ClientSession, url: str, paths: list[str], pause: float, stop: float, tally: Any
) -> None:
    """GET each of `paths` in turn until `stop` (wall time), `pause` s after each round; on a
    503 wait its Retry-After."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    while time.time() < stop:
        for path in paths:
            started = time.perf_counter()
            try:
                async with http.get(url + path, headers=headers) as resp:
                    await resp.read()
                    status, retry = resp.status, resp.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally["statuses"][type(exc).__name__] += 1
                await asyncio.sleep(0.1)
                continue
            kind = "list" if path == LIST else "overview"
            tally["statuses"][f"{kind} {status}"] += 1
            tally["ms"][kind].append((time.perf_counter() - started) * 1000)
            if status == 503:
                await asyncio.sleep(float(retry or 1))
        if pause:
            await asyncio.sleep(pause)


async def crowd(url: str, clients: int, tabs: int, seconds: float) -> dict[str, Any]:
    tally: dict[str, Any] = {"statuses": Counter(), "ms": {"list": [], "overview": []}}
    stop = time.time() + seconds
    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=clients + tabs * len(OVERVIEW))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        loops = [client_loop(http, url, [LIST], 0.0, stop, tally) for _ in range(clients)]
        loops += [client_loop(http, url, OVERVIEW, 5.0, stop, tally) for _ in range(tabs)]
        await asyncio.gather(*loops)
    out: dict[str, Any] = {"statuses": dict(tally["statuses"]), "seconds": seconds}
    for kind, values in tally["ms"].items():
        values.sort()
        if values:
            out[f"{kind}_ms"] = {
                "count": len(values),
                "p50": round(values[len(values) // 2], 1),
                "p99": round(values[int(len(values) * 0.99)], 1),
            }
    ok = sum(n for k, n in tally["statuses"].items() if k == "list 200")
    out["list_200_per_second"] = round(ok / seconds, 1)
    return out


def start_crowd(url: str, clients: int, tabs: int, seconds: float, out: str) -> subprocess.Popen:
    args = [sys.executable, __file__, "--crowd-only", url, "--clients", str(clients)]
    args += ["--tabs", str(tabs), "--duration", str(seconds), "--out", out]
    return subprocess.Popen(args)


# -- the run ----------------------------------------------------------------------------------


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    with servers() as env:
        fill_s = await fill_far(env.database_url, a.pending)
        nc = await nats.connect(env.nats_url)
        await add_target_stream(nc.jetstream())
        await nc.close()
        daemon = Daemon(env, read_token=TOKEN).start()
        try:
            quiet = await run_phase(env, daemon, "quiet", a.rate, a.duration, a.delay)
            crowd_out = os.path.join(env.workdir, "crowd.json")
            url = f"http://127.0.0.1:{daemon.http}"
            # the crowd starts a little before the load and ends after its last due time
            seconds = a.duration + a.delay + 6
            proc = start_crowd(url, a.clients, a.tabs, seconds, crowd_out)
            await asyncio.sleep(2)
            crowded = await run_phase(env, daemon, "crowd", a.rate, a.duration, a.delay)
            await asyncio.to_thread(proc.wait, seconds + 60)
            crowded["api"] = json.loads(await asyncio.to_thread(_read, crowd_out))
            crowded["api"]["crowd_process_cpu_note"] = "a child process; not in `cores`"
        finally:
            daemon.stop()
    return {"fill_seconds": round(fill_s, 1), "quiet": quiet, "crowd": crowded}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def verdict(r: dict[str, Any]) -> tuple[float, bool]:
    q, c = r["quiet"]["store_lateness_ms"], r["crowd"]["store_lateness_ms"]
    ratio = round(c.get("p99", 1e9) / max(q.get("p99", 0.0), 1.0), 2)
    clean = all(
        r[p]["complete"] and r[p]["duplicates"] == 0 and r[p]["store_lateness_ms"].get("early") == 0
        for p in ("quiet", "crowd")
    )
    return ratio, clean and ratio <= 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=200_000)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--delay", type=float, default=2)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--tabs", type=int, default=3)
    ap.add_argument("--crowd-only", default=None, metavar="API_URL", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    if a.crowd_only:
        doc = asyncio.run(crowd(a.crowd_only, a.clients, a.tabs, a.duration))
        with open(a.out, "w") as f:
            json.dump(doc, f)
        return
    r = run(measure(a))
    r["p99_crowd_over_quiet"], passed = verdict(r)
    q, c = r["quiet"]["store_lateness_ms"], r["crowd"]["store_lateness_ms"]
    api = r["crowd"]["api"]
    report(
        "read_crowd",
        {k: v for k, v in vars(a).items() if k not in ("out", "crowd_only")},
        r,
        {"p99_crowd_over_quiet": 2.0, "early": 0, "missing": 0, "duplicates": 0},
        passed,
        f"quiet p50 {q.get('p50')} p99 {q.get('p99')} ms; crowd p50 {c.get('p50')} p99 "
        f"{c.get('p99')} ms; ratio {r['p99_crowd_over_quiet']}x (<=2); lost "
        f"{r['quiet']['missing'] + r['crowd']['missing']}; API answers {api['statuses']}, "
        f"{api['list_200_per_second']} pages/s",
        a.out,
    )


if __name__ == "__main__":
    main()
