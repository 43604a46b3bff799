"""The phases of edge_attacks.py: attacker children, the quiet between them, what the daemons
did meanwhile (lease, log lines, CPU), and the newest delivery (have the daemons caught up?)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import nats
from common import Daemon, Env, _proc_stats
from edge_attackers import ATTACKS, Target

READ_TOKEN = "bench-read-token"
ADMIN_TOKEN = "bench-admin-token"
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "edge_attacks.py")


@dataclass(frozen=True)
class Phase:
    name: str  # "quiet", a vector's name, or "after_<vector>"
    start: float  # wall time
    end: float
    vector: str | None = None  # the attacker run in this phase


def log_lines(d: Daemon, needle: str) -> int:
    """How many lines of the daemon's log so far hold `needle`."""
    try:
        with open(d.log_path, errors="replace") as f:
            return sum(1 for line in f if needle in line)
    except OSError:
        return 0


async def lease_holder(conn: asyncpg.Connection) -> tuple[int, str]:
    row = await conn.fetchrow("SELECT epoch, instance FROM leadership WHERE id = 1")
    return (int(row["epoch"]), str(row["instance"])) if row else (0, "")


def cpu_of(d: Daemon, edge_only: bool = False) -> float:
    """CPU seconds of the daemon's process and of every process under it (`scheduler run` may
    run its roles as child processes), reaped children included; with `edge_only`, of its edge
    processes alone (`--role edge` on their command line) and what runs under them."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {pid: (ppid, fields) for pid, ppid, fields in _proc_stats()}
    total, seen, todo = 0.0, set(), [(d.pid, False)]
    while todo:
        pid, under_edge = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        under_edge = under_edge or _is_edge(pid)
        if under_edge or not edge_only:
            fields = stats[pid][1]
            total += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
        todo += [(c, under_edge) for c, (ppid, _) in stats.items() if ppid == pid]
    return total


def _is_edge(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"--role\0edge" in f.read()
    except OSError:
        return False


async def last_delivery(js: Any) -> tuple[float, float] | None:
    """(store time, due time) of the newest message in BENCH, None while it is empty."""
    last = (await js.stream_info("BENCH")).state.last_seq
    if not last:
        return None
    m = await js.get_msg("BENCH", last)
    return m.time.timestamp(), due_of((m.headers or {}).get("Mq-Scheduled-For"), m.data)


def due_of(scheduled_for: str | None, data: bytes) -> float:
    text = scheduled_for or json.loads(data)["delay_until"]
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def start_attacker(vector: str, target: Target, out: str, nice: int = 0) -> subprocess.Popen[bytes]:
    """The attacker's child process; it says `ready` once imported, then waits for its window
    (`start until` on stdin). `nice` > 0 runs it at that nice value (`--attacker-nice`)."""
    args = [sys.executable, SCRIPT, "--attack", vector, "--target-json"]
    args += [json.dumps(dataclasses.asdict(target)), "--out", out]
    if nice > 0:
        args = ["nice", "-n", str(nice), *args]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


async def open_window(child: subprocess.Popen[bytes], not_before: float, seconds: float) -> Phase:
    """Wait (bounded) for the child's `ready`, then give it its window: from `not_before` (or
    0.1 s from now, if later) for `seconds`."""
    assert child.stdin is not None and child.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)
    if line.strip() != b"ready":
        raise RuntimeError(f"attacker did not start: {line!r}")
    start = max(not_before, time.time() + 0.1)
    child.stdin.write(f"{start} {start + seconds}\n".encode())
    child.stdin.close()
    return Phase("", start, start + seconds)


def aimed(daemons: list[Daemon], holder: str, nats_url: str) -> Target:
    """The attack's target: the lease holder's ports first (its metrics port), then the rest."""
    ordered = sorted(daemons, key=lambda d: d.env["SCHEDULER_INSTANCE_ID"] != holder)
    return Target([d.http for d in ordered], ordered[0].metrics_port, nats_url,
                  READ_TOKEN, ADMIN_TOKEN)  # fmt: skip


class Watch:
    """What the daemons did over a phase: `leader.lost` and ERROR lines in their logs, the
    lease holders (epoch row in PostgreSQL) sampled every 0.5 s, their CPU seconds."""

    def __init__(self, daemons: list[Daemon], conn: asyncpg.Connection) -> None:
        self.daemons, self.conn = daemons, conn
        self.lost = [log_lines(d, "leader.lost") for d in daemons]
        self.errors = [log_lines(d, " ERROR ") for d in daemons]
        self.cpu = [cpu_of(d) for d in daemons]
        self.edge_cpu = [cpu_of(d, edge_only=True) for d in daemons]
        self.pids = [d.pid for d in daemons]
        self.holders: set[tuple[int, str]] = set()
        self.exited: dict[str, int | None] = {}  # instance id -> exit status, seen meanwhile

    def check_exits(self) -> None:
        for name, d in zip(self.names(), self.daemons, strict=True):
            if d.proc is not None and d.proc.poll() is not None:
                self.exited[name] = d.proc.returncode

    async def holder(self) -> str:
        """Sample the lease holder; its instance id."""
        epoch, instance = await lease_holder(self.conn)
        self.holders.add((epoch, instance))
        return instance

    async def until(self, done: Callable[[], Awaitable[bool]]) -> None:
        while True:
            self.check_exits()
            if await done():
                break
            await self.holder()
            await asyncio.sleep(0.5)
        await self.holder()
        self.check_exits()

    def result(self) -> dict[str, Any]:
        lost = int(sum(since(self.daemons, self.lost, lambda d: log_lines(d, "leader.lost"))))
        errors = since(self.daemons, self.errors, lambda d: log_lines(d, " ERROR "))
        # a daemon started again meanwhile: its new process's CPU only; a dead one: None
        cpu: list[float | None] = []
        edge: list[float | None] = []
        for d, c, e, pid in zip(self.daemons, self.cpu, self.edge_cpu, self.pids, strict=True):
            alive = d.proc is not None and d.proc.poll() is None
            same = d.pid == pid
            cpu.append(round(cpu_of(d) - (c if same else 0.0), 2) if alive else None)
            edge.append(round(cpu_of(d, True) - (e if same else 0.0), 2) if alive else None)
        exited = [f"{n} (exit {rc})" for n, rc in sorted(self.exited.items())]
        return {
            "lease_kept": lost == 0 and len(self.holders) == 1 and not exited,
            "exited": exited,
            "leader_lost_lines": lost,
            "lease_holders_seen": sorted(f"{inst}@{epoch}" for epoch, inst in self.holders),
            "daemon_cpu_seconds": dict(zip(self.names(), cpu, strict=True)),
            # of which the edge processes' (an edge restarted meanwhile: its new process's)
            "edge_cpu_seconds": dict(zip(self.names(), edge, strict=True)),
            "daemon_error_lines": dict(zip(self.names(), errors, strict=True)),
        }

    def names(self) -> list[str]:
        return [d.env["SCHEDULER_INSTANCE_ID"] for d in self.daemons]


def since(
    daemons: list[Daemon], before: list[int] | list[float], now: Callable[[Daemon], float]
) -> list[float]:
    """`now(d)` minus its value `before`, per daemon."""
    return [round(now(d) - b, 2) for d, b in zip(daemons, before, strict=True)]


async def attack_phase(
    vector: str,
    not_before: float,
    a: argparse.Namespace,
    daemons: list[Daemon],
    env: Env,
    conn: asyncpg.Connection,
) -> tuple[Phase, dict[str, Any]]:
    """Start the vector's attacker 1.5 s ahead (its imports), aimed at whoever holds the lease
    then, and give it `--phase-seconds` from `not_before` (or once it is ready); watch the
    daemons until the phase ends and the attacker has stopped."""
    out = os.path.join(env.workdir, f"attack-{vector}.json")
    await asyncio.sleep(max(0.0, not_before - time.time() - 1.5))
    watch = Watch(daemons, conn)
    holder = await watch.holder()
    child = start_attacker(vector, aimed(daemons, holder, env.nats_url), out, a.attacker_nice)
    try:
        window = await open_window(child, not_before, a.phase_seconds)
    except (RuntimeError, TimeoutError):
        child.kill()
        child.wait(5)
        raise
    p = Phase(vector, window.start, window.end, vector)
    await watch.until(lambda: _past(p.end))
    attacker = await attacker_result(child, out, p.end - time.time() + 30)
    return p, watch.result() | {"attacked": holder, "attacker": attacker}


async def quiet_phase(
    start: float,
    daemons: list[Daemon],
    conn: asyncpg.Connection,
    js: Any,
    least: float,
    most: float,
) -> tuple[float, dict[str, Any]]:
    """A quiet phase from `start` of at least `least` s that lasts (up to `most` s) until the
    daemons have caught up (the newest delivery was due less than 0.2 s ago); its end and
    what the daemons did meanwhile. A daemon that exited is started again at once."""
    watch = Watch(daemons, conn)
    restarted: list[str] = []

    async def done() -> bool:
        if any(d.proc is not None and d.proc.poll() is not None for d in daemons):
            restarted.extend(await revive(daemons, conn))  # as a supervisor would
        now = time.time()
        if now >= start + most:
            return True
        if now < start + least:
            return False
        newest = await last_delivery(js)
        return newest is not None and now - newest[1] < 0.2

    await watch.until(done)
    end = time.time()
    return end, watch.result() | {"seconds": round(end - start, 1), "restarted": restarted}


async def revive(daemons: list[Daemon], conn: asyncpg.Connection, within: float = 30) -> list[str]:
    """Start again every daemon that exited (as its supervisor would), and wait (bounded) until
    a live one holds the lease; the instance ids restarted."""
    dead = [d for d in daemons if d.proc is not None and d.proc.poll() is not None]
    for d in dead:
        await asyncio.to_thread(d.start)
    names = {d.env["SCHEDULER_INSTANCE_ID"] for d in dead}
    epoch0, holder0 = await lease_holder(conn)
    deadline = time.time() + within
    while holder0 in names and time.time() < deadline:  # the office of a dead daemon
        if (await lease_holder(conn))[0] > epoch0:
            break
        await asyncio.sleep(0.1)
    return sorted(names)


async def _past(t: float) -> bool:
    return time.time() >= t


async def attacker_result(child: subprocess.Popen[bytes], out: str, within: float) -> Any:
    try:
        await asyncio.to_thread(child.wait, max(within, 1.0))
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(5)
        return {"error": "attacker did not end in time: killed"}
    try:
        return json.loads(await asyncio.to_thread(_read, out))
    except (OSError, ValueError):
        return {"error": f"attacker exited {child.returncode} without a result"}


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


async def run_phases(
    a: argparse.Namespace, env: Env, daemons: list[Daemon], first: float, load_end: float
) -> tuple[list[Phase], dict[str, Any], list[str]]:
    """The quiet phase at `first`, then each vector and the quiet after it (which lasts until
    the daemons caught up); a vector the load would not cover to its end is skipped."""
    vectors = a.vectors.split(",") if a.vectors else list(ATTACKS)
    conn = await asyncpg.connect(env.database_url)
    nc = await nats.connect(env.nats_url)
    phases: list[Phase] = []
    watched: dict[str, Any] = {}
    skipped: list[str] = []
    try:
        js = nc.jetstream()
        await asyncio.sleep(max(0.0, first - time.time()))
        end, watched["quiet"] = await quiet_phase(
            first, daemons, conn, js, a.quiet_seconds, a.quiet_seconds
        )
        phases.append(Phase("quiet", first, end))
        for v in vectors:
            if time.time() + 3 + a.phase_seconds + a.gap_seconds > load_end:
                skipped.append(v)
                continue
            restarted = await revive(daemons, conn)
            p, watched[v] = await attack_phase(v, end, a, daemons, env, conn)
            watched[v]["restarted_before"] = restarted
            if phases[-1].name.startswith("after_"):  # the attacker's start-up: still quiet
                phases[-1] = dataclasses.replace(phases[-1], end=p.start)
            end, watched[f"after_{v}"] = await quiet_phase(
                p.end, daemons, conn, js, a.gap_seconds, a.max_recovery
            )
            phases += [p, Phase(f"after_{v}", p.end, end)]
    finally:
        await nc.close()
        await conn.close()
    return phases, watched, skipped
