"""Intake: how fast the delay lane is committed to PostgreSQL.

(a) backlog: N tasks (default 600,000, due in an hour so firing stays out of the way) are
    published into MQ_DELAY (created here exactly as the daemon would) before the daemon runs;
    then the daemon starts. MQ_DELAY is a work queue, so it is empty once every task is acked,
    i.e. committed. Rate = rows in `delayed_messages` / (empty - ready). Target >= 20,000/s.
(b) live: producers at 10,000/s (due in an hour) for D s while 5,000/s fall due (tasks
    pre-loaded before the window, due evenly across it). Intake lag (pending + unacked on
    `scheduler-intake`) is sampled every 0.5 s; it keeps up if the last third's average is
    <= 2x the first third's (or <= 0.1 s of traffic) and below 1 s of traffic.

    .venv/bin/python bench/intake.py [--backlog 600000] [--live-seconds 30] [--skip-backlog]
        [--skip-live] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import asyncpg
import nats
from burst import intake_drained
from common import CpuWindow, Daemon, Env, add_target_stream, report, run, servers
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from rawnats import RawCollector, RawProducer
from traffic import Item, Pipeline, envelope, produce

LANE = "mq.delay.bench.x"


def tasks(count: int, due: float | list[float]) -> list[Item]:
    """`count` delay-lane items due at `due` (one instant, or one each), to publish at once."""
    prefix = uuid.uuid4().hex[:8]
    at = now = time.time()
    dues = due if isinstance(due, list) else [due] * count
    return [
        (at, LANE, envelope(f"{prefix}-{i}", dues[i], now), {"Nats-Msg-Id": f"{prefix}-{i}"})
        for i in range(count)
    ]


async def backlog(count: int) -> dict[str, Any]:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        daemon = Daemon(env)
        try:
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(
                    name="MQ_DELAY",
                    subjects=["mq.delay.>"],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    duplicate_window=120,
                )
            )
            t0 = time.time()
            producer = await produce(await Pipeline(nc).start(), tasks(count, t0 + 3600))
            publish_s = time.time() - t0
            stored = (await js.stream_info("MQ_DELAY")).state.messages
            daemon.start()
            ready = time.time()
            drained = await intake_drained(js, ready + 60 + count / 2000)
            done = time.time()
            rss = daemon.rss_mb()
        finally:
            daemon.stop()
            await nc.close()
        rows = await count_rows(env)
    seconds = done - ready
    return {
        "published": producer["acked"],
        "in_stream_before_start": stored,
        "rows_committed": rows,
        "drained": drained is not None,
        "seconds_from_ready": round(seconds, 2),
        "seconds_from_spawn": round(done - daemon.started_at, 2),
        "rate": round(rows / seconds),
        "rate_from_spawn": round(rows / (done - daemon.started_at)),
        "publish_rate": round(producer["acked"] / publish_s),
        "daemon_rss_mb": round(rss),
    }


async def count_rows(env: Env) -> int:
    conn = await asyncpg.connect(env.database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM delayed_messages"))
    finally:
        await conn.close()


async def sample_lag(js: Any, start: float, until: float, out: list[int]) -> None:
    """Intake lag every 0.5 s from `start` (absolute schedule) until `until`."""
    for k in range(1, int((until - start) * 2) + 1):
        await asyncio.sleep(max(0.0, start + k * 0.5 - time.time()))
        info = await js.consumer_info("MQ_DELAY", "scheduler-intake")
        out.append(info.num_pending + info.num_ack_pending)


async def live(seconds: float, in_rate: int, due_rate: int) -> dict[str, Any]:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        daemon = Daemon(env)
        try:
            js = nc.jetstream()
            await add_target_stream(js)
            daemon.start()
            n_due = int(due_rate * seconds)
            window = time.time() + 8 + n_due / 10_000
            dues = [window + i / due_rate for i in range(n_due)]
            preload = await produce(await Pipeline(nc).start(), tasks(n_due, dues))
            preload_drained = await intake_drained(js, window)
            # The live producer and the collector speak NATS on raw sockets (rawnats.py): through
            # nats-py they would take more of the two shared cores than the daemon's intake.
            collector = await RawCollector(env.nats_url, js, "BENCH", "mq.bench.>").start()
            raw = await RawProducer(env.nats_url).start()
            items = tasks(int(in_rate * seconds), window + 3600)
            items = [(window + i / in_rate, *item[1:]) for i, item in enumerate(items)]
            samples: list[int] = []
            sampler = asyncio.create_task(sample_lag(js, window, window + seconds, samples))
            await asyncio.sleep(max(0.0, window - time.time()))  # the live window opens
            cpu = CpuWindow(daemon)
            try:
                producer = await raw.produce(items)
            finally:
                await sampler
                await raw.close()
            cores = cpu.finish()
            await collector.wait_for(n_due, 5)
            await collector.stop()
        finally:
            daemon.stop()
            await nc.close()
    third = max(len(samples) // 3, 1)
    first, last = samples[:third] or [0], samples[-third:] or [0]
    first_avg, last_avg = sum(first) / len(first), sum(last) / len(last)
    span = max(0.5 * (len(samples) - third), 0.5)  # seconds between the thirds' centres
    return {
        "seconds": seconds,
        "in_rate": in_rate,
        "due_rate": due_rate,
        "preload": preload | {"drained_before_window": preload_drained is not None},
        "producer": producer,
        "fired": collector.summary(n_due),
        "lag_samples": samples,
        "lag_first_third_avg": round(first_avg),
        "lag_last_third_avg": round(last_avg),
        "lag_max": max(samples, default=0),
        # what intake committed while the lag grew (or shrank): in-rate minus the lag's growth
        "intake_rate_achieved": round(in_rate - (last_avg - first_avg) / span),
        "cores": cores,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backlog", type=int, default=600_000)
    ap.add_argument("--live-seconds", type=float, default=30)
    ap.add_argument("--skip-backlog", action="store_true")
    ap.add_argument("--skip-live", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    r: dict[str, Any] = {}
    passed, line = True, []
    if not a.skip_backlog:
        b = r["backlog"] = run(backlog(a.backlog))
        passed &= b["drained"] and b["rate"] >= 20_000 and b["rows_committed"] == a.backlog
        line.append(f"backlog {b['rows_committed']} rows at {b['rate']}/s")
    if not a.skip_live:
        lv = r["live"] = run(live(a.live_seconds, 10_000, 5_000))
        first, last = lv["lag_first_third_avg"], lv["lag_last_third_avg"]
        keeps_up = last <= max(2 * first, lv["in_rate"] * 0.1) and last < lv["in_rate"]
        lv["keeps_up"] = keeps_up
        passed &= keeps_up and lv["fired"]["missing"] == 0
        f = lv["fired"]["lateness_ms"]
        line.append(
            f"live 10k/s in, 5k/s due: lag {first} -> {last} (max {lv['lag_max']}), "
            f"fired {lv['fired']['distinct']}/{lv['fired']['expected']} p50 {f.get('p50')} "
            f"p99 {f.get('p99')} ms"
        )
    params = {k: v for k, v in vars(a).items() if k != "out"}
    targets = {
        "backlog_rate_min": 20_000,
        "live_lag": "last third avg <= max(2x first third, 0.1 s of traffic) and < 1 s",
    }
    report("intake", params, r, targets, bool(passed), "; ".join(line), a.out)


if __name__ == "__main__":
    main()
