"""Shared pieces of the benchmarks: servers, the daemon process, /proc sampling, JSON reports.

Everything runs on this host: a fresh nats-server (and PostgreSQL) in a temp dir on free loopback
ports, and the daemon as a subprocess (`python -m scheduler run`). Load and measurement (the paced
producer, the live collector, statistics) are in traffic.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.js.api import StorageType, StreamConfig
from traffic import STOPPING

from scheduler.daemon.embedded import NatsServer, Postgres, free_port

T = TypeVar("T")


@dataclass
class Env:
    nats_url: str
    database_url: str
    workdir: str
    nats_pid: int = 0  # this run's nats-server
    pg_pid: int = 0  # this run's postmaster (its backends are its children)


@contextmanager
def servers(postgres: bool = True) -> Iterator[Env]:
    """A fresh nats-server (and PostgreSQL) in a temp dir; stopped and removed afterwards."""
    workdir = tempfile.mkdtemp(prefix="mqs-bench-")
    ns: NatsServer | None = None
    pg: Postgres | None = None
    try:
        ns = NatsServer(os.path.join(workdir, "nats")).start()
        pg = Postgres(os.path.join(workdir, "pg")).start() if postgres else None
        pg_pid = postmaster_pid(os.path.join(workdir, "pg")) if pg else 0
        nats_pid = ns.proc.pid if ns.proc is not None else 0
        yield Env(ns.url, pg.url if pg else "", workdir, nats_pid, pg_pid)
    finally:
        for server in (pg, ns):
            if server is not None:
                server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def postmaster_pid(data_dir: str) -> int:
    """The postmaster's pid from `postmaster.pid` in `data_dir` (0 if unreadable)."""
    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            return int(f.readline().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def rss_mb(pid: int) -> float:
    """Resident set size of `pid` in MiB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The direct children of `pid` (none once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def cpu_by_command(names: tuple[str, ...] = ("nats-server", "postgres")) -> dict[str, float]:
    """CPU seconds so far of every live process whose command name is one of `names`, summed
    per name (PostgreSQL's backends and the nats-server of this run and any other)."""
    out = dict.fromkeys(names, 0.0)
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.find("(") + 1 : text.rfind(")")]
        if comm in out:
            fields = text.rsplit(")", 1)[1].split()
            out[comm] += (int(fields[11]) + int(fields[12])) / tick
    return out


def _proc_stats() -> Iterator[tuple[int, int, list[str]]]:
    """(pid, ppid, the stat fields after the command name) of every live process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry), int(fields[1]), fields


def cpu_of_servers(env: Env) -> dict[str, float]:
    """CPU seconds so far of this run's nats-server and of its PostgreSQL: the postmaster, its
    live children (backends, walwriter, ...) and the children it already reaped (cutime), so other
    sessions' servers on the host are not counted."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"nats-server": 0.0, "postgres": 0.0}
    for pid, ppid, fields in _proc_stats():
        own = int(fields[11]) + int(fields[12])
        if pid == env.nats_pid:
            out["nats-server"] += own / tick
        elif pid == env.pg_pid:
            out["postgres"] += (own + int(fields[13]) + int(fields[14])) / tick
        elif env.pg_pid and ppid == env.pg_pid:
            out["postgres"] += own / tick
    return out


def main_thread_sched(pid: int) -> tuple[float, float]:
    """Seconds the main thread of `pid` (the daemon's event loop) has run on a CPU, and waited
    runnable for one (`/proc/<pid>/schedstat`): a loop that waits much is CPU-starved, not idle."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return 0.0, 0.0
    return run_ns / 1e9, wait_ns / 1e9


def cpu_seconds_or_zero(pid: int) -> float:
    """`cpu_seconds(pid)`, or 0 once the process is gone."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def own_cpu_seconds() -> float:
    """CPU seconds of this process (the bench's producer and collector)."""
    t = os.times()
    return t.user + t.system


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy (not idle or waiting for I/O) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """Who used the cores from construction to `finish()`: the daemon, this run's nats-server
    and PostgreSQL (every nats-server and postgres process on the host if the run's pids are
    unknown), the bench itself, any `extra` processes by name, the whole machine, and the
    daemon's event loop."""

    def __init__(
        self,
        daemon: Daemon | None,
        extra: dict[str, int] | None = None,
        env: Env | None = None,
    ) -> None:
        self.daemon = daemon
        self.env = daemon.servers if daemon is not None else env
        self.extra = dict(extra or {})
        self.t0 = time.time()
        self.cpu0 = self._cpu()
        self.busy0 = machine_busy_seconds()
        self.sched0 = main_thread_sched(daemon.pid) if daemon is not None else (0.0, 0.0)

    def _cpu(self) -> dict[str, float]:
        env = self.env
        servers_cpu = cpu_of_servers(env) if env is not None and env.nats_pid else cpu_by_command()
        out = {"daemon": self.daemon.cpu_seconds()} if self.daemon is not None else {}
        out |= servers_cpu | {"bench": own_cpu_seconds()}
        return out | {name: cpu_seconds_or_zero(pid) for name, pid in self.extra.items()}

    def finish(self) -> dict[str, Any]:
        """CPU seconds per process, the machine's busy fraction, and the shares of the window
        the daemon's loop ran and waited runnable for a core."""
        wall = max(time.time() - self.t0, 1e-9)
        cpu = {k: v - self.cpu0[k] for k, v in self._cpu().items()}
        busy = machine_busy_seconds() - self.busy0
        now = main_thread_sched(self.daemon.pid) if self.daemon is not None else (0.0, 0.0)
        ran, waited = (b - a for a, b in zip(self.sched0, now, strict=True))
        loop = {
            "loop_running_fraction": round(ran / wall, 3),
            "loop_runqueue_wait_fraction": round(waited / wall, 3),
        }
        return {
            "wall_seconds": round(wall, 2),
            "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
            # the share of one core each used over the window (2.0 would be both cores)
            "cpu_share_of_a_core": {k: round(v / wall, 3) for k, v in cpu.items()},
            "machine_busy_seconds": round(busy, 2),
            "machine_busy_fraction": round(busy / wall / (os.cpu_count() or 1), 3),
        } | (loop if self.daemon is not None else {})


class Daemon:
    """`python -m scheduler run` as a subprocess on free ports; stderr kept in the workdir."""

    def __init__(self, env: Env, **settings: str) -> None:
        self.servers = env
        self.http, self.metrics_port = free_port(), free_port()
        self.env = dict(
            os.environ,
            SCHEDULER_NATS_URL=env.nats_url,
            SCHEDULER_DATABASE_URL=env.database_url,
            SCHEDULER_HTTP_PORT=str(self.http),
            SCHEDULER_METRICS_PORT=str(self.metrics_port),
            SCHEDULER_LOG_LEVEL="WARNING",
            SCHEDULER_SCHEDULES_DIR=os.path.join(env.workdir, "no-schedules"),
        )
        os.makedirs(self.env["SCHEDULER_SCHEDULES_DIR"], exist_ok=True)  # empty: no cron jobs
        self.env.update({f"SCHEDULER_{k.upper()}": v for k, v in settings.items()})
        self.log_path = os.path.join(env.workdir, f"daemon-{self.http}.log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # wall clock, when the process was spawned
        self.cwd: str | None = None  # `python -m` puts its working directory first on sys.path
        self.argv = ["run"]  # the scheduler command line (e.g. `run --role engine`: no edge)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, wait_ready: bool = True, timeout: float = 30) -> Daemon:
        with open(self.log_path, "ab") as log:
            self.started_at = time.time()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "scheduler", *self.argv],
                env=self.env,
                cwd=self.cwd,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        if wait_ready:
            deadline = time.monotonic() + timeout
            while not self.ready():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daemon not ready in {timeout:.0f} s: {self.log_tail()}")
                time.sleep(0.05)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log_tail(self, lines: int = 8) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def cpu_seconds(self) -> float:
        """The engine's CPU and its edge child's (`scheduler run` runs the two roles as two
        processes): what the daemon costs."""
        return cpu_seconds(self.pid) + sum(cpu_seconds_or_zero(c) for c in children(self.pid))

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def metric(self, name: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith((name + " ", name + "{")):
                    return float(line.rsplit(" ", 1)[1])
        return float("nan")

    def histogram(self, name: str) -> dict[str, Any]:
        """Count and bucket-bound quantiles (p50, p99, max bucket) of a daemon histogram, in ms:
        where the daemon itself says the time went."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        buckets: list[tuple[float, float]] = []
        for line in text.splitlines():
            if line.startswith(name + "_bucket{") and 'role="edge"' not in line:
                # the label itself, not the tail of `role="engine"` (which ends in `le="`)
                found = re.search(r'[{,]le="([^"]+)"', line)
                if found is not None:
                    le = found.group(1)
                    bound = float("inf") if le == "+Inf" else float(le)
                    buckets.append((bound, float(line.split()[-1])))
        if not buckets or buckets[-1][1] == 0:
            return {"count": 0}
        total = buckets[-1][1]

        def upto(q: float) -> float:
            return next(le for le, n in buckets if n >= q * total) * 1000

        return {"count": int(total), "p50_le": upto(0.5), "p99_le": upto(0.99),
                "max_le": upto(1.0)}  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def add_target_stream(js: Any, name: str = "BENCH", subject: str = "mq.bench.>") -> None:
    """The workers' stream the daemon delivers to (the daemon provisions none without embedded)."""
    cfg = StreamConfig(
        name=name, subjects=[subject], storage=StorageType.FILE, duplicate_window=120
    )
    await js.add_stream(cfg)


def report(
    name: str,
    params: dict[str, Any],
    results: dict[str, Any],
    targets: dict[str, Any],
    passed: bool,
    summary: str,
    out: str | None = None,
) -> None:
    """The JSON result on stdout (and in `out`), a one-line human summary on stderr."""
    doc = {"bench": name, "params": params, "results": results, "targets": targets, "pass": passed}
    emit(doc, f"{name}: {'PASS' if passed else 'FAIL'} {summary}", out)


def emit(doc: dict[str, Any], summary: str, out: str | None = None) -> None:
    """A bench's JSON document on stdout (and in `out`), its one-line summary on stderr: for
    the measurements without targets, and `report`'s."""
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            f.write(text + "\n")
    print(summary, file=sys.stderr)


def run(coro: Awaitable[T]) -> T:
    """Run on uvloop when installed; Ctrl-C and SIGTERM cancel the run, so every finally runs."""

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None

        def stop() -> None:
            STOPPING.set()
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop)
        return await coro

    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        return runner(main())  # type: ignore[no-any-return]
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: servers and daemon stopped, temp dirs removed", file=sys.stderr)
        raise SystemExit(130) from None


_PG_DB_COUNTERS = (
    "xact_commit", "xact_rollback", "tup_returned", "tup_fetched", "tup_inserted",
    "tup_updated", "tup_deleted", "blks_hit", "blks_read", "sessions", "active_time",
)  # fmt: skip


async def pg_counters(url: str) -> dict[str, float]:
    """PostgreSQL's cumulative counters for the run's database: transactions (each statement
    outside a transaction is one), tuples and blocks, sessions opened and the time spent
    running statements (`active_time`, ms; pg_stat_database), index scans per index and
    sequential scans per table (pg_stat_user_*). Diffed over a window by `pg_counters_delta`,
    they say where the server's CPU went without pg_stat_statements, which the embedded build
    lacks. The snapshot's own statements count too (a few)."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow(
            f"SELECT {', '.join(_PG_DB_COUNTERS)} FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        out = {f"db.{k}": float(row[k]) for k in _PG_DB_COUNTERS}
        for r in await conn.fetch(
            "SELECT relname, seq_scan, coalesce(idx_scan, 0) AS idx_scan, n_tup_ins, "
            "n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
        ):
            for k in ("seq_scan", "idx_scan", "n_tup_ins", "n_tup_upd", "n_tup_hot_upd"):
                out[f"table.{r['relname']}.{k}"] = float(r[k])
            out[f"table.{r['relname']}.n_tup_del"] = float(r["n_tup_del"])
        for r in await conn.fetch(
            "SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes"
        ):
            out[f"index.{r['indexrelname']}.idx_scan"] = float(r["idx_scan"])
            out[f"index.{r['indexrelname']}.idx_tup_read"] = float(r["idx_tup_read"])
        return out
    finally:
        await conn.close()


def pg_counters_delta(
    before: dict[str, float], after: dict[str, float], per: float
) -> dict[str, float]:
    """The counters that moved between two `pg_counters` snapshots, divided by `per` (e.g.
    the tasks of the window: per task), rounded; sorted by name."""
    out = {}
    for key in sorted(after):
        moved = after[key] - before.get(key, 0.0)
        if moved:
            out[key] = round(moved / per, 4)
    return out
