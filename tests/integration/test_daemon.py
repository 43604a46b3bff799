"""The daemon's lifecycle and HTTP surface against real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import asyncpg
import psutil
import pytest

from scheduler.daemon.lifecycle import Daemon, RunState
from scheduler.errors import ConfigError
from scheduler.settings import Settings


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


async def aget(url: str) -> tuple[int, bytes]:
    return await asyncio.to_thread(get, url)


async def started(daemon: Daemon) -> asyncio.Task[None]:
    task = asyncio.create_task(daemon.run())
    async with asyncio.timeout(20):
        done, _ = await asyncio.wait(
            {task, asyncio.create_task(daemon.started.wait())},
            return_when=asyncio.FIRST_COMPLETED,
        )
    if task in done:
        task.result()  # raises the start-up error
    return task


@pytest.mark.smoke
async def test_daemon_serves_health_readiness_and_metrics(settings: Settings) -> None:
    """A started daemon answers /healthz and /readyz with 200 and exposes connection metrics."""
    daemon = Daemon(settings)
    task = await started(daemon)
    try:
        assert daemon.endpoints.api is not None and daemon.endpoints.metrics is not None
        status, body = await aget(daemon.endpoints.api.url + "/healthz")
        assert status == 200
        status, body = await aget(daemon.endpoints.api.url + "/readyz")
        doc = json.loads(body)
        assert status == 200
        assert doc["ready"] is True
        assert doc["nats"] == "connected" and doc["postgres"] == "migrated"
        assert doc["instance"] == "test-1"
        status, body = await aget(daemon.endpoints.metrics.url + "/metrics")
        assert status == 200
        assert b'mq_scheduler_connected{service="nats"} 1.0' in body
        assert b'mq_scheduler_connected{service="postgres"} 1.0' in body
        assert b"process_resident_memory_bytes" in body
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 10)
    assert daemon.state is RunState.STOPPED
    assert not daemon.readiness()[0]


async def test_missing_urls_name_the_variable(tmp_path: Path) -> None:
    """Without --embedded, a missing URL fails at start naming the variable to set."""
    base = Settings(http_port=0, metrics_port=0, data_dir=tmp_path, instance_id="t")
    with pytest.raises(ConfigError, match="SCHEDULER_NATS_URL"):
        await Daemon(base).run()
    with pytest.raises(ConfigError, match="SCHEDULER_DATABASE_URL"):
        await Daemon(base.with_overrides(nats_url="nats://127.0.0.1:1")).run()


async def test_busy_http_port_is_a_clear_error(settings: Settings) -> None:
    """A port already in use fails the start with a ConfigError naming the variable."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        expected = f"SCHEDULER_HTTP_PORT: port {port} on 127.0.0.1 is already in use"
        with pytest.raises(ConfigError, match=expected):
            await Daemon(settings.with_overrides(http_port=port)).run()


@pytest.mark.slow
async def test_embedded_mode_starts_reuses_its_data_dir_and_leaves_nothing(tmp_path: Path) -> None:
    """Embedded servers start under the data dir, keep data across restarts, and stop cleanly."""
    base = Settings(http_port=0, metrics_port=0, data_dir=tmp_path / "data", instance_id="e")
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    for round_ in range(2):
        daemon = Daemon(base, embedded=True)
        task = await started(daemon)
        try:
            assert sorted(daemon.endpoints.embedded) == ["nats", "postgres"]
            assert daemon.readiness()[0]
            dsn = daemon.settings.database_dsn
            assert dsn is not None
            conn = await asyncpg.connect(dsn)
            try:
                if round_ == 0:
                    await conn.execute("CREATE TABLE marker (x int); INSERT INTO marker VALUES (1)")
                else:
                    assert await conn.fetchval("SELECT x FROM marker") == 1
            finally:
                await conn.close()
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 20)
        left = [c for c in me.children(recursive=True) if c.pid not in before and c.is_running()]
        assert [c.name() for c in left if c.status() != psutil.STATUS_ZOMBIE] == []
        assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()
    assert (tmp_path / "data" / "nats" / "jetstream").is_dir()
