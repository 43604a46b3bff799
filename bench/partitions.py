"""Partitions: N engines (3) over P partitions (64) against one engine, steady and through faults.

Issue 37's "Done when". Each scenario runs on a fresh nats-server and PostgreSQL (migrated,
then P recorded in `partitioning` with an office row per partition, as a new deployment is set
up), with its engines as separate `scheduler run --role engine` processes (no edge: each
process is one engine, so one can be SIGKILLed alone and its CPU read alone from /proc;
instances pe-1, pe-2, ...; lease TTL `--ttl`, 3 s). `--cron-jobs` (32) YAML jobs fire every
second (`misfire: fire_all`, so an occurrence missed during a takeover is still fired once).
The engines start one after another (the first migrates nothing, the bench did) and the run
begins once the partition map (the lease bucket, `read_partition_map`) shows every partition
held in office and each engine holding a share.

The load: a user's client, a child process publishing through nats-py `js.publish_async`
(side_by_side.py's producer), `--rate` (2,000) tasks/s for `--seconds` (180) to the delay
lane, each due `--delay` (2 s) after its planned instant. Intake runs on every engine, so
about (N-1)/N of the tasks reach their owner by the stored notice. A raw push consumer reads
the target stream (BENCH) and another the cron jobs' (JOBS); lateness is taken at the target
stream's store time (the `$JS.ACK` timestamp) against `Mq-Scheduled-For`, as side_by_side.py.

Per scenario, from `fire_log` (each row names the engine instance that fired it) and /proc:
each engine's tasks fired, share of them, CPU seconds over the window (the producer's first
instant to the last delivery; an engine started or restarted inside it counts from the moment
it held partitions, so Python's start-up is left out) and CPU per task fired, and the ratio of
that to the single engine's (`single`: P = 1, one engine, the same load and cron jobs, first,
in the same invocation: machines are noisy, ratios are not). Beside it, each engine's idle
share of a core (`--idle-seconds`, 5, before the load: cron, leases, heartbeats) and its CPU
per task above that, reported, not judged; with `--single-share` also the ratio to one engine
at rate / N (`single_share`), which has the per-batch costs of one engine's share of the load
(at the same rate a single engine spreads them over N times the tasks). Lost (never
delivered), doubled (delivered twice, or two `fire_log` rows for one task or cron occurrence:
the target stream's duplicate window would hide a second publish), early (stored before
due); cron occurrences lost (never delivered) and unlogged (delivered without a `fire_log`
row, which the drift audit would count as missed); nats-server's and PostgreSQL's CPU per
task; the partition map's changes over time (`map_changes`: each engine's partitions in
office, and how many were in none) and the seconds holding late tasks (`late_seconds`).

Scenarios (`--scenarios`, all by default; `single` always runs first):
- `steady`: no fault. Targets: each engine's CPU per task <= 1.2x the single engine's, each
  engine's share of the tasks within 10 % of 1/N (relative: 0.30-0.367 for three).
- `kill`: pe-2 SIGKILLed at half time. Its partitions are read from the lease bucket just
  before. Over the tasks due from 1 s before the kill until 5 s after every partition is held
  again by a live engine: p99 lateness of those in partitions it did not own <= 25 ms, and the
  longest wait (lateness) of those in its partitions <= TTL + 1 s.
- `join`: a fourth engine starts at a third of the run, and leaves (SIGTERM) at two thirds,
  each time once the map has settled. The join's window splits, as the kill's, into `own`
  (the partitions the fourth engine took: they moved) and `others` (the ones kept, which see
  their engine's term change).
- `rolling`: from a fifth of the run, each engine in turn gets SIGTERM, is started again (same
  instance id) and the next waits until it holds partitions again, `--pause` (5 s) between.
Every fault has a window (the lateness of the tasks due in it, as for the kill) and the
partitions in no office from the fault until the map settled (`in_no_office`: at most at once,
and partition-seconds; a killed engine's count as in none, though its leases outlive it).
Every scenario is judged clean: nothing lost, doubled or early, no cron occurrence lost or
doubled, the producer fully acknowledged; unlogged cron occurrences are a check of their own
(`<scenario>_cron_logged`). `--cluster` runs them all, `single` included, on a 3-node
JetStream cluster on loopback (tests/support/cluster.py; every stream and bucket at 3
replicas; the bench's clients on the first node; nats-server CPU summed over the nodes):
issue 37's (d).

`--tree PATH` runs the engines (and the migration) from another checkout.

    .venv/bin/python bench/partitions.py [--partitions 64] [--engines 3] [--rate 2000]
        [--seconds 180] [--delay 2] [--ttl 3] [--cron-jobs 32] [--scenarios steady,kill,...]
        [--single-share] [--cluster] [--tree PATH] [--logs DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import asyncpg
import nats
from common import (
    Daemon,
    Env,
    cpu_of_servers,
    cpu_seconds_or_zero,
    postmaster_pid,
    report,
    run,
    servers,
)
from nats.js.api import StorageType, StreamConfig
from rawnats import RawCollector
from side_by_side import producer_result, spawn_producer, spread, stop_children

from scheduler.leadership.partition_map import PartitionMap, read_partition_map
from scheduler.partitions import partition_of

SCENARIOS = ("steady", "kill", "join", "rolling")
TARGETS = {"cpu_ratio": 1.2, "share_off": 0.10, "others_p99_ms": 25.0, "own_wait_over_ttl_s": 1.0}
SAMPLE_EVERY = 0.5  # s between samples of the partition map and the engines' CPU
AFTER = 5.0  # s after a fault settled that its window still covers
BEFORE = 1.0  # s before a fault that its window covers (tasks claimed then, in flight)


# -- the engines ------------------------------------------------------------------------------


class Engine(Daemon):
    """One `scheduler run --role engine` process (no edge, no HTTP)."""

    def __init__(self, env: Env, name: str, partitions: int, a: argparse.Namespace) -> None:
        super().__init__(
            env,
            partitions=str(partitions),
            lease_ttl=f"{a.ttl:g}",
            instance_id=name,
            log_level=a.log_level,
            schedules_dir=os.path.join(env.workdir, "schedules"),
        )
        if a.cluster:
            self.env["SCHEDULER_STREAM_REPLICAS"] = "3"
        self.name = name
        self.argv = ["run", "--role", "engine"]
        if a.tree:  # its code, and its folder as the working directory (first on sys.path)
            self.env["PYTHONPATH"], self.cwd = a.tree, a.tree

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Meter:
    """CPU seconds of each engine over the window, summed over its processes (a restart is a
    new process), each counted from `begin`; a process's last reading survives its death."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}

    def begin(self, engine: Engine) -> None:
        cpu = cpu_seconds_or_zero(engine.pid)
        self.first[engine.pid] = self.last[engine.pid] = cpu
        self.owner[engine.pid] = engine.name

    def sample(self) -> None:
        for pid in self.first:
            cpu = cpu_seconds_or_zero(pid)
            if cpu:
                self.last[pid] = cpu

    def per_engine(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for pid, name in self.owner.items():
            out[name] += self.last[pid] - self.first[pid]
        return dict(out)


def in_office(m: PartitionMap) -> dict[str, set[int]]:
    """Each owner's partitions whose lease carries an epoch (its term took office)."""
    out: dict[str, set[int]] = defaultdict(set)
    for lease in m.leases:
        if lease.owner is not None and lease.epoch is not None:
            out[lease.owner].add(lease.partition)
    return dict(out)


def settled(m: PartitionMap, names: set[str]) -> bool:
    """Every partition held in office by one of `names`, each of them holding at least one and
    none more than its fair share (ceil(P / engines))."""
    held = in_office(m)
    fair = math.ceil(m.count / max(1, len(names)))
    return (
        m.readable
        and set(held) == names
        and sum(len(p) for p in held.values()) == m.count
        and all(1 <= len(p) <= fair for p in held.values())
    )


class Fleet:
    """The engines of a scenario, the partition map sampled over time, their CPU."""

    def __init__(self, env: Env, partitions: int, a: argparse.Namespace, kv: Any) -> None:
        self.env, self.partitions, self.a, self.kv = env, partitions, a, kv
        self.engines: dict[str, Engine] = {}
        self.meter = Meter()
        self.nats_pids: list[int] = []  # every node's, on a cluster
        self.metering = False
        self.empty_reads = 0  # maps read with no key while partitions were held
        self.pending: set[str] = set()  # started in the window, holding nothing yet
        self.timeline: list[tuple[float, dict[str, set[int]]]] = []

    def start(self, name: str) -> Engine:
        engine = self.engines.get(name) or Engine(self.env, name, self.partitions, self.a)
        self.engines[name] = engine
        engine.start(wait_ready=False)
        if self.metering:  # its CPU counts once it holds a partition (`map`)
            self.pending.add(name)
        return engine

    def begin_metering(self) -> None:
        """The window starts: every engine's CPU counts from now."""
        self.metering = True
        for e in self.engines.values():
            self.meter.begin(e)

    def live(self) -> set[str]:
        return {n for n, e in self.engines.items() if e.running()}

    async def map(self) -> PartitionMap:
        m = await read_partition_map(self.kv, self.partitions)
        for _ in range(2):  # a readable map with no key at all, right after one with owners
            if not (m.readable and self.timeline and self.timeline[-1][1]):
                break
            if any(lease.owner is not None for lease in m.leases):
                break
            self.empty_reads += 1  # seen under load: read again rather than record it
            m = await read_partition_map(self.kv, self.partitions)
        held = in_office(m)
        if m.readable:  # an unreadable map shows nobody in office: not so
            self.timeline.append((time.time(), held))
        for name in [n for n in self.pending if held.get(n)]:
            self.pending.discard(name)
            self.meter.begin(self.engines[name])  # Python's start-up left out
        return m

    async def until(self, ok: Callable[[PartitionMap], bool], within: float, what: str) -> float:
        """Poll the map (every 0.1 s, bounded) until `ok`; the wall time it first held."""
        deadline = time.time() + within
        while True:
            for e in self.engines.values():
                if e.proc is not None and e.proc.poll() not in (None, 0, -signal.SIGKILL):
                    raise RuntimeError(f"{e.name} exited {e.proc.returncode}: {e.log_tail()}")
            m = await self.map()
            if ok(m):
                return time.time()
            if time.time() > deadline:
                raise RuntimeError(f"not {what} in {within:.0f} s; held: {held_counts(m)}")
            await asyncio.sleep(0.1)

    async def settle(self, names: set[str], what: str) -> float:
        return await self.until(lambda m: settled(m, names), 30 + 4 * self.a.ttl, what)

    async def watch(self, stop: asyncio.Event) -> None:
        """The map and the engines' CPU every SAMPLE_EVERY s until `stop`."""
        while not stop.is_set():
            self.meter.sample()
            try:
                await self.map()
            except Exception as exc:  # a sample missed is not a result missed; said once
                print(f"partitions: map sample failed: {exc!r}", file=sys.stderr)
            try:
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY)
            except TimeoutError:
                pass

    async def signal(self, name: str, sig: int, within: float = 40) -> float:
        """Send `sig` to engine `name` and wait (bounded) for it to exit, its last CPU read
        from the exited process before it is reaped; seconds it took to exit."""
        engine = self.engines[name]
        assert engine.proc is not None
        self.meter.sample()
        t0 = time.time()
        engine.proc.send_signal(sig)
        await asyncio.wait_for(asyncio.to_thread(_wait_unreaped, engine.pid), within)
        self.meter.sample()  # a zombie's /proc stat keeps its final times
        await asyncio.to_thread(engine.proc.wait, 5)
        return round(time.time() - t0, 3)

    def stop_all(self) -> None:
        running = [e for e in self.engines.values() if e.running()]
        for e in running:
            assert e.proc is not None
            e.proc.terminate()
        for e in running:
            assert e.proc is not None
            try:
                e.proc.wait(30)
            except subprocess.TimeoutExpired:
                e.proc.kill()
                e.proc.wait(5)


def _wait_unreaped(pid: int) -> None:
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def held_counts(m: PartitionMap) -> dict[str, int]:
    return {k: len(v) for k, v in sorted(in_office(m).items())} | {"unowned": len(m.unowned())}


# -- setting a scenario up --------------------------------------------------------------------


@contextmanager
def deployment(cluster: bool) -> Iterator[tuple[Env, list[int]]]:
    """A fresh nats-server (`servers()`), or with `cluster` a 3-node JetStream cluster on
    loopback (tests/support/cluster.py), and PostgreSQL; the nats-server pids."""
    if not cluster:
        with servers() as env:
            yield env, [env.nats_pid]
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from scheduler.daemon.embedded import Postgres
    from tests.support.cluster import NatsCluster

    work = Path(tempfile.mkdtemp(prefix="mqs-bench-"))
    nodes: Any = None
    pg: Postgres | None = None
    try:
        nodes = NatsCluster(root=work / "nats").start()
        pg = Postgres(work / "pg").start()
        env = Env(nodes.url, pg.url, str(work), 0, postmaster_pid(str(work / "pg")))
        yield env, [n.proc.pid for n in nodes.nodes if n.proc is not None]
    finally:
        if pg is not None:
            pg.stop()
        if nodes is not None:
            nodes.stop()
        shutil.rmtree(work, ignore_errors=True)


async def add_stream(js: Any, name: str, subject: str, replicas: int) -> None:
    """A target stream (2 min duplicate window), at `replicas` replicas."""
    cfg = StreamConfig(name=name, subjects=[subject], storage=StorageType.FILE,
                       duplicate_window=120, num_replicas=replicas)  # fmt: skip
    await js.add_stream(cfg)


def servers_cpu(env: Env, nats_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of this run's PostgreSQL and of its nats-servers (every node)."""
    return cpu_of_servers(env) | {"nats-server": sum(cpu_seconds_or_zero(p) for p in nats_pids)}


async def prepare(env: Env, a: argparse.Namespace, partitions: int) -> None:
    """The schema (`scheduler migrate`), P recorded with an office row per partition, the
    target streams and the cron jobs' YAML."""
    menv = dict(os.environ, SCHEDULER_DATABASE_URL=env.database_url, SCHEDULER_LOG_LEVEL="WARNING")
    if a.tree:
        menv["PYTHONPATH"] = a.tree
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "scheduler", "migrate"], env=menv,
        cwd=a.tree or None, capture_output=True, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"migrate failed: {done.stderr.decode()[-500:]}")
    if partitions > 1:
        conn = await asyncpg.connect(env.database_url)
        try:
            await conn.execute("UPDATE partitioning SET partitions = $1", partitions)
            await conn.execute(
                "INSERT INTO partition_offices (partition, epoch) SELECT p, 0 "
                "FROM generate_series(1, $1 - 1) AS p",
                partitions,
            )
        finally:
            await conn.close()
    await asyncio.to_thread(write_jobs, os.path.join(env.workdir, "schedules"), a.cron_jobs)


def write_jobs(folder: str, jobs: int) -> None:
    """`jobs` cron jobs firing every second; an occurrence missed while nobody owned the job's
    partition is fired late, once (`fire_all`), so none may be missing afterwards."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "bench.yaml"), "w") as f:
        f.write("scheduled_jobs:\n")
        for i in range(jobs):
            f.write(f"  - name: job-{i}\n    subject: mq.scheduled.job{i}\n")
            f.write('    cron: "* * * * * *"\n    misfire: fire_all\n')


class Deliveries(RawCollector):
    """The raw consumer, also keeping every delivery's (store time, due time) by id."""

    def __init__(self, url: str, js: Any, stream: str, subject: str) -> None:
        super().__init__(url, js, stream, subject)
        self.seen: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def record(self, task_id: Any, due: float, arrival: float, stored: float | None) -> None:
        super().record(task_id, due, arrival, stored)
        key = task_id.decode() if isinstance(task_id, bytes) else str(task_id)
        self.seen[key].append((arrival if stored is None else stored, due))


# -- one scenario -----------------------------------------------------------------------------


async def scenario(name: str, a: argparse.Namespace) -> dict[str, Any]:
    alone = name in ("single", "single_share")
    partitions, count = (1, 1) if alone else (a.partitions, a.engines)
    if name == "single_share":  # one engine at one engine's share of the fleet's rate
        a = argparse.Namespace(**vars(a) | {"rate": a.rate / a.engines})
    with deployment(a.cluster) as (env, nats_pids):
        await prepare(env, a, partitions)
        nc = await nats.connect(env.nats_url.split(","))
        js = nc.jetstream()
        replicas = 3 if a.cluster else 1
        await add_stream(js, "BENCH", "mq.bench.>", replicas)
        await add_stream(js, "JOBS", "mq.scheduled.>", replicas)
        url = env.nats_url.split(",")[0]  # the bench's own clients, on one node
        fleet: Fleet | None = None
        collectors: list[Deliveries] = []
        procs: dict[str, Any] = {}
        try:
            names = [f"pe-{i + 1}" for i in range(count)]
            fleet = Fleet(env, partitions, a, None)
            fleet.start(names[0])  # it provisions the buckets the map reads
            await with_bucket(fleet, js)
            await fleet.settle({names[0]}, "the first engine in office")
            for n in names[1:]:
                fleet.start(n)
            ready_at = await fleet.settle(set(names), "settled over the engines")
            tasks = await Deliveries(url, js, "BENCH", "mq.bench.>").start()
            cron = await Deliveries(url, js, "JOBS", "mq.scheduled.>").start()
            collectors += [tasks, cron]
            idle = await idle_cpu(fleet, a.idle_seconds)
            fleet.nats_pids = nats_pids
            r = await loaded(name, a, env, fleet, names, (tasks, cron), procs, ready_at, idle)
        finally:
            await stop_children(procs)
            for c in collectors:
                await c.stop()
            if fleet is not None:
                fleet.stop_all()
                keep_logs(a, name, fleet)
            await nc.close()
    return r


async def with_bucket(fleet: Fleet, js: Any, within: float = 30) -> None:
    """The fleet's bucket, once it exists (the first engine provisions it)."""
    deadline = time.time() + within
    while True:
        try:
            fleet.kv = await js.key_value("scheduler_leader")
            return
        except Exception:  # not provisioned yet
            if time.time() > deadline:
                raise RuntimeError(f"no leader bucket in {within:.0f} s") from None
            await asyncio.sleep(0.1)


async def idle_cpu(fleet: Fleet, seconds: float) -> dict[str, float]:
    """Each engine's share of a core over `seconds` before the load: cron jobs, leases,
    heartbeats and its idle loops, the part of its CPU that does not grow with the tasks."""
    meter = Meter()
    for e in fleet.engines.values():
        meter.begin(e)
    t0 = time.time()
    await asyncio.sleep(seconds)
    meter.sample()
    wall = time.time() - t0
    return {k: round(v / wall, 4) for k, v in meter.per_engine().items()}


def keep_logs(a: argparse.Namespace, scenario_name: str, fleet: Fleet) -> None:
    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
        for e in fleet.engines.values():
            shutil.copy(e.log_path, os.path.join(a.logs, f"{scenario_name}-{e.name}.log"))


async def loaded(
    name: str,
    a: argparse.Namespace,
    env: Env,
    fleet: Fleet,
    names: list[str],
    collectors: tuple[Deliveries, Deliveries],
    procs: dict[str, Any],
    ready_at: float,
    idle_cpu: dict[str, float],
) -> dict[str, Any]:
    """The load, the scenario's faults during it, then the read-out."""
    tasks, cron = collectors
    count = int(a.rate * a.seconds)
    start = time.time() + 2.0 + count * 2e-5  # the producer's start-up and its items first
    prefix = uuid.uuid4().hex[:8]
    load = SimpleNamespace(rate=a.rate, duration=a.seconds, delay=a.delay, ack_timeout=10)
    procs["ours"] = await spawn_producer(env.nats_url.split(",")[0], "ours", prefix, start, load)
    await asyncio.sleep(max(0.0, start - time.time()))
    fleet.begin_metering()
    cpu0, t0 = servers_cpu(env, fleet.nats_pids), time.time()
    stop = asyncio.Event()
    watcher = asyncio.create_task(fleet.watch(stop))
    try:
        events = await FAULTS[name](fleet, names, start, a) if name in FAULTS else []
        last_due = start + (count - 1) / a.rate + a.delay
        complete = await tasks.wait_for(count, last_due + a.grace - time.time())
    finally:
        stop.set()
        await watcher
    fleet.meter.sample()
    wall = time.time() - t0
    used = {k: v - cpu0[k] for k, v in servers_cpu(env, fleet.nats_pids).items()}
    producer = await producer_result(procs["ours"], "ours", 30)
    await asyncio.sleep(1.0)  # the last fire_log rows commit after their publishes
    fired, cron_log = await fire_log(env.database_url, prefix)
    dues = {f"{prefix}-{i}": start + i / a.rate + a.delay for i in range(count)}
    out = {
        "partitions": fleet.partitions,
        "engines_at_start": names,
        "window_s": round(wall, 1),
        "complete": complete,
        "tasks": task_summary(tasks, dues, fired),
        "engines": engine_summary(fleet.meter.per_engine(), fired),
        "cron": cron_summary(cron, cron_log, a.cron_jobs, ready_at + 2, last_due - a.delay - 1),
        "servers_cpu_us_per_task": {k: round(v / count * 1e6, 1) for k, v in used.items()},
        "producer": producer,
        "events": events,
    }
    out["windows"] = windows(events, tasks, dues, fleet.partitions)
    out["map_changes"] = map_changes(fleet.timeline, start, fleet.partitions)
    out["map_reads_without_keys"] = fleet.empty_reads
    for w, ev in zip(out["windows"], events, strict=True):
        dead = ev["engine"] if ev["event"] == "kill" else None  # its leases outlive it
        w["in_no_office"] = office_gap(
            fleet.timeline, ev["at"], ev["settled_at"], fleet.partitions, dead
        )
    out["late_seconds"] = late_seconds(tasks, dues, start)
    for e, idle in idle_cpu.items():  # the engine's CPU beyond what it used idle (cron, leases)
        row = out["engines"].get(e)
        if row and row["fired"]:
            row["idle_share_of_a_core"] = idle
            row["cpu_us_per_task_above_idle"] = round(
                max(0.0, row["cpu_s"] - idle * wall) / row["fired"] * 1e6, 1
            )
    return out


async def fire_log(dsn: str, prefix: str) -> tuple[dict[str, list[str]], list[Any]]:
    """Who fired each of the run's tasks (`fire_log.instance`, one entry per row), and every
    cron row (job, occurrence, instance)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT key, instance FROM fire_log WHERE kind = 'delayed' AND key LIKE $1",
            prefix + "-%",
        )
        cron = await conn.fetch(
            "SELECT key, extract(epoch FROM scheduled_for)::float8 AS at, instance "
            "FROM fire_log WHERE kind = 'cron'"
        )
    finally:
        await conn.close()
    fired: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        fired[r["key"]].append(r["instance"])
    return dict(fired), list(cron)


# -- the faults -------------------------------------------------------------------------------


async def at(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.time()))


async def kill(fleet: Fleet, names: list[str], start: float, a: argparse.Namespace) -> list[Any]:
    victim = names[1]
    await at(start + a.seconds / 2)
    own = sorted(in_office(await fleet.map()).get(victim, set()))
    t = time.time()
    exit_s = await fleet.signal(victim, signal.SIGKILL)
    survivors = set(names) - {victim}
    back = await fleet.settle(survivors, f"settled over {sorted(survivors)} after the kill")
    return [{"event": "kill", "engine": victim, "at": t, "settled_at": back, "partitions": own,
             "exit_s": exit_s, "settled_after_s": round(back - t, 3)}]  # fmt: skip


async def join(fleet: Fleet, names: list[str], start: float, a: argparse.Namespace) -> list[Any]:
    extra = f"pe-{len(names) + 1}"
    await at(start + a.seconds / 3)
    t = time.time()
    fleet.start(extra)
    back = await fleet.settle({*names, extra}, f"settled with {extra}")
    moved = sorted(in_office(await fleet.map()).get(extra, set()))  # its window's `own`
    events = [{"event": "join", "engine": extra, "at": t, "settled_at": back, "partitions": moved,
               "settled_after_s": round(back - t, 3)}]  # fmt: skip
    await at(start + 2 * a.seconds / 3)
    t = time.time()
    exit_s = await fleet.signal(extra, signal.SIGTERM)
    back = await fleet.settle(set(names), f"settled after {extra} left")
    events.append({"event": "leave", "engine": extra, "at": t, "settled_at": back,
                   "exit_s": exit_s, "settled_after_s": round(back - t, 3)})  # fmt: skip
    return events


async def rolling(fleet: Fleet, names: list[str], start: float, a: argparse.Namespace) -> list[Any]:
    await at(start + a.seconds / 5)
    events = []
    for n in names:
        t = time.time()
        exit_s = await fleet.signal(n, signal.SIGTERM)
        fleet.start(n)
        back = await fleet.settle(set(names), f"settled after restarting {n}")
        events.append({"event": "restart", "engine": n, "at": t, "settled_at": back,
                       "exit_s": exit_s, "settled_after_s": round(back - t, 3)})  # fmt: skip
        await asyncio.sleep(a.pause)
    return events


FAULTS = {"kill": kill, "join": join, "rolling": rolling}


# -- reading the results out ------------------------------------------------------------------


def task_summary(
    tasks: Deliveries, dues: dict[str, float], fired: dict[str, list[str]]
) -> dict[str, Any]:
    store = [(s - d) * 1000 for t in dues for s, d in tasks.seen.get(t, [])[:1]]
    return {
        "expected": len(dues),
        "delivered": sum(1 for t in dues if t in tasks.seen),
        "lost": sum(1 for t in dues if t not in tasks.seen),
        "doubled_delivered": sum(1 for t in dues if len(tasks.seen.get(t, ())) > 1),
        "doubled_fire_log": sum(1 for t in dues if len(fired.get(t, ())) > 1),
        "missing_from_fire_log": sum(1 for t in dues if t not in fired),
        "early": sum(1 for t in dues for s, d in tasks.seen.get(t, []) if s < d),
        "store_lateness_ms": spread(store),
    }


def engine_summary(cpu: dict[str, float], fired: dict[str, list[str]]) -> dict[str, Any]:
    """Per engine: tasks fired (its `fire_log` rows), share, CPU seconds and per task fired."""
    per: dict[str, int] = defaultdict(int)
    for instances in fired.values():
        for inst in instances:
            per[inst] += 1
    total = max(1, sum(per.values()))
    out = {}
    for name in sorted(set(per) | set(cpu)):
        n = per.get(name, 0)
        out[name] = {
            "fired": n,
            "share": round(n / total, 4),
            "cpu_s": round(cpu.get(name, 0.0), 2),
            "cpu_us_per_task": round(cpu.get(name, 0.0) / n * 1e6, 1) if n else None,
        }
    return out


def cron_summary(
    cron: Deliveries, rows: list[Any], jobs: int, lo: float, hi: float
) -> dict[str, Any]:
    """Cron occurrences due in [lo, hi] (whole seconds): never delivered (`lost`), delivered
    without a `fire_log` row (`unlogged`: the audit would count them missed), doubled in the
    log or at the consumer; lateness at store time of every delivery (early counted)."""
    logged: dict[tuple[str, int], int] = defaultdict(int)
    for r in rows:
        logged[(r["key"], round(r["at"]))] += 1
    delivered = {(k.split("@", 1)[0], round(v[0][1])) for k, v in cron.seen.items()}
    want = [(f"job-{j}", s) for j in range(jobs) for s in range(math.ceil(lo), math.floor(hi) + 1)]
    lost = [k for k in want if k not in delivered]
    unlogged = [k for k in want if k in delivered and not logged.get(k)]
    late = [(s - d) * 1000 for v in cron.seen.values() for s, d in v]
    return {
        "occurrences_checked": len(want),
        "lost": len(lost),
        "unlogged": len(unlogged),
        "lost_sample": [f"{j}@{s - round(lo)}s" for j, s in lost[:10]],
        "unlogged_sample": [f"{j}@{s - round(lo)}s" for j, s in unlogged[:10]],
        # what fire_log holds of the first unlogged occurrence's job around it (s from lo)
        "unlogged_first_job_log": sorted(
            (round(r["at"] - round(lo), 3), r["instance"])
            for r in rows
            if unlogged and r["key"] == unlogged[0][0] and abs(r["at"] - unlogged[0][1]) <= 6
        ),
        "doubled_fire_log": sum(1 for n in logged.values() if n > 1),
        "doubled_delivered": sum(1 for v in cron.seen.values() if len(v) > 1),
        "store_lateness_ms": spread(late),
    }


def late_seconds(
    tasks: Deliveries, dues: dict[str, float], t0: float, over_ms: float = 25.0
) -> list[Any]:
    """The seconds of due time (from `t0`) holding tasks later than `over_ms` at store time:
    [second, tasks due in it, how many were late, the latest (ms)]. When the lateness
    happened, to be read beside `map_changes` and the events."""
    per: dict[int, list[float]] = defaultdict(list)
    for t, due in dues.items():
        got = tasks.seen.get(t)
        if got:
            per[int(due - t0)].append((got[0][0] - got[0][1]) * 1000)
    return [
        [sec, len(v), sum(1 for x in v if x > over_ms), round(max(v), 1)]
        for sec, v in sorted(per.items())
        if max(v) > over_ms
    ]


def office_gap(
    timeline: list[tuple[float, dict[str, set[int]]]],
    lo: float,
    hi: float,
    partitions: int,
    dead: str | None = None,
) -> dict[str, float]:
    """Between a fault and the map settling again: the most partitions in no live office at
    once (those of `dead`, a killed engine whose leases have not expired, count as in none),
    and partition-seconds in none (each sample's count held until the next sample)."""
    samples = [
        (at, partitions - sum(len(p) for owner, p in held.items() if owner != dead))
        for at, held in timeline
    ]
    most, area = 0, 0.0
    for (at, n), (nxt, _) in zip(samples, [*samples[1:], (hi, 0)], strict=True):
        start, end = max(at, lo), min(nxt, hi)
        if end > start:
            most, area = max(most, n), area + n * (end - start)
    return {"max_partitions": most, "partition_seconds": round(area, 2)}


def map_changes(
    timeline: list[tuple[float, dict[str, set[int]]]], t0: float, partitions: int
) -> list[Any]:
    """The partition map's samples where the partitions in office per engine changed: seconds
    from `t0` (the load's first instant), each engine's count, and how many were in no office."""
    out: list[Any] = []
    last: dict[str, int] | None = None
    for at, held in timeline:
        counts = {k: len(v) for k, v in sorted(held.items())}
        if counts != last:
            total = sum(counts.values())
            out.append(
                {"t": round(at - t0, 2), "held": counts, "not_in_office": partitions - total}
            )
            last = counts
    return out


def windows(
    events: list[dict[str, Any]], tasks: Deliveries, dues: dict[str, float], partitions: int
) -> list[dict[str, Any]]:
    """Per fault: the tasks due from BEFORE s ahead of it until AFTER s after the map settled,
    their lateness at store time; for a kill, apart for the victim's partitions (`own`, its
    longest wait in s) and the others'."""
    out = []
    for ev in events:
        lo, hi = ev["at"] - BEFORE, ev["settled_at"] + AFTER
        own_parts = set(ev.get("partitions", ()))
        groups: dict[str, list[float]] = {"all": [], "own": [], "others": []}
        late_others: dict[float, list[float]] = {}  # due (0.25 s buckets from the fault) -> late
        for t, due in dues.items():
            if lo <= due <= hi and t in tasks.seen:
                stored, d = tasks.seen[t][0]
                late = (stored - d) * 1000
                groups["all"].append(late)
                if own_parts:
                    mine = partition_of(t, partitions) in own_parts
                    groups["own" if mine else "others"].append(late)
                    if not mine and late > TARGETS["others_p99_ms"]:
                        bucket = math.floor((due - ev["at"]) * 4) / 4
                        late_others.setdefault(bucket, []).append(late)
        w = {"event": ev["event"], "engine": ev["engine"], "due_from_s_before": BEFORE,
             "due_until_s_after_settled": AFTER, "all": spread(groups["all"])}  # fmt: skip
        if own_parts:
            w["others"] = spread(groups["others"])
            w["own"] = spread(groups["own"])
            w["own_longest_wait_s"] = round(max(groups["own"], default=0.0) / 1000, 3)
            # when the others' late tasks were due (s from the fault): [from, count, max ms]
            w["others_late_by_due"] = [
                [b, len(v), round(max(v), 1)] for b, v in sorted(late_others.items())
            ]
        out.append(w)
    return out


# -- the verdict ------------------------------------------------------------------------------


def clean(r: dict[str, Any]) -> bool:
    t, c, p = r["tasks"], r["cron"], r["producer"]
    return bool(
        r["complete"] and t["lost"] == 0 and t["doubled_delivered"] == 0
        and t["doubled_fire_log"] == 0 and t["early"] == 0
        and c["lost"] == 0 and c["doubled_fire_log"] == 0 and c["doubled_delivered"] == 0
        and c["store_lateness_ms"].get("early", 0) == 0
        and p.get("unacked") == 0 and p.get("errors") == 0
    )  # fmt: skip


def verdict(res: dict[str, Any], a: argparse.Namespace) -> dict[str, bool]:
    """Each target met or not; sets each engine's ratio to the single engine's CPU per task."""
    checks: dict[str, bool] = {}
    single = res.get("single", {}).get("engines", {}).get("pe-1", {}).get("cpu_us_per_task")
    share_rate = res.get("single_share", {}).get("engines", {}).get("pe-1", {})
    share_rate = share_rate.get("cpu_us_per_task")
    for name, r in res.items():
        checks[f"{name}_clean"] = clean(r)
        checks[f"{name}_cron_logged"] = r["cron"]["unlogged"] == 0
        for e in r["engines"].values():
            if single and e["cpu_us_per_task"]:
                e["cpu_ratio_to_single"] = round(e["cpu_us_per_task"] / single, 3)
            if share_rate and e["cpu_us_per_task"]:  # reported, not judged
                e["cpu_ratio_to_single_share"] = round(e["cpu_us_per_task"] / share_rate, 3)
    if "steady" in res:
        engines = [e for e in res["steady"]["engines"].values()]
        third = 1 / a.engines
        checks["steady_cpu_ratio"] = len(engines) == a.engines and all(
            e.get("cpu_ratio_to_single", 1e9) <= TARGETS["cpu_ratio"] for e in engines
        )
        checks["steady_share"] = len(engines) == a.engines and all(
            abs(e["share"] - third) <= TARGETS["share_off"] * third for e in engines
        )
    if "kill" in res:
        w = next((w for w in res["kill"]["windows"] if w["event"] == "kill"), None)
        checks["kill_others_p99"] = bool(w) and (
            w["others"].get("p99", 1e9) <= TARGETS["others_p99_ms"]
        )
        checks["kill_own_wait"] = bool(w) and (
            w["own_longest_wait_s"] <= a.ttl + TARGETS["own_wait_over_ttl_s"]
        )
    return checks


def line(res: dict[str, Any], checks: dict[str, bool]) -> str:
    """The key figures and each target's verdict, short."""
    bits = []
    single = res.get("single", {}).get("engines", {}).get("pe-1", {})
    bits.append(f"single {single.get('cpu_us_per_task')} us/task")
    if "steady" in res:
        es = res["steady"]["engines"].values()
        bits.append("steady cpu x" + "/".join(str(e.get("cpu_ratio_to_single")) for e in es))
        bits.append("share " + "/".join(f"{e['share']:.3f}" for e in es))
        if "single_share" in res:
            ratios = "/".join(str(e.get("cpu_ratio_to_single_share")) for e in es)
            bits.append(f"cpu x{ratios} of one engine at rate/N")
    if "kill" in res:
        w = next((w for w in res["kill"]["windows"] if w["event"] == "kill"), {})
        bits.append(f"kill: others p99 {w.get('others', {}).get('p99')} ms")
        bits.append(f"own waited {w.get('own_longest_wait_s')} s")
    bad = [
        f"{n} {r['tasks']['lost']}/{r['tasks']['doubled_fire_log']}/{r['tasks']['early']}"
        for n, r in res.items()
        if r["tasks"]["lost"] or r["tasks"]["doubled_fire_log"] or r["tasks"]["early"]
    ]
    bits.append("lost/doubled/early " + (", ".join(bad) or "0/0/0 everywhere"))

    def verdict_of(keys: list[str]) -> str:
        return "ok" if all(checks[k] for k in keys) else "FAIL"

    groups = {
        "cpu<=1.2x": ["steady_cpu_ratio"], "share": ["steady_share"],
        "others p99<=25ms": ["kill_others_p99"], "own<=ttl+1s": ["kill_own_wait"],
        "clean": [k for k in checks if k.endswith("_clean")],
        "cron logged": [k for k in checks if k.endswith("_cron_logged")],
    }  # fmt: skip
    verdicts = [f"{g} {verdict_of(ks)}" for g, ks in groups.items() if ks and ks[0] in checks]
    return "; ".join(bits) + " | " + ", ".join(verdicts)


async def measure(a: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ["single", *(["single_share"] if a.single_share else []), *names]:
        print(f"partitions: {name} ...", file=sys.stderr)
        out[name] = await scenario(name, a)
        t = out[name]["tasks"]
        print(f"partitions: {name}: p99 {t['store_lateness_ms'].get('p99')} ms, lost {t['lost']}"
              f", engines {out[name]['engines']}", file=sys.stderr)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=64, help="P of the multi-engine runs")
    ap.add_argument("--engines", type=int, default=3, help="engines of the multi-engine runs")
    ap.add_argument("--rate", type=float, default=2000, help="tasks/s published")
    ap.add_argument("--seconds", type=float, default=180, help="seconds of publishing")
    ap.add_argument("--delay", type=float, default=2, help="each task due this long after")
    ap.add_argument("--ttl", type=float, default=3, help="the engines' SCHEDULER_LEASE_TTL")
    ap.add_argument("--cron-jobs", type=int, default=32, help="cron jobs firing every second")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=", ".join(SCENARIOS))
    ap.add_argument("--idle-seconds", type=float, default=5, help="idle CPU before the load")
    ap.add_argument("--pause", type=float, default=5, help="s between restarts in `rolling`")
    ap.add_argument("--grace", type=float, default=30, help="s to wait after the last due")
    ap.add_argument("--log-level", default="WARNING", help="the engines' SCHEDULER_LOG_LEVEL")
    ap.add_argument(
        "--single-share",
        action="store_true",
        help="also run one engine at rate / engines (`single_share`): the CPU per task one "
        "engine pays at one engine's share of the load, beside the same-rate ratio",
    )
    ap.add_argument("--cluster", action="store_true", help="(d): on a 3-node JetStream cluster")
    ap.add_argument("--tree", default="", help="run the engines from this checkout's code")
    ap.add_argument("--logs", default="", help="keep the engines' logs in this folder")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()
    names = [s for s in a.scenarios.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        ap.error(f"--scenarios: unknown {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if a.tree and not os.path.isfile(os.path.join(a.tree, "scheduler", "__init__.py")):
        ap.error(f"--tree: no scheduler package in {a.tree}")
    a.tree = os.path.abspath(a.tree) if a.tree else ""
    if a.engines < 2 or a.partitions < a.engines:
        ap.error("--engines must be >= 2 and --partitions at least as many")
    res = run(measure(a, names))
    checks = verdict(res, a)
    params = {k: v for k, v in vars(a).items() if k not in ("out", "logs")}
    params["tree"] = a.tree or "(this tree)"
    report("partitions", params, res | {"checks": checks}, TARGETS | {"lost": 0, "doubled": 0,
           "early": 0}, all(checks.values()), line(res, checks), a.out)  # fmt: skip


if __name__ == "__main__":
    main()
