"""The run folder between an engine and its edge (`scheduler.daemon.pair`), the edge's cached
exposition and the metrics port's Host guard."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.api.edge import host_policy
from scheduler.api.starting import MetricsApp
from scheduler.cli.main import EXIT_INTERRUPTED, _run_daemon
from scheduler.daemon.edge import CachedRender, EdgeDaemon, FolderEngine
from scheduler.daemon.pair import (
    ENGINE_METRICS,
    ENGINE_STATUS,
    EngineReport,
    merge_expositions,
    read_engine_report,
    write_json,
)
from scheduler.daemon.supervisor import Pair
from scheduler.settings import Settings


def exposition(leader: float) -> bytes:
    r = CollectorRegistry()
    Gauge("mq_scheduler_is_leader", "1 while this instance leads.", registry=r).set(leader)
    Counter("mq_scheduler_fired_total", "Deliveries.", ["kind"], registry=r).labels("cron").inc(3)
    Histogram("mq_scheduler_x_seconds", "X.", buckets=(0.1, 1), registry=r).observe(0.5)
    return generate_latest(r)


def test_merged_expositions_label_every_sample_with_its_role_and_parse() -> None:
    """The same family from two processes stays two series, each family's header once, and
    the result is valid text format."""
    merged = merge_expositions([("engine", exposition(1)), ("edge", exposition(0))]).decode()
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    leader = families["mq_scheduler_is_leader"]
    assert {(s.labels["role"], s.value) for s in leader.samples} == {("engine", 1), ("edge", 0)}
    fired = [s for s in families["mq_scheduler_fired"].samples if s.name.endswith("_total")]
    assert {(s.labels["role"], s.labels["kind"]) for s in fired} == {
        ("engine", "cron"),
        ("edge", "cron"),
    }
    buckets = [s for s in families["mq_scheduler_x_seconds"].samples if s.name.endswith("bucket")]
    assert {s.labels["role"] for s in buckets} == {"engine", "edge"}
    assert merged.count("# HELP mq_scheduler_is_leader ") == 1
    assert merged.count("# TYPE mq_scheduler_x_seconds histogram") == 1


def test_an_engine_report_round_trips_and_a_foreign_file_is_none(tmp_path: Path) -> None:
    report = EngineReport("i1", "running", "leader", 7, "connected", "migrated", True, 12)
    write_json(tmp_path / ENGINE_STATUS, report.to_json())
    assert read_engine_report(tmp_path) == report
    (tmp_path / ENGINE_STATUS).write_text(json.dumps({"role": "leader"}))
    assert read_engine_report(tmp_path) is None
    (tmp_path / ENGINE_STATUS).write_text("{half")
    assert read_engine_report(tmp_path) is None


def test_the_edge_reads_a_stale_engine_as_none_and_not_ready(tmp_path: Path) -> None:
    """An engine that stopped writing (SIGSTOP, a stuck loop) is shown unknown, never as the
    role it last wrote; a fresh report is shown as it is."""
    edge = EdgeDaemon(Settings(data_dir=tmp_path, instance_id="i1"), FolderEngine(tmp_path))
    old = EngineReport("i1", "running", "leader", 3, "connected", "migrated", True, at=1.0)
    write_json(tmp_path / ENGINE_STATUS, old.to_json())
    ready, body = edge.readiness()
    assert not ready and body["role"] == "unknown"
    assert body["roles"]["engine"] == {"ready": False, "state": "unknown", "role": "unknown"}
    fresh = EngineReport(
        "i1", "running", "leader", 3, "connected", "migrated", True, at=time.time()
    )
    write_json(tmp_path / ENGINE_STATUS, fresh.to_json())
    ready, body = edge.readiness()
    assert body["role"] == "leader" and body["epoch"] == 3 and body["roles"]["engine"]["ready"]
    assert not ready  # the edge itself has not started
    assert edge.stats()["role"] == "leader"


def test_an_edge_alone_says_edge() -> None:
    edge = EdgeDaemon(Settings(instance_id="i2"))
    _, body = edge.readiness()
    assert body["role"] == "edge" and body["roles"]["engine"] is None


def test_the_cached_render_renders_once_per_max_age(tmp_path: Path) -> None:
    calls = []

    def render() -> bytes:
        calls.append(1)
        return b"x"

    cached = CachedRender(render, max_age=3600)
    assert [cached() for _ in range(50)] == [b"x"] * 50 and len(calls) == 1
    uncached = CachedRender(render, max_age=0)
    uncached(), uncached()
    assert len(calls) == 3


def test_the_edge_serves_the_engines_export_beside_its_own(tmp_path: Path) -> None:
    (tmp_path / ENGINE_METRICS).write_bytes(exposition(1))
    edge = EdgeDaemon(Settings(instance_id="i3"), FolderEngine(tmp_path))
    text = edge._exposition().decode()
    assert 'mq_scheduler_is_leader{role="engine"} 1.0' in text
    assert 'mq_scheduler_is_leader{role="edge"} 0.0' in text


async def test_the_metrics_port_keeps_the_apis_host_guard() -> None:
    """Open mode (no token): a Host that is not loopback or allowed gets 400, as on the API."""
    app = MetricsApp(lambda: b"m 1\n", host_policy(Settings(instance_id="i4")))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        assert (await c.get("/metrics")).status_code == 200
        refused = await c.get("/metrics", headers={"Host": "rebound.example"})
        assert refused.status_code == 400


class _Child:
    """Just what `Pair` touches of its edge child: the signals it gets, its exit."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.pid = 4242
        self.signals: list[int] = []

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.returncode = -9

    async def wait(self) -> int:
        self.returncode = 0 if self.returncode is None else self.returncode
        return self.returncode


async def test_a_stopping_pair_sends_its_edge_one_sigterm(tmp_path: Path) -> None:
    """`stop()` sends SIGTERM, and the stop before the embedded servers go (or the end of
    `run`) only waits: a second SIGTERM is a second Ctrl-C to the edge, which then drops its
    grace (seen: an edge stopped during its start printed a CancelledError traceback)."""
    pair = Pair(Settings(data_dir=tmp_path, run_dir=tmp_path / "run"))
    child = _Child()
    pair.child = child  # type: ignore[assignment]
    pair.stop()
    await pair._stop_child()
    await pair._stop_child()
    assert child.signals == [signal.SIGTERM]
    restarted = _Child()  # a new child (an edge restarted) gets its own SIGTERM
    pair.child = restarted  # type: ignore[assignment]
    await pair._stop_child()
    assert restarted.signals == [signal.SIGTERM]


async def test_a_second_signal_during_start_up_ends_the_run_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The second SIGTERM or Ctrl-C while the daemon is still starting cancels the start and
    says so in one line (it raised CancelledError out of `scheduler run` before)."""

    class Starting:
        started = asyncio.Event()  # never set: the start never ends
        embedded = False
        stopped = False

        def stop(self) -> None:
            self.stopped = True

        async def run(self) -> None:
            await asyncio.Event().wait()

    daemon = Starting()
    loop = asyncio.get_running_loop()
    run = asyncio.create_task(_run_daemon(daemon))
    try:
        await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.01)
        assert daemon.stopped and not run.done()
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(run, 2) == EXIT_INTERRUPTED
    finally:  # the session's loop keeps no handler of this pretend daemon
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
    assert "stopped at once (second signal)" in capsys.readouterr().err
