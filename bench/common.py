"""Shared pieces of the benchmarks: servers, the daemon process, load, read-back, statistics.

Everything runs on this host: a fresh nats-server and PostgreSQL in a temp dir, the daemon as a
subprocess (`python -m scheduler run`), and a light load generator (pre-built messages, paced
core publishes) so the generator takes as little CPU as possible from the daemon. Lateness is
read back after the run from the JetStream store time of each delivered message, so reading
costs nothing during the measurement.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from scheduler.embedded import NatsServer, Postgres, free_port


@dataclass
class Env:
    nats_url: str
    database_url: str
    workdir: str


@contextmanager
def servers() -> Iterator[Env]:
    """A fresh nats-server and PostgreSQL for one benchmark; removed afterwards."""
    workdir = tempfile.mkdtemp(prefix="mqs-bench-")
    ns = NatsServer(os.path.join(workdir, "nats")).start()
    pg = Postgres(os.path.join(workdir, "pg")).start()
    try:
        yield Env(ns.url, pg.url, workdir)
    finally:
        ns.stop()
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class Daemon:
    """The daemon as a subprocess, with its CPU time and memory readable from /proc."""

    def __init__(self, env: Env, **settings: str) -> None:
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
        self.env.update({f"SCHEDULER_{k.upper()}": v for k, v in settings.items()})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self, wait_ready: bool = True) -> Daemon:
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "run"], env=self.env, stdout=subprocess.DEVNULL
        )
        if wait_ready:
            deadline = time.monotonic() + 30
            while not self.ready():
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("daemon did not become ready")
                time.sleep(0.05)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=1):
                return True
        except OSError:
            return False

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metric(self, name: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return float("nan")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def envelope(due: datetime | None, task_id: str | None = None) -> tuple[str, bytes]:
    """(id, bytes) of a valid envelope due at `due`."""
    task_id = task_id or uuid.uuid4().hex
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": task_id,
        "type": "bench.task",
        "source": "bench",
        "timestamp": datetime.now(UTC).isoformat(),
        "data": {"n": 1},
    }
    if due is not None:
        doc["delay_until"] = due.isoformat()
    return task_id, json.dumps(doc).encode()


async def paced_publish(nc: Any, items: list[tuple[float, str, bytes, dict[str, str]]]) -> float:
    """Publish (at, subject, payload, headers) items at their wall times; return the lag max."""
    worst, i = 0.0, 0
    while i < len(items):
        now = time.time()
        while i < len(items) and items[i][0] <= now:
            at, subject, payload, headers = items[i]
            await nc.publish(subject, payload, headers=headers)
            worst = max(worst, now - at)
            i += 1
        await asyncio.sleep(0.0005)
    await nc.flush()
    return worst


async def read_back(url: str, stream: str, subject: str = ">") -> list[Any]:
    """The messages of `stream` stored up to now (no acks), for measuring after the run."""
    nc = await nats.connect(url)
    out: list[Any] = []
    try:
        js = nc.jetstream()
        last = (await js.stream_info(stream)).state.last_seq
        cfg = ConsumerConfig(ack_policy=AckPolicy.NONE, max_ack_pending=-1)
        psub = await js.pull_subscribe(subject, stream=stream, config=cfg)
        while not out or out[-1].metadata.sequence.stream < last:
            try:
                out += await psub.fetch(5000, timeout=1.5)
            except (TimeoutError, nats.errors.TimeoutError):
                break
    finally:
        await nc.close()
    return out


def lateness_ms(msgs: list[Any], due_of: Any) -> list[float]:
    """Store time minus due time per message, in ms."""
    return [(m.metadata.timestamp - due_of(m)).total_seconds() * 1000 for m in msgs]


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    v = sorted(values)

    def q(p: float) -> float:
        return round(v[min(len(v) - 1, int(p * len(v)))], 2)

    return {
        "count": len(v),
        "min": round(v[0], 2),
        "p50": q(0.5),
        "p95": q(0.95),
        "p99": q(0.99),
        "max": round(v[-1], 2),
        "early": sum(1 for x in v if x < 0),
    }


def report(
    name: str,
    params: dict[str, Any],
    results: dict[str, Any],
    targets: dict[str, Any],
    passed: bool,
    summary: str,
) -> None:
    """The machine-readable result on stdout, a one-line summary on stderr."""
    doc = {"bench": name, "params": params, "results": results, "targets": targets, "pass": passed}
    print(json.dumps(doc, indent=2, default=str))
    print(f"{name}: {'PASS' if passed else 'FAIL'} {summary}", file=sys.stderr)


def delay_until_of(msg: Any) -> datetime:
    return datetime.fromisoformat(json.loads(msg.data)["delay_until"])


def run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)
