"""A manual trigger whose publish is acknowledged while PostgreSQL goes away answers the truth
(`triggered`), and its fire-log row is written once PostgreSQL is back; a retry with the same
Idempotency-Key fires nothing more.

The outage is real (the test's own pgserver stopped); only its timing is pinned: the trigger's
publish is wrapped so the server is stopped right after the PubAck arrives and before the
daemon's next statement.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.js.client import JetStreamContext

from scheduler.settings import Settings
from tests.faults.conftest import RestartablePostgres
from tests.integration.api.harness import READ, ApiHarness, Reply, poll, running_api

TRIGGER = "/v1/schedules/frozen/trigger"
KEY = "Idempotency-Key"


async def _fires(url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch("SELECT stream, stream_seq FROM fire_log WHERE key = 'frozen'")
    finally:
        await conn.close()


async def test_trigger_answers_triggered_when_postgres_stops_after_the_publish_ack(
    settings: Settings,
    own_pg: RestartablePostgres,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """PostgreSQL stops between the PubAck and the fire-log write: the answer is `triggered`
    with the message's sequence, one message is in the stream, the fire-log row is there once
    PostgreSQL is back, and a retry with the same key answers the same and publishes nothing."""
    async with running_api(settings.with_overrides(database_url=own_pg.url)) as api:
        await api.start()
        await _synced(api)
        stopped = asyncio.Event()
        original = JetStreamContext.publish

        async def publish_then_outage(js: JetStreamContext, *args: Any, **kw: Any) -> Any:
            ack = await original(js, *args, **kw)
            if (kw.get("headers") or {}).get("Mq-Manual") and not stopped.is_set():
                await asyncio.to_thread(own_pg.stop)
                stopped.set()
            return ack

        monkeypatch.setattr(JetStreamContext, "publish", publish_then_outage)
        first = await api.call("POST", TRIGGER, headers={KEY: "outage-1"})
        assert stopped.is_set()
        assert first.status == 200, first
        assert first.body["status"] == "triggered" and first.body["stream"] == "SCHEDULED"
        assert first.body["fire_log"] == "pending"
        down = await api.call("POST", TRIGGER, headers={KEY: "outage-1"})
        assert down.status == 503 and down.body["code"] == "unavailable", down
        await asyncio.to_thread(own_pg.start)

        async def retry() -> Reply:
            return await api.call("POST", TRIGGER, headers={KEY: "outage-1"})

        # 409 + Retry-After until the backlog has stored the first answer (503 while the pool
        # reconnects), then that answer
        later = await poll(retry, lambda r: r.status not in (409, 503), within=15)
        assert later.status == 200, later
        assert later.body == first.body and later.headers.get("idempotency-replayed") == "true"
        msgs = await api.read_stream("SCHEDULED", subject="mq.scheduled.frozen")
        assert [m.headers["Nats-Msg-Id"] for m in msgs] == [first.body["msg_id"]]
        rows = await poll(
            lambda: _fires(own_pg.url),
            lambda rows: any(r["stream_seq"] is not None for r in rows),
            within=15,
        )
        assert [(r["stream"], r["stream_seq"]) for r in rows] == [("SCHEDULED", first.body["seq"])]


async def _synced(api: ApiHarness) -> None:
    async def names() -> list[str]:
        r = await api.call("GET", "/v1/schedules", token=READ)
        return [j["name"] for j in r.body["items"]] if r.status == 200 else []

    await poll(names, lambda n: len(n) == 3, within=15)
