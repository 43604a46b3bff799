"""CPU per task of intake alone: the envelope's parse, and the whole intake path (delay lane ->
PostgreSQL -> ack) on real servers, this tree (B) against a baseline (A) in the same run.

(a) parse, no servers: on the bench's own envelopes (traffic.envelope), alternating A and B
    `--parse-reps` times: A the strict decoder alone (pydantic: what every envelope took before
    the fast decoder), B `parse_envelope` as it is now; median us per envelope. Also B's
    `Intake.validate` (target, headers, size, envelope, org, NewTask) per message.
(b) intake, real servers: per repetition fresh nats-server + PostgreSQL, the daemon
    (`python -m scheduler run`) from the baseline tree (A: `git archive --baseline` into a temp
    dir, on PYTHONPATH) or from this tree (B), alternating A B A B ...; a raw-socket producer
    publishes R/s (3,000) for D s (15) to the delay lane, every task due in an hour (firing
    stays out of it). CPU of the daemon, this run's nats-server and its PostgreSQL from the
    first publish until the lane is empty, minus the same processes' CPU over an idle window
    of the same length before it, divided by the tasks committed: us per task each. The
    daemon's insert statements give the average batch. With `--profile`, one more B repetition
    runs with its event loop under cProfile (bench/profhook), left out of the medians, and the
    top functions by own time are listed.
(c) statement, PostgreSQL only: intake's insert (with its tombstone check, in its transaction)
    in batches of `--stmt-batches` sizes (30: 3,000/s at the 10 ms linger; 1,000: a backlog),
    A the statement as it was (a copy kept below) and B `TaskStore.insert_batch` of this tree,
    alternating on the same server; client CPU (this process, asyncpg's encoding included) and
    PostgreSQL's CPU per task. Also the cost of one BEGIN/COMMIT pair and of one round trip
    (`SELECT 1`), client and server: the size of folding intake's four round trips per batch
    (BEGIN, insert, tombstone check, COMMIT) into one.

    .venv/bin/python bench/intake_cost.py [--rate 3000] [--seconds 15] [--reps 2]
        [--baseline main] [--parse-reps 7] [--stmt-tasks 30000] [--stmt-batches 30,1000]
        [--skip-parse] [--skip-intake] [--skip-statement] [--profile] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
from burst import intake_drained
from common import Daemon, Env, cpu_of_servers, report, run, servers
from rawnats import RawProducer
from traffic import Item, envelope

# The intent rule of the old statement (the A side), as migration 0019 now holds it.
LIVE = "(d.status = 'intent' AND d.target = excluded.target AND d.expires_at > now())"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFHOOK = os.path.join(ROOT, "bench", "profhook")
LANE = "mq.delay.bench.x"


# -- (a) parse ----------------------------------------------------------------------------------


def parse_cost(reps: int, count: int = 20_000) -> dict[str, Any]:
    """Median us per envelope of the strict decoder alone (A) and of parse_envelope (B)."""
    from scheduler.messages.envelope import Limits, decode_fast, decode_strict, parse_envelope

    now = time.time()
    at = datetime.fromtimestamp(now, UTC)
    raws = [envelope(f"p-{i}", now + 2 + i / 1000, now) for i in range(count)]
    assert all(decode_fast(r) is not None for r in raws[:100]), "the fast path is not taken"
    limits = Limits()

    def side_a() -> None:
        for r in raws:
            decode_strict(r)

    def side_b() -> None:
        for r in raws:
            parse_envelope(r, at, limits)

    times: dict[str, list[float]] = {"A_strict_only": [], "B_parse_envelope": []}
    for _ in range(reps):  # alternating, so drift in the host's load hits both alike
        times["A_strict_only"].append(timeit.timeit(side_a, number=1) / count * 1e6)
        times["B_parse_envelope"].append(timeit.timeit(side_b, number=1) / count * 1e6)
    out: dict[str, Any] = {
        k: {"median_us": round(statistics.median(v), 3), "runs_us": [round(x, 3) for x in v]}
        for k, v in times.items()
    }
    out["B_validate_per_message_us"] = round(_validate_cost(raws, at), 3)
    out["ratio_B_to_A"] = round(
        out["B_parse_envelope"]["median_us"] / out["A_strict_only"]["median_us"], 3
    )
    out["envelope_bytes"] = len(raws[0])
    return out


def _validate_cost(raws: list[bytes], at: datetime) -> float:
    """us per message of `Intake.validate` on raw deliveries as the puller builds them."""
    from scheduler.bus.nats.wire import message_of
    from scheduler.clock import SystemClock
    from scheduler.engine.delayed.intake import Intake
    from scheduler.messages.envelope import Limits
    from scheduler.settings import Settings

    intake = Intake.__new__(Intake)  # only what validate() reads
    intake.settings, intake.lane, intake.limits, intake.clock = (
        Settings(),
        "mq.delay.",
        Limits(),
        SystemClock(),
    )
    msgs = [
        message_of(
            None,  # type: ignore[arg-type]
            LANE.encode(),
            f"$JS.ACK.MQ_DELAY.scheduler-intake.1.{i}.{i}.1764000000000000000.0".encode(),
            r,
            b"NATS/1.0\r\nNats-Msg-Id: p-%d\r\n\r\n" % i,
        )
        for i, r in enumerate(raws)
    ]
    best = min(timeit.repeat(lambda: [intake.validate(m, at) for m in msgs], number=1, repeat=3))
    return best / len(msgs) * 1e6


# -- (b) intake on real servers -----------------------------------------------------------------


def export_tree(rev: str, into: str) -> str:
    """`scheduler/` of git revision `rev`, written under `into`; its path for PYTHONPATH."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", rev, "scheduler"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def code_of(env: dict[str, str]) -> str:
    """The `scheduler` package a daemon started with `env` imports (which tree runs)."""
    return subprocess.run(
        [sys.executable, "-c", "import scheduler; print(scheduler.__path__[0])"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def metric_sum(daemon: Daemon, name: str, label: str = "") -> float:
    """Sum of a metric's samples whose line contains `label` (0 when absent)."""
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + " ", name + "{")) and label in line
    )


def cpu_now(daemon: Daemon, env: Env) -> dict[str, float]:
    return {"daemon": daemon.cpu_seconds()} | cpu_of_servers(env)


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


async def one_rep(side: str, tree: str | None, rate: int, seconds: float, prof: str | None):
    """One repetition on fresh servers: idle window, then the paced load until drained."""
    with servers() as env:
        daemon = Daemon(env)
        daemon.env["PYTHONSAFEPATH"] = "1"  # `-m` would put the cwd (this tree) first
        if tree is not None:
            daemon.env["PYTHONPATH"] = tree
        if prof:
            daemon.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (PROFHOOK, daemon.env.get("PYTHONPATH")) if p
            )
            daemon.env["MQS_PROFILE"] = prof
        code = code_of(daemon.env)
        nc = await nats.connect(env.nats_url)
        raw = None
        try:
            daemon.start()
            js = nc.jetstream()
            count = int(rate * seconds)
            prefix = uuid.uuid4().hex[:8]
            start = time.time() + 1.0 + seconds  # after the idle window
            due = start + 3600
            items: list[Item] = [
                (start + i / rate, LANE, envelope(f"{prefix}-{i}", due, start + i / rate),
                 {"Nats-Msg-Id": f"{prefix}-{i}"})
                for i in range(count)
            ]  # fmt: skip
            raw = await RawProducer(env.nats_url).start()
            await asyncio.sleep(max(0.0, start - seconds - time.time()))
            idle0 = cpu_now(daemon, env)
            await asyncio.sleep(max(0.0, start - time.time()))
            idle = delta(idle0, cpu_now(daemon, env))
            inserts0 = metric_sum(daemon, "mq_scheduler_db_seconds_count", 'op="insert"')
            if prof:
                os.kill(daemon.pid, signal.SIGUSR1)
            t0, cpu0 = time.time(), cpu_now(daemon, env)
            producer = await raw.produce(items)
            drained = await intake_drained(js, time.time() + 30)
            busy = delta(cpu0, cpu_now(daemon, env))
            wall = time.time() - t0
            if prof:
                os.kill(daemon.pid, signal.SIGUSR2)
                await asyncio.sleep(0.5)
            accepted = metric_sum(daemon, "mq_scheduler_intake_total", 'outcome="accepted"')
            inserts = metric_sum(daemon, "mq_scheduler_db_seconds_count", 'op="insert"') - inserts0
        finally:
            if raw is not None:
                await raw.close()
            daemon.stop()
            await nc.close()
    scale = wall / seconds  # the idle window was `seconds` long; the busy one `wall`
    net = {k: busy[k] - idle[k] * scale for k in busy}
    per_task = {k: round(v / max(accepted, 1) * 1e6, 1) for k, v in net.items()}
    per_task["total"] = round(sum(per_task.values()), 1)
    return {
        "side": side,
        "code": code,
        "tasks_committed": int(accepted),
        "published_acked": producer["acked"],
        "drained": drained is not None,
        "wall_seconds": round(wall, 2),
        "us_per_task_net_of_idle": per_task,
        "us_per_task_gross": {k: round(v / max(accepted, 1) * 1e6, 1) for k, v in busy.items()},
        "idle_cpu_share_of_a_core": {k: round(v / seconds, 4) for k, v in idle.items()},
        "insert_statements": int(inserts),
        "avg_batch": round(accepted / inserts, 1) if inserts else None,
    }


def intake_cost(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mqs-intake-cost-") as tmp:
        baseline = export_tree(a.baseline, tmp)
        reps: list[dict[str, Any]] = []
        prof = os.path.join(tmp, "intake.prof") if a.profile else None
        for _ in range(a.reps):
            for side, tree in (("A", baseline), ("B", None)):
                reps.append(run(one_rep(side, tree, a.rate, a.seconds, None)))
        out: dict[str, Any] = {"baseline": a.baseline, "reps": reps}
        if prof:  # one more B run under cProfile, left out of the medians (it slows the loop)
            out["profiled_rep_B"] = run(one_rep("B", None, a.rate, a.seconds, prof))
        for side in ("A", "B"):
            mine = [r["us_per_task_net_of_idle"] for r in reps if r["side"] == side]
            out[f"median_{side}"] = {
                k: round(statistics.median(m[k] for m in mine), 1) for k in mine[0]
            }
        out["ratio_B_to_A"] = {
            k: round(out["median_B"][k] / out["median_A"][k], 3)
            for k in out["median_A"]
            if out["median_A"][k] > 0
        }
        if prof and os.path.exists(prof):
            out["profile_B_top"] = top_functions(prof)
    return out


def top_functions(path: str, n: int = 25) -> list[str]:
    """The `n` functions with the most own time in a cProfile dump, one line each."""
    stats = pstats.Stats(path)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)  # type: ignore[attr-defined]
    total = sum(v[2] for _, v in rows) or 1.0
    return [
        f"{v[2] / total:6.1%} own {v[3] / total:6.1%} cum {v[1]:>8} calls "
        f"{os.path.basename(f)}:{line}({fn})"
        for (f, line, fn), v in rows[:n]
    ]


# -- (c) the insert statement alone ------------------------------------------------------------

# Side A: intake's insert before this change (ids and targets joined, the rest as arrays, the
# tombstone check with a text[]), kept here to measure against in the same run.
_A_INSERT = (
    "INSERT INTO delayed_messages AS d (id, target, payload, headers, priority, due_at, "
    "scheduled_for, expires_at, org_id) SELECT u.id, u.target, u.payload, u.headers, u.priority, "
    "'1970-01-01T00:00:00Z'::timestamptz + u.due_us * interval '1 microsecond', "
    "'1970-01-01T00:00:00Z'::timestamptz + u.sched_us * interval '1 microsecond', "
    "'1970-01-01T00:00:00Z'::timestamptz + u.exp_us * interval '1 microsecond', u.org_id "
    "FROM unnest(string_to_array($1, chr(31)), string_to_array($2, chr(31)), $3::bytea[], "
    "$4::jsonb[], $5::smallint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::text[]) "
    "AS u(id, target, payload, headers, priority, due_us, sched_us, exp_us, org_id) "
    "ON CONFLICT (id) DO UPDATE SET target = excluded.target, payload = excluded.payload, "
    "headers = excluded.headers, priority = excluded.priority, org_id = excluded.org_id, "
    "expires_at = excluded.expires_at, seq = excluded.seq, created_at = now(), "
    f"updated_at = now(), status = CASE WHEN {LIVE} AND d.intent = 'cancel' "
    "THEN 'cancelled' ELSE 'pending' END, "
    f"due_at = CASE WHEN {LIVE} AND d.intent = 'reschedule' THEN d.due_at "
    "ELSE excluded.due_at END, "
    f"scheduled_for = CASE WHEN {LIVE} AND d.intent = 'reschedule' THEN d.scheduled_for "
    f"ELSE excluded.scheduled_for END, intent = CASE WHEN {LIVE} THEN d.intent END "
    "WHERE d.status = 'intent' RETURNING id, due_at, priority, seq, org_id, status"
)
_A_DROP = (
    "WITH t AS (SELECT id FROM fired_tasks WHERE id = ANY($1::text[])) "
    "DELETE FROM delayed_messages d USING t WHERE d.id = t.id RETURNING d.id"
)


async def _insert_a(pool: asyncpg.Pool, tasks: list[Any]) -> int:
    from scheduler.store.postgres.task_rows import micros, task_ref

    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(
            _A_INSERT,
            "\x1f".join(t.id for t in tasks),
            "\x1f".join(t.target for t in tasks),
            [t.payload for t in tasks],
            ["{}" if not t.headers else json.dumps(t.headers) for t in tasks],
            [t.priority for t in tasks],
            [micros(t.due_at) for t in tasks],
            [micros(t.scheduled_for) for t in tasks],
            [None if t.expires_at is None else micros(t.expires_at) for t in tasks],
            [t.org_id for t in tasks],
        )
        if rows:
            await conn.fetch(_A_DROP, [r["id"] for r in rows])
    return len([task_ref(r) for r in rows if r["status"] != "cancelled"])


def _new_tasks(n: int, due: datetime) -> list[Any]:
    from scheduler.records import NewTask

    prefix = uuid.uuid4().hex[:10]
    now = time.time()
    return [
        NewTask(f"{prefix}-{i}", "mq.bench.x", envelope(f"{prefix}-{i}", now + 3600, now), {},
                5, due, due, None, org_id=None)
        for i in range(n)
    ]  # fmt: skip


async def statement_cost(total: int, batches: list[int], reps: int) -> dict[str, Any]:
    from scheduler.daemon import migrate
    from scheduler.metrics import Metrics
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.tasks import TaskStore

    out: dict[str, Any] = {}
    with servers() as env:
        await asyncio.to_thread(migrate.upgrade, env.database_url)  # it runs its own loop
        pool = await create_pool(env.database_url, min_size=1, max_size=1)
        store = TaskStore(PostgresStore(pool, Metrics()))
        due = datetime.now(UTC) + timedelta(hours=1)
        try:
            for size in batches:
                n = max(total // size, 1)
                cost: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
                for _ in range(reps):
                    for side in ("A", "B"):
                        groups = [_new_tasks(size, due) for _ in range(n)]
                        c0, p0 = time.process_time(), cpu_of_servers(env)["postgres"]
                        for g in groups:
                            if side == "A":
                                await _insert_a(pool, g)
                            else:
                                await store.insert_batch(g)
                        client = time.process_time() - c0
                        server = cpu_of_servers(env)["postgres"] - p0
                        cost[side].append({"client": client, "postgres": server})
                out[f"batch_{size}"] = {
                    side: {
                        k: round(statistics.median(r[k] for r in rs) / (n * size) * 1e6, 2)
                        for k in ("client", "postgres")
                    }
                    for side, rs in cost.items()
                }
            out["round_trips"] = await _round_trips(pool, env)
        finally:
            await pool.close()
    return out


async def _round_trips(pool: asyncpg.Pool, env: Env, n: int = 3000) -> dict[str, Any]:
    """Client and server CPU (us) of one BEGIN/COMMIT pair and of one `SELECT 1`."""
    out = {}
    async with pool.acquire() as conn:
        for name in ("begin_commit", "select_1"):
            c0, p0 = time.process_time(), cpu_of_servers(env)["postgres"]
            for _ in range(n):
                if name == "select_1":
                    await conn.fetchval("SELECT 1")
                else:
                    async with conn.transaction():
                        pass
            out[name] = {
                "client_us": round((time.process_time() - c0) / n * 1e6, 1),
                "postgres_us": round((cpu_of_servers(env)["postgres"] - p0) / n * 1e6, 1),
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--baseline", default="main", help="git revision for side A (default main)")
    ap.add_argument("--parse-reps", type=int, default=7)
    ap.add_argument("--skip-parse", action="store_true")
    ap.add_argument("--skip-intake", action="store_true")
    ap.add_argument("--stmt-tasks", type=int, default=30_000)
    ap.add_argument("--stmt-batches", default="30,1000")
    ap.add_argument("--stmt-reps", type=int, default=3)
    ap.add_argument("--skip-statement", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    results: dict[str, Any] = {}
    line = []
    if not a.skip_parse:
        p = results["parse"] = parse_cost(a.parse_reps)
        line.append(
            f"parse A {p['A_strict_only']['median_us']} us -> B "
            f"{p['B_parse_envelope']['median_us']} us ({p['ratio_B_to_A']}x); validate B "
            f"{p['B_validate_per_message_us']} us/msg"
        )
    passed = True
    if not a.skip_statement:
        sizes = [int(x) for x in a.stmt_batches.split(",")]
        st = results["statement"] = run(statement_cost(a.stmt_tasks, sizes, a.stmt_reps))
        for size in sizes:
            ab = st[f"batch_{size}"]
            line.append(
                f"insert x{size} us/task A -> B: client {ab['A']['client']} -> "
                f"{ab['B']['client']}, postgres {ab['A']['postgres']} -> {ab['B']['postgres']}"
            )
    if not a.skip_intake:
        r = results["intake"] = intake_cost(a)
        passed = all(x["drained"] for x in r["reps"])
        ma, mb = r["median_A"], r["median_B"]
        line.append(
            f"intake at {a.rate}/s, us/task A -> B: daemon {ma['daemon']} -> {mb['daemon']}, "
            f"nats-server {ma['nats-server']} -> {mb['nats-server']}, postgres "
            f"{ma['postgres']} -> {mb['postgres']}, total {ma['total']} -> {mb['total']}"
        )
        for top in r.get("profile_B_top", []):
            print(top, file=sys.stderr)
    params = {k: v for k, v in vars(a).items() if k != "out"}
    targets = {"cpu_per_task_us": "<= 150 across daemon + nats-server + PostgreSQL (issue 28)"}
    report("intake_cost", params, results, targets, passed, "; ".join(line), a.out)


if __name__ == "__main__":
    main()
