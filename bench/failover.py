"""Failover: the leader killed (SIGKILL) or stopped (SIGTERM) under a steady delayed-task load.

Two daemons (lease TTL `--ttl`, 3 s) share one nats-server and one PostgreSQL. Each repetition
publishes `rate` tasks/s worth of delayed tasks to `mq.delay.bench.x` in one go (due instants
every 1/rate s, from `lead` s after publishing, spanning the kill point by `before` s and `after`
s), waits for intake to commit them, then kills the leader at the planned instant. A live
ordered consumer on the target stream (BENCH, `mq.bench.>`, 2 min duplicate window) times every
arrival; after the run the stream is read back to classify each task: delivered once, lost,
doubled (by `Nats-Msg-Id`, and by payload id), early (arrival or store time before its due
instant). Delivery gap = the longest interval between consecutive first arrivals, sorted by
arrival time; takeover = time from the kill until the survivor's `/readyz` says `leader` (polled
every 20 ms). After each repetition a fresh daemon joins the survivor, so two always run.
Lease CPU: the leader and the standby idle (no tasks) for `--idle-seconds`; CPU time over wall
time, which counts every idle loop of the daemon, so it bounds the lease upkeep from above.
Targets (issue 4): SIGKILL gap median <= TTL + 1 s, max <= TTL + 1.5 s; SIGTERM gap <= 0.5 s
(median and max); none lost, doubled or early in any repetition; idle leader CPU < 1 %.

    .venv/bin/python bench/failover.py [--reps 5] [--ttl 3] [--rate 100] [--idle-seconds 30]
    [--only sigkill,sigterm,cpu] [--lead 2] [--before 4] [--after 8] [--logs DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from datetime import datetime
from itertools import pairwise
from typing import Any

import aiohttp
import nats
from common import Daemon, Env, add_target_stream, cpu_seconds, report, run, servers
from nats.aio.msg import Msg
from traffic import Collector, Pipeline, envelope, iso_ms, read_back, stats

SCENARIOS = ("sigkill", "sigterm")
SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM}
POLL = 0.02  # s between /readyz polls while waiting for a takeover
EVENTS = re.compile(r"leader\.|engine\.term|daemon\.|grace_expired|Traceback|ERROR|WARNING")


def name(daemon: Daemon) -> str:
    return daemon.env["SCHEDULER_INSTANCE_ID"]


class Arrivals(Collector):
    """The Collector, also keeping every arrival's wall time per task id, grouped by rep tag."""

    def __init__(self, js: Any) -> None:
        super().__init__(js, "BENCH", "mq.bench.>")
        self.seen: dict[str, list[float]] = defaultdict(list)
        self.per_tag: dict[str, set[str]] = defaultdict(set)

    async def _on_msg(self, msg: Msg) -> None:
        arrival = time.time()
        task_id = (msg.headers or {}).get("Nats-Msg-Id") or json.loads(msg.data)["id"]
        self.seen[task_id].append(arrival)
        self.per_tag[task_id.rsplit("-", 1)[0]].add(task_id)
        await super()._on_msg(msg)

    async def wait_tag(self, tag: str, count: int, timeout: float) -> bool:
        """True once `count` distinct ids of rep `tag` arrived; False when `timeout` s pass."""
        deadline = time.monotonic() + max(timeout, 0.01)
        while len(self.per_tag[tag]) < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True


class LeaseWatch:
    """Every write to the lease key as a KV watcher sees it: (store time, operation, holder)."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str, str | None]] = []
        self._watcher: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, js: Any, bucket: str = "scheduler_leader") -> LeaseWatch:
        self._watcher = await (await js.key_value(bucket)).watch("leader")
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for entry in self._watcher:
            if entry is None:
                continue
            holder = None
            if entry.operation is None and entry.value:
                try:
                    holder = json.loads(entry.value).get("instance")
                except ValueError:
                    pass
            at = entry.created.timestamp() if entry.created else time.time()
            self.seen.append((at, entry.operation or "PUT", holder))

    def around(self, killed: str, successor: str | None, t_kill: float) -> dict[str, Any]:
        """Last renew of the killed leader before the kill; the successor's first write after."""
        renews = [at for at, op, who in self.seen if who == killed and at <= t_kill]
        taken = [at for at, op, who in self.seen if who == successor and at > t_kill]
        ops = sorted({op for at, op, _ in self.seen if at > t_kill and op != "PUT"})
        out: dict[str, Any] = {"lease_ops_seen_after_kill": ops}
        if renews:
            out["kill_after_last_renew_s"] = round(t_kill - renews[-1], 3)
        if renews and taken:
            out["lease_written_after_last_renew_s"] = round(taken[0] - renews[-1], 3)
        if taken:
            out["lease_written_after_kill_s"] = round(taken[0] - t_kill, 3)
        return out

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._watcher is not None:
            await self._watcher.stop()


class Fleet:
    """The daemons of the run (instance ids fo-1, fo-2, ...); all stopped on exit."""

    def __init__(self, env: Env, ttl: float, http: aiohttp.ClientSession) -> None:
        self.env, self.ttl, self.http = env, ttl, http
        self.all: list[Daemon] = []

    def alive(self) -> list[Daemon]:
        return [d for d in self.all if d.proc is not None and d.proc.poll() is None]

    async def readyz(self, daemon: Daemon) -> dict[str, Any] | None:
        """The /readyz body (200 or 503), or None when the daemon does not answer."""
        return await self.get(daemon, "/readyz")

    async def get(self, daemon: Daemon, path: str) -> dict[str, Any] | None:
        try:
            url = f"http://127.0.0.1:{daemon.http}{path}"
            async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                return dict(await r.json())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    async def ensure(self, count: int = 2, timeout: float = 40) -> None:
        """Start fresh daemons until `count` run; bounded wait until each is ready."""
        fresh = []
        while len(self.alive()) < count:
            daemon = Daemon(
                self.env,
                lease_ttl=f"{self.ttl:g}",
                instance_id=f"fo-{len(self.all) + 1}",
                log_level="INFO",
            )
            self.all.append(daemon)
            fresh.append(daemon.start(wait_ready=False))
        deadline = time.monotonic() + timeout
        for daemon in fresh:
            while not ((await self.readyz(daemon)) or {}).get("ready"):
                if daemon.proc is None or daemon.proc.poll() is not None:
                    raise RuntimeError(f"daemon {name(daemon)} exited: {daemon.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"daemon {name(daemon)} not ready in {timeout:.0f} s: {daemon.log_tail()}"
                    )
                await asyncio.sleep(0.05)

    async def one_leader(self, timeout: float) -> tuple[Daemon, list[Daemon], dict[str, Any]]:
        """Bounded wait until exactly one running daemon says leader and the rest standby."""
        deadline = time.monotonic() + timeout
        roles: dict[str, Any] = {}
        while time.monotonic() < deadline:
            daemons = self.alive()
            bodies = [await self.readyz(d) for d in daemons]
            roles = {name(d): (b or {}).get("role") for d, b in zip(daemons, bodies, strict=True)}
            leaders = [d for d in daemons if roles[name(d)] == "leader"]
            if len(leaders) == 1 and all(b and b.get("ready") for b in bodies):
                info = await self.get(leaders[0], "/v1/leader") or {}
                return leaders[0], [d for d in daemons if d is not leaders[0]], info
            await asyncio.sleep(0.1)
        raise RuntimeError(f"no single leader within {timeout:.0f} s; roles seen: {roles}")

    def stop_all(self) -> None:
        """SIGTERM to every daemon still running, then a bounded wait, then SIGKILL."""
        running = self.alive()
        for daemon in running:
            assert daemon.proc is not None
            daemon.proc.terminate()
        deadline = time.monotonic() + 30
        for daemon in running:
            assert daemon.proc is not None
            try:
                daemon.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                daemon.proc.kill()
                daemon.proc.wait(5)


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """Per thread (name#tid): CPU seconds and context switches (the wakeups, roughly) so far."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except OSError:
            continue
        fields = rest.split()
        out[f"{head.split('(', 1)[1]}#{tid}"] = (
            (int(fields[11]) + int(fields[12])) / tick,
            switches,
        )
    return out


def events(daemon: Daemon, since: float, until: float) -> list[str]:
    """Leadership and lifecycle lines of a daemon's log between two wall times."""
    out = []
    try:
        with open(daemon.log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if since <= at <= until and EVENTS.search(line):
            out.append(f"{name(daemon)}: {line[:300]}")
    return out


async def intake_empty(js: Any, deadline: float) -> float | None:
    """Seconds until MQ_DELAY holds no message, or None when `deadline` (wall) passes first."""
    start = time.time()
    while time.time() < deadline:
        if (await js.stream_info("MQ_DELAY")).state.messages == 0:
            return round(time.time() - start, 3)
        await asyncio.sleep(0.05)
    return None


async def one_rep(
    a: argparse.Namespace,
    fleet: Fleet,
    nc: Any,
    arrivals: Arrivals,
    lease: LeaseWatch,
    scenario: str,
    rep: int,
) -> dict[str, Any]:
    await fleet.ensure(2)
    leader, others, before_info = await fleet.one_leader(a.ttl * 3 + 10)
    standbys = {name(d): d for d in others}
    tag = f"{scenario}{rep}-{uuid.uuid4().hex[:6]}"
    count = int(a.rate * (a.before + a.after))
    t0 = time.time()
    first_due = t0 + a.lead
    kill_at = first_due + a.before
    dues: dict[str, float] = {}
    pipe = await Pipeline(nc).start()
    for i in range(count):
        task_id = f"{tag}-{i}"
        due = first_due + i / a.rate
        dues[task_id] = int(due * 1000) / 1000  # what the envelope says (ms, truncated)
        await pipe.publish("mq.delay.bench.x", envelope(task_id, due, t0), {"Nats-Msg-Id": task_id})
    producer = await pipe.drain()
    publish_s = round(time.time() - t0, 3)
    intake_s = await intake_empty(nc.jetstream(), kill_at - 0.05)
    await asyncio.sleep(max(0.0, kill_at - time.time()))

    # the kill, then the takeover: poll every standby's /readyz until one says leader
    proc = leader.proc
    assert proc is not None

    def exited() -> float | None:
        try:
            proc.wait(a.ttl * 2 + 40)  # a SIGTERM exit is graceful; shutdown grace is 20 s
            return time.time()
        except subprocess.TimeoutExpired:
            return None

    t_kill = time.time()
    os.kill(leader.pid, SIGNALS[scenario])
    exit_task = asyncio.create_task(asyncio.to_thread(exited))
    successor, takeover_s = None, None
    limit = t_kill + a.ttl * 2 + 10
    while time.time() < limit and successor is None:
        for sname, daemon in standbys.items():
            if ((await fleet.readyz(daemon)) or {}).get("role") == "leader":
                takeover_s, successor = round(time.time() - t_kill, 3), sname
                break
        else:
            await asyncio.sleep(POLL)
    if successor is None:
        print(
            f"failover: {scenario} rep {rep}: no standby of {sorted(standbys)} became leader "
            f"within {limit - t_kill:.0f} s of the kill of {name(leader)}",
            file=sys.stderr,
        )
    after_info = await fleet.get(standbys[successor], "/v1/leader") if successor else None

    # every task of the rep, bounded; the old leader gone (a SIGTERM exit is graceful, bounded)
    last_due = first_due + (count - 1) / a.rate
    complete = await arrivals.wait_tag(tag, count, last_due + a.grace - time.time())
    exit_at = await exit_task
    if exit_at is None:
        print(f"failover: {name(leader)} still running long after {scenario}", file=sys.stderr)
        proc.kill()
        await asyncio.to_thread(proc.wait, 5)
    exit_s = None if exit_at is None else round(exit_at - t_kill, 3)
    await asyncio.sleep(0.5)  # late publishes, if any, reach the stream before the read-back
    result = classify(tag, dues, arrivals, await read_back(fleet.env.nats_url, "BENCH"), t_kill)
    if not complete:
        print(
            f"failover: {scenario} rep {rep}: only {len(arrivals.per_tag[tag])} of {count} tasks "
            f"arrived within {a.grace:.0f} s after the last due instant; lost "
            f"{result['lost']}; successor {successor}",
            file=sys.stderr,
        )
    log_from, log_to = t_kill - 1.5, time.time()
    return {
        "rep": rep,
        "killed": name(leader),
        "epoch_before": before_info.get("epoch"),
        "successor": successor,
        "epoch_after": (after_info or {}).get("epoch"),
        "killed_at": iso_ms(t_kill),
        "takeover_s": takeover_s,
        **lease.around(name(leader), successor, t_kill),
        "old_leader_exit_s": exit_s,
        "old_leader_returncode": proc.returncode,
        "tasks": count,
        "complete": complete,
        **result,
        "publish_s": publish_s,
        "intake_empty_after_publish_s": intake_s,
        "producer_errors": producer["errors"] + producer["unacked"],
        "events": events(leader, log_from, log_to)
        + [e for d in standbys.values() for e in events(d, log_from, log_to)],
    }


def classify(
    tag: str, dues: dict[str, float], arrivals: Arrivals, stored: list[Any], t_kill: float
) -> dict[str, Any]:
    """Delivered once / lost / doubled / early for one rep's tasks; gap and lateness."""
    by_msg_id: dict[str, list[Any]] = defaultdict(list)
    by_payload: dict[str, int] = defaultdict(int)
    for m in stored:
        doc = json.loads(m.data)
        pid = doc.get("id", "")
        mid = (m.headers or {}).get("Nats-Msg-Id") or pid
        if mid in dues:
            by_msg_id[mid].append(m)
        if pid in dues:
            by_payload[pid] += 1
    lost = [t for t in dues if not by_msg_id.get(t)]
    doubled = [t for t in dues if len(by_msg_id.get(t, ())) > 1]
    early_store, retried = 0, 0
    for task_id, msgs in by_msg_id.items():
        for m in msgs:
            early_store += m.metadata.timestamp.timestamp() < dues[task_id]
            retried += (m.headers or {}).get("Mq-Attempt", "1") != "1"
    first = sorted((arrivals.seen[t][0], t) for t in dues if arrivals.seen.get(t))
    late = [at - dues[t] for at, t in first]
    gap, gap_at = 0.0, 0.0
    for (prev, _), (at, _) in pairwise(first):
        if at - prev > gap:
            gap, gap_at = at - prev, prev
    return {
        "gap_s": round(gap, 3),
        "gap_from_kill_s": round(gap_at - t_kill, 3) if first else None,
        "max_lateness_s": round(max(late), 3) if late else None,
        "lateness_ms": stats([x * 1000 for x in late]),
        "delivered_once": sum(1 for t in dues if len(by_msg_id.get(t, ())) == 1),
        "lost": len(lost),
        "lost_ids": lost[:5],
        "doubled": len(doubled),
        "doubled_by_payload_id": sum(1 for n in by_payload.values() if n > 1),
        "doubled_at_consumer": sum(1 for t in dues if len(arrivals.seen.get(t, ())) > 1),
        "early": sum(1 for x in late if x < 0),
        "early_store_time": early_store,
        "attempt_above_1": retried,
    }


async def idle_cpu(a: argparse.Namespace, fleet: Fleet) -> dict[str, Any]:
    """CPU% of the leader and of a standby over `idle_seconds` with nothing to deliver.

    Per thread as well, with context switches per second (how often each thread wakes up).
    """
    await fleet.ensure(2)
    leader, others, info0 = await fleet.one_leader(a.ttl * 3 + 10)
    standby = others[0]
    await asyncio.sleep(a.settle)  # start-up, term start and the previous load die down
    w0 = time.monotonic()
    c0 = cpu_seconds(leader.pid), cpu_seconds(standby.pid)
    t0 = threads(leader.pid), threads(standby.pid)
    await asyncio.sleep(a.idle_seconds)
    c1 = cpu_seconds(leader.pid), cpu_seconds(standby.pid)
    t1 = threads(leader.pid), threads(standby.pid)
    wall = time.monotonic() - w0
    info1 = await fleet.get(leader, "/v1/leader") or {}
    body = await fleet.readyz(leader) or {}

    def per_thread(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for key, (cpu, switches) in after.items():
            cpu0, switches0 = before.get(key, (0.0, 0))
            if cpu > cpu0 or switches > switches0:
                out[key] = {
                    "cpu_pct": round((cpu - cpu0) / wall * 100, 2),
                    "wakeups_per_s": round((switches - switches0) / wall, 1),
                }
        return out

    return {
        "leader": name(leader),
        "standby": name(standby),
        "wall_s": round(wall, 2),
        "leader_cpu_pct": round((c1[0] - c0[0]) / wall * 100, 3),
        "standby_cpu_pct": round((c1[1] - c0[1]) / wall * 100, 3),
        "leader_threads": per_thread(t0[0], t1[0]),
        "standby_threads": per_thread(t0[1], t1[1]),
        "epoch_start": info0.get("epoch"),
        "epoch_end": info1.get("epoch"),
        "same_leader_throughout": info0.get("epoch") == info1.get("epoch")
        and body.get("role") == "leader",
    }


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in reps if "error" not in r]

    def agg(key: str) -> dict[str, float | None]:
        values = [r[key] for r in ok if r.get(key) is not None]
        if not values:
            return {"median": None, "max": None}
        return {"median": round(statistics.median(values), 3), "max": round(max(values), 3)}

    return {
        "reps": len(reps),
        "errors": len(reps) - len(ok),
        "gap_s": agg("gap_s"),
        "max_lateness_s": agg("max_lateness_s"),
        "takeover_s": agg("takeover_s"),
        "lease_written_after_last_renew_s": agg("lease_written_after_last_renew_s"),
        "old_leader_exit_s": agg("old_leader_exit_s"),
        "lost": sum(r["lost"] for r in ok),
        "doubled": sum(r["doubled"] + r["doubled_by_payload_id"] for r in ok),
        "doubled_at_consumer": sum(r["doubled_at_consumer"] for r in ok),
        "early": sum(r["early"] + r["early_store_time"] for r in ok),
        "complete": all(r["complete"] for r in ok) and len(ok) == len(reps),
        "successors": [r["successor"] for r in reps if "successor" in r],
    }


async def measure(a: argparse.Namespace, parts: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with servers() as env:
        os.makedirs(os.path.join(env.workdir, "no-schedules"))  # no cron jobs, and no error
        nc = await nats.connect(env.nats_url)
        http = aiohttp.ClientSession()
        fleet = Fleet(env, a.ttl, http)
        try:
            js = nc.jetstream()
            await add_target_stream(js)
            arrivals = await Arrivals(js).start()
            await fleet.ensure(2)  # the first daemon provisions the lease bucket
            lease = await LeaseWatch().start(js)
            for scenario in [s for s in SCENARIOS if s in parts]:
                reps: list[dict[str, Any]] = []
                for rep in range(a.reps):
                    try:
                        r = await one_rep(a, fleet, nc, arrivals, lease, scenario, rep)
                    except (RuntimeError, TimeoutError, nats.errors.Error) as exc:
                        print(f"failover: {scenario} rep {rep} failed: {exc}", file=sys.stderr)
                        r = {"rep": rep, "error": str(exc)[:2000]}
                    reps.append(r)
                    print(
                        f"failover: {scenario} rep {rep}: gap {r.get('gap_s')} s, takeover "
                        f"{r.get('takeover_s')} s ({r.get('killed')} -> {r.get('successor')}), "
                        f"lost {r.get('lost')} doubled {r.get('doubled')} early {r.get('early')}",
                        file=sys.stderr,
                    )
                results[scenario] = summarize(reps) | {"per_rep": reps}
            await arrivals.stop()
            await lease.stop()
            if "cpu" in parts:
                results["idle_cpu"] = await idle_cpu(a, fleet)
        finally:
            fleet.stop_all()
            await http.close()
            await nc.close()
            if a.logs:
                os.makedirs(a.logs, exist_ok=True)
                for daemon in fleet.all:
                    shutil.copy(daemon.log_path, os.path.join(a.logs, f"{name(daemon)}.log"))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each scenario")
    ap.add_argument("--ttl", type=float, default=3, help="SCHEDULER_LEASE_TTL of every daemon")
    ap.add_argument("--rate", type=float, default=100, help="tasks due per second")
    ap.add_argument("--lead", type=float, default=2, help="s from publishing to the first due")
    ap.add_argument("--before", type=float, default=4, help="s of due tasks before the kill")
    ap.add_argument("--after", type=float, default=8, help="s of due tasks after the kill")
    ap.add_argument("--grace", type=float, default=15, help="s to wait after the last due")
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--settle", type=float, default=3, help="s idle before the CPU window")
    ap.add_argument("--only", default="", help="comma-separated subset of sigkill,sigterm,cpu")
    ap.add_argument("--logs", default=None, help="copy the daemons' logs into this folder")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    parts = [p for p in (*SCENARIOS, "cpu") if not a.only or p in a.only.split(",")]
    r = run(measure(a, parts))

    ttl = a.ttl
    targets = {
        "sigkill_gap_median_s": ttl + 1,
        "sigkill_gap_max_s": ttl + 1.5,
        "sigterm_gap_median_s": 0.5,
        "sigterm_gap_max_s": 0.5,
        "lost": 0,
        "doubled": 0,
        "early": 0,
        "leader_idle_cpu_pct_below": 1.0,
    }
    checks: dict[str, bool] = {}
    line = []
    for scenario, limit in (("sigkill", (ttl + 1, ttl + 1.5)), ("sigterm", (0.5, 0.5))):
        if scenario not in r:
            continue
        s = r[scenario]
        gap, take = s["gap_s"], s["takeover_s"]
        checks[f"{scenario}_gap_median"] = (gap["median"] or 1e9) <= limit[0]
        checks[f"{scenario}_gap_max"] = (gap["max"] or 1e9) <= limit[1]
        checks[f"{scenario}_clean"] = bool(
            s["complete"] and s["lost"] == 0 and s["doubled"] == 0 and s["early"] == 0
        )
        line.append(
            f"{scenario}: gap med {gap['median']} max {gap['max']} s, takeover med "
            f"{take['median']} max {take['max']} s, lost {s['lost']} doubled {s['doubled']} "
            f"early {s['early']} errors {s['errors']}"
        )
    if "idle_cpu" in r:
        c = r["idle_cpu"]
        checks["leader_idle_cpu"] = c["leader_cpu_pct"] < 1.0
        line.append(f"idle CPU leader {c['leader_cpu_pct']} % standby {c['standby_cpu_pct']} %")
    r["checks"] = checks
    params = {k: v for k, v in vars(a).items() if k not in ("out", "logs")}
    passed = bool(checks) and all(checks.values())
    report("failover", params, r, targets, passed, "; ".join(line), a.out)


if __name__ == "__main__":
    main()
