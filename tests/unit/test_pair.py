"""The run folder between an engine and its edge (`scheduler.daemon.pair`), the edge's cached
exposition and the metrics port's Host guard."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.api.edge import host_policy
from scheduler.api.starting import MetricsApp
from scheduler.daemon.edge import CachedRender, EdgeDaemon, FolderEngine
from scheduler.daemon.pair import (
    ENGINE_METRICS,
    ENGINE_STATUS,
    EngineReport,
    merge_expositions,
    read_engine_report,
    write_json,
)
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
