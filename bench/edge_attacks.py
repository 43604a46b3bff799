"""Edge attacks: delivery lateness while outsiders attack the HTTP and NATS edges (issue 35).

Two daemons (`python -m scheduler run` subprocesses, a leader and a standby, lease TTL `--ttl`
3 s, a read and an admin token) on a fresh nats-server and PostgreSQL. `--pending` (200,000)
rows due 1 h to a day ahead are COPYed in (what the listings read), then every task of the run
is published to the delay lane ahead of time by two nats-py producers (`mq.delay.bench.x`, due
`--rate` (300) per second, evenly, from the first phase's start to the last one's end), so no
producer runs during the phases. The run is a quiet phase (`--quiet-seconds`, 20) and then each
attack vector (bench/edge_attackers.py) for `--phase-seconds` (20), each followed by a quiet
phase (`after_<vector>`, not judged) of at least `--gap-seconds` (5) that lasts until the
daemons caught up (the newest delivery was due less than 0.2 s ago), at most `--max-recovery`
(60) s, so one attack's backlog does not colour the next one's figures; the load runs
`--spare-seconds` (240) beyond the planned phases for these recoveries. Each attacker is a child
process started 1.5 s ahead, aimed at whoever holds the lease at that moment, bounded in time
and requests, targeting 127.0.0.1 only.

After the run the target stream (BENCH, `mq.bench.>`) is read back; lateness = the stored
message's JetStream timestamp minus its `Mq-Scheduled-For` (else the envelope's `delay_until`),
and each task belongs to the phase its due time falls in. Per phase: p50/p99/max, the ratio of
p99 to the quiet phase's, lost, doubled, early, whether the leader kept its lease (no
`leader.lost` in either daemon's log during the phase and the PostgreSQL epoch unchanged,
sampled every 0.5 s), the attacker's answers by status and its request rate, and CPU seconds
of each daemon and of the attacker. Targets (issue 35): under every attack p99 <= 1.5x quiet
and <= 15 ms, nothing lost, doubled or early, the lease kept.

Only `scheduler run` and the HTTP and NATS interfaces are driven (the lease holder is read from
PostgreSQL's epoch row, CPU is summed over each daemon's process tree), so the script measures
a daemon that runs its roles as separate processes the same way.

`--attacker-nice N` runs the attacker processes at nice N. On one 2-core host the attackers'
own CPU (an HTTP or NATS client flooding at thousands of requests a second) takes the cores the
engine waits for, which clients on other hosts (production's case) do not; at nice 19 they
only get what the daemons leave, a stand-in for remote clients. The default (0) is the
same-host worst case.

`--tree PATH` runs the daemons from another checkout (its code through PYTHONPATH; the bench's
own code stays this tree's), e.g. a worktree of an older commit for a "before" table.

    .venv/bin/python bench/edge_attacks.py [--rate 300] [--quiet-seconds 20]
        [--phase-seconds 20] [--gap-seconds 5] [--max-recovery 60] [--vectors chunked_get,...]
        [--pending 200000] [--ttl 3] [--attacker-nice 0] [--tree PATH] [--logs DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import sys
import time
import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import asyncpg
import nats
from common import Daemon, Env, add_target_stream, report, run, servers
from edge_attackers import ATTACKS, attack
from edge_phases import (
    ADMIN_TOKEN,
    READ_TOKEN,
    Phase,
    Target,
    due_of,
    last_delivery,
    lease_holder,
    run_phases,
)
from scale import COLUMNS
from traffic import Pipeline, envelope, read_back, stats

LANE = "mq.delay.bench.x"
TARGETS = {"p99_over_quiet": 1.5, "p99_ms": 15.0, "lost": 0, "doubled": 0, "early": 0}


# -- the plan: phases on one time line, the tasks falling due across it ---------------------------


def due_times(first: float, last: float, rate: float) -> list[float]:
    """Due instants `rate` per second from `first` to `last`, on whole milliseconds (the
    envelope's `delay_until` has ms precision)."""
    return [int((first + i / rate) * 1000) / 1000 for i in range(int((last - first) * rate))]


def phase_of(due: float, phases: list[Phase]) -> str:
    """The phase whose window holds `due` (`other` between windows)."""
    return next((p.name for p in phases if p.start <= due < p.end), "other")


# -- the judgement ----------------------------------------------------------------------------


def classify(
    expected: dict[str, float], stored: dict[str, list[tuple[float, float]]], phases: list[Phase]
) -> dict[str, dict[str, Any]]:
    """Per phase: lateness stats (store time minus due), lost, doubled, early. `stored` maps a
    task id to its (store time, due time) pairs as read back."""
    late: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for task_id, planned in expected.items():
        name = phase_of(planned, phases)
        got = stored.get(task_id, [])
        counts[name]["expected"] += 1
        counts[name]["lost"] += not got
        counts[name]["doubled"] += len(got) > 1
        if got:
            at, due = got[0]
            late[name].append((at - due) * 1000)
    out: dict[str, dict[str, Any]] = {}
    for name in counts:
        s = stats(late[name])
        out[name] = {k: counts[name][k] for k in ("expected", "lost", "doubled")}
        out[name] |= {"early": s.get("early", 0), "store_lateness_ms": s}
    return out


def judge(results: dict[str, Any], order: list[str]) -> tuple[bool, list[str]]:
    """Whether every phase is clean (nothing lost, doubled or early) and every attack phase
    (one named after a vector) met the lateness and lease targets; what failed, as
    `phase: reason`. Sets each attack phase's `p99_over_quiet`."""
    quiet_p99 = results["quiet"]["store_lateness_ms"].get("p99", 0.0)
    failed = []
    for name in [*order, "other"]:
        r = results.get(name)
        if r is None:
            continue
        reasons = [k for k in ("lost", "doubled", "early") if r[k]]
        if name in ATTACKS:
            p99 = r["store_lateness_ms"].get("p99", float("inf"))
            r["p99_over_quiet"] = round(p99 / max(quiet_p99, 0.001), 2)
            if r["p99_over_quiet"] > TARGETS["p99_over_quiet"]:
                reasons.append(f"p99 {r['p99_over_quiet']}x quiet")
            if p99 > TARGETS["p99_ms"]:
                reasons.append(f"p99 {p99} ms")
            if not r.get("lease_kept", False):
                reasons.append("lease lost")
        if r.get("exited"):
            reasons.append(f"daemon exited ({', '.join(r['exited'])})")
        failed += [f"{name}: {why}" for why in reasons]
    return not failed, failed


# -- the daemons ------------------------------------------------------------------------------


def daemon(env: Env, n: int, a: argparse.Namespace) -> Daemon:
    d = Daemon(
        env,
        read_token=READ_TOKEN,
        admin_token=ADMIN_TOKEN,
        lease_ttl=str(a.ttl),
        instance_id=f"edge-{n}",
        log_level=a.log_level,
    )
    if a.tree:  # its code, and its folder as the working directory (first on sys.path)
        d.env["PYTHONPATH"], d.cwd = a.tree, a.tree
    return d


async def leader_first(daemons: list[Daemon], dsn: str, within: float = 15) -> list[Daemon]:
    """The daemons, the lease holder first (by the epoch row in PostgreSQL, not by the HTTP
    edge); bounded wait for one of them to take office."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.time() + within
        while time.time() < deadline:
            _, holder = await lease_holder(conn)
            ours = [d for d in daemons if d.env["SCHEDULER_INSTANCE_ID"] == holder]
            if ours:
                return ours + [d for d in daemons if d is not ours[0]]
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    raise RuntimeError(f"no leader in {within} s: {[d.log_tail() for d in daemons]}")


# -- the load ---------------------------------------------------------------------------------


async def fill_far(dsn: str, count: int, chunk: int = 50_000) -> float:
    """`count` pending rows due 1 h to 1 day ahead (none fires during the run); seconds taken.
    The schema is the daemons' own (they migrated it): nothing is migrated here."""
    t0 = time.time()
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


async def publish_ahead(url: str, dues: list[float], producers: int = 2) -> dict[str, Any]:
    """Every task of the run onto the delay lane now, by `producers` nats-py connections;
    returns the ids with their due times and the producers' PubAck counts."""
    tag = uuid.uuid4().hex[:6]
    expected = {f"e-{tag}-{i}": due for i, due in enumerate(dues)}
    ids = list(expected)
    now = time.time()

    async def one(part: list[str]) -> dict[str, Any]:
        nc = await nats.connect(url)
        try:
            pipe = await Pipeline(nc).start()
            for task_id in part:
                body = envelope(task_id, expected[task_id], now)
                await pipe.publish(LANE, body, {"Nats-Msg-Id": task_id})
            return await pipe.drain()
        finally:
            await nc.close()

    acks = await asyncio.gather(*(one(ids[k::producers]) for k in range(producers)))
    return {"expected": expected, "producers": acks, "seconds": round(time.time() - now, 1)}


async def wait_intake(url: str, stream: str, within: float) -> float:
    """Seconds until the delay lane is empty (intake took every task), bounded by `within`."""
    t0 = time.time()
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        while time.time() - t0 < within:
            if (await js.stream_info(stream)).state.messages == 0:
                break
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
    return round(time.time() - t0, 1)


async def fired_past(js: Any, end: float, within: float) -> bool:
    """Wait (bounded) until the daemons deliver tasks due after `end`: every task due before
    it has had its turn (firing is in due order)."""
    deadline = time.time() + within
    while time.time() < deadline:
        newest = await last_delivery(js)
        if newest is not None and newest[1] >= end + 1.0:
            return True
        await asyncio.sleep(0.2)
    return False


def stored_times(msgs: list[Any]) -> dict[str, list[tuple[float, float]]]:
    """(store time, due time) per task id of the messages read back."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for m in msgs:
        headers = m.headers or {}
        task_id = headers.get("Nats-Msg-Id") or json.loads(m.data)["id"]
        due = due_of(headers.get("Mq-Scheduled-For"), m.data)
        out[task_id].append((m.metadata.timestamp.timestamp(), due))
    return out


# -- the run ----------------------------------------------------------------------------------


async def measure(a: argparse.Namespace) -> dict[str, Any]:
    with servers() as env:
        nc = await nats.connect(env.nats_url)
        await add_target_stream(nc.jetstream())
        await nc.close()
        daemons = [daemon(env, 1, a).start(), daemon(env, 2, a).start()]
        try:
            return await attacked(a, env, await leader_first(daemons, env.database_url))
        finally:
            for d in daemons:
                d.stop()
            if a.logs:
                os.makedirs(a.logs, exist_ok=True)
                for d in daemons:
                    name = f"{d.env['SCHEDULER_INSTANCE_ID']}.log"
                    shutil.copy(d.log_path, os.path.join(a.logs, name))


async def attacked(a: argparse.Namespace, env: Env, daemons: list[Daemon]) -> dict[str, Any]:
    fill_s = await fill_far(env.database_url, a.pending) if a.pending else 0.0
    n = len(a.vectors.split(",")) if a.vectors else len(ATTACKS)
    seconds = a.quiet_seconds + n * (a.phase_seconds + a.gap_seconds) + a.spare_seconds
    # publish (~10,000/s) and intake before the first due; on a whole ms, as due times are
    first = math.ceil((time.time() + a.lead + seconds * a.rate / 5000) * 1000) / 1000
    load = await publish_ahead(env.nats_url, due_times(first, first + seconds, a.rate))
    intake_s = await wait_intake(env.nats_url, "MQ_DELAY", max(first - time.time(), 1.0))
    slack = round(first - time.time(), 1)
    phases, watched, skipped = await run_phases(a, env, daemons, first, first + seconds)
    end = phases[-1].end
    nc = await nats.connect(env.nats_url)
    try:
        fired = await fired_past(nc.jetstream(), end, a.grace)
    finally:
        await nc.close()
    expected = {k: due for k, due in load.pop("expected").items() if due < end}
    per_phase = classify(expected, stored_times(await read_back(env.nats_url, "BENCH")), phases)
    for name, r in per_phase.items():
        r |= watched.get(name, {})
    setup = {"fill_seconds": round(fill_s, 1), "intake_seconds": intake_s,
             "slack_before_first_due_s": slack, "tree": a.tree or "(this tree)",
             "leader": daemons[0].env["SCHEDULER_INSTANCE_ID"], "fired_past_end": fired,
             "tasks_judged": len(expected), "vectors_skipped": skipped,
             "daemon_cwd": [os.readlink(f"/proc/{d.pid}/cwd") for d in daemons
                            if d.proc is not None and d.proc.poll() is None]}  # fmt: skip
    return {"setup": setup | load, "phases": per_phase, "order": [p.name for p in phases]}


def table(r: dict[str, Any]) -> str:
    """The per-phase table (Markdown), attack phases and the quiet one."""
    rows = ["| phase | p50 ms | p99 ms | max ms | p99 / quiet | lost | doubled | early | "
            "lease kept | daemons' CPU s (edges') | attacker saw |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in r["order"]:
        p = r["phases"].get(name)
        if p is None or name.startswith("after_"):
            continue
        s, att = p["store_lateness_ms"], p.get("attacker", {})
        saw = ", ".join(f"{k}: {v:,}" for k, v in sorted(att.get("statuses", {}).items()))
        saw += f" ({att['per_second']:,}/s)" if "per_second" in att else ""
        rows.append(
            f"| {name} | {s.get('p50')} | {s.get('p99')} | {s.get('max')} | "
            f"{p.get('p99_over_quiet', '')} | {p['lost']} | {p['doubled']} | {p['early']} | "
            f"{lease(p)} | {cpu(p)} | {saw or '-'} |"
        )
    return "\n".join(rows)


def cpu(p: dict[str, Any]) -> str:
    """The table's CPU column: the daemons' CPU seconds over the phase, the edges' in brackets."""
    every, edges = (
        [v for v in (p.get(k) or {}).values() if v is not None]
        for k in ("daemon_cpu_seconds", "edge_cpu_seconds")
    )
    return f"{sum(every):.1f} ({sum(edges):.1f})" if every else "-"


def lease(p: dict[str, Any]) -> str:
    """The table's lease column: kept or not, and which daemon exited."""
    exited = p.get("exited") or []
    return ("yes" if p.get("lease_kept") else "no") + (f" ({', '.join(exited)})" if exited else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=300, help="tasks falling due per second")
    ap.add_argument("--quiet-seconds", type=float, default=20)
    ap.add_argument("--phase-seconds", type=float, default=20)
    ap.add_argument("--gap-seconds", type=float, default=5, help="quiet after each attack")
    ap.add_argument("--vectors", default="", help=f"comma-separated subset of {','.join(ATTACKS)}")
    ap.add_argument("--pending", type=int, default=200_000, help="far-ahead rows COPYed in")
    ap.add_argument("--ttl", type=float, default=3, help="the daemons' lease TTL")
    ap.add_argument(
        "--max-recovery",
        type=float,
        default=60,
        help="s the quiet after an attack may last while the daemons catch up",
    )
    ap.add_argument(
        "--spare-seconds",
        type=float,
        default=90,
        help="s of load beyond the planned phases, for the recoveries",
    )
    ap.add_argument("--lead", type=float, default=8, help="s before the first due, beyond publish")
    ap.add_argument("--grace", type=float, default=30, help="s to wait for the last deliveries")
    ap.add_argument("--log-level", default="WARNING", help="the daemons' SCHEDULER_LOG_LEVEL")
    ap.add_argument(
        "--attacker-nice",
        type=int,
        default=0,
        help="run the attackers at this nice value (19: a stand-in for clients on other hosts)",
    )
    ap.add_argument("--tree", default="", help="run the daemons from this checkout's code")
    ap.add_argument("--logs", default="", help="keep the daemons' logs in this folder")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument("--attack", default="", help=argparse.SUPPRESS)  # the attacker child
    ap.add_argument("--target-json", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.attack:
        attacker_main(a)
        return
    check_args(ap, a)
    r = run(measure(a))
    passed, failed = judge(r["phases"], r["order"])
    q = r["phases"]["quiet"]["store_lateness_ms"]
    hidden = ("out", "logs", "attack", "target_json")
    params = {k: v for k, v in vars(a).items() if k not in hidden}
    report("edge_attacks", params, r, TARGETS, passed,
           f"quiet p99 {q.get('p99')} ms; {len(failed)} misses: {'; '.join(failed) or 'none'}",
           a.out)  # fmt: skip
    print(table(r), file=sys.stderr)


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    unknown = [v for v in a.vectors.split(",") if v and v not in ATTACKS]
    if unknown:
        ap.error(f"--vectors: unknown {', '.join(unknown)} (known: {', '.join(ATTACKS)})")
    if a.tree and not os.path.isfile(os.path.join(a.tree, "scheduler", "__init__.py")):
        ap.error(f"--tree: no scheduler package in {a.tree}")
    if a.tree:
        a.tree = os.path.abspath(a.tree)
    for name in ("rate", "quiet_seconds", "phase_seconds", "ttl"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: must be > 0")


def attacker_main(a: argparse.Namespace) -> None:
    target = Target(**json.loads(a.target_json))
    print("ready", flush=True)
    start, until = (float(x) for x in sys.stdin.readline().split())
    doc = asyncio.run(attack(a.attack, target, start, until))
    with open(a.out, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    main()
