"""Bounded inputs on the NATS verbs, the delay lane and the API (issue 35, items 5-8): real
nats-server, PostgreSQL and daemon. Instants out of range in API requests are refused on the
twins (tests/unit/test_api_refusals.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client

from scheduler.bus.nats.writer import NatsWriter
from scheduler.clock import SystemClock
from scheduler.daemon.operations import build_operations
from scheduler.metrics import Metrics
from scheduler.operations.bundle import Operations
from scheduler.operations.stores import Activity, KeyUse
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.task_admin import TaskAdmin
from tests.integration.api.harness import READ, ApiHarness, poll
from tests.integration.api.test_cli_ops import Cli
from tests.integration.test_cancel_intents import hold_lease
from tests.integration.test_delayed import envelope

TARGET = "mq.tasks.work"
OUT_OF_RANGE = "0001-01-01T00:00:00+00:01"  # astimezone(UTC) overflows: OverflowError before


async def _lease() -> dict[str, Any]:
    return {}


@asynccontextmanager
async def instance(
    settings: Settings, limits: IntentLimits | None = None
) -> AsyncIterator[tuple[Operations, asyncpg.Pool]]:
    """Another instance's operations (its own NATS connection and pool, nothing in memory
    shared with the daemon under test), as the API's routes call them, and that pool."""
    nc: Client = await nats.connect(settings.nats_servers)
    assert settings.database_url is not None
    pool = await create_pool(settings.database_url.get_secret_value(), min_size=1, max_size=4)
    try:
        db = PostgresStore(pool, Metrics())
        admin = TaskAdmin(db, limits or IntentLimits.from_settings(settings))
        yield build_operations(NatsWriter(nc), settings, db, admin, SystemClock(), _lease), pool
    finally:
        await pool.close()
        await nc.close()


async def verb(api: ApiHarness, name: str, body: bytes, rest: str = "tasks.work") -> Any:
    msg = await api.nc.request(f"scheduler.v1.{name}.{rest}", body, timeout=5)
    return msg.headers or {}, json.loads(msg.data)


async def test_verbs_refuse_ids_no_envelope_could_carry_and_never_show_exception_text(
    api: ApiHarness, database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """An id with a newline or of 10,000 characters is refused `bad_request` naming `id` on
    cancel, reschedule and get (nothing stored); a failure inside a verb answers code
    `internal` with an error id and no exception text, and the server logs it once."""
    await api.start()
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for bad in ("t_1\n", "a\nb", "x" * 10_000):
        for name in ("cancel", "reschedule", "get"):
            body = json.dumps({"id": bad, "delay_until": later}).encode()
            _, reply = await verb(api, name, body)
            assert reply["error"]["code"] == "bad_request", (name, reply)
            assert reply["error"]["message"].startswith("id: must be 1-200 printable"), reply
    r = await api.call("DELETE", "/v1/delayed/" + "x" * 3000, params={"target": TARGET})
    assert r.status == 422, r
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM delayed_messages") == 0
    finally:
        await conn.close()

    async def broken(*_: Any) -> str:
        raise RuntimeError("ProgramLimitExceededError('index row size 3016 exceeds')")

    monkeypatch.setattr(TaskAdmin, "cancel", broken)
    caplog.set_level(logging.ERROR, logger="scheduler.api.nats_service")
    headers, reply = await verb(api, "cancel", json.dumps({"id": "t_ok"}).encode())
    assert "Nats-Service-Error" not in headers
    assert reply["error"]["code"] == "internal"
    assert "ProgramLimit" not in json.dumps(reply)
    error_id = reply["error"]["message"].split("error id ")[1].split(",")[0]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


async def test_intents_are_bounded_per_organisation_and_in_total(settings: Settings) -> None:
    """Past SCHEDULER_INTENT_MAX_PER_ORG live intents over an organisation's targets, or
    SCHEDULER_INTENT_MAX_TOTAL over all, a cancel (reschedule) of a task not yet stored is
    refused naming the bound, nothing recorded; a stored task is still cancelled."""
    limits = IntentLimits(max_per_target=10, max_per_org=3, max_total=5)
    later = datetime.now(UTC) + timedelta(hours=1)
    async with instance(settings, limits) as (ops, pool):
        tasks = ops.tasks
        answers = [(await tasks.cancel(f"t_{n}", f"mq.org.acme.t{n}")).status for n in range(3)]
        assert answers == ["cancelled"] * 3
        refused = await tasks.cancel("t_3", "mq.org.acme.t3")
        assert refused.status == "too_many_intents_org"
        assert "SCHEDULER_INTENT_MAX_PER_ORG" in refused.detail
        moved = await tasks.reschedule("t_3", later, "mq.org.acme.t0")
        assert moved.status == "too_many_intents_org"
        assert (await tasks.cancel("t_4", "mq.org.beta.x")).status == "cancelled"
        assert (await tasks.cancel("t_5", "mq.tasks.other")).status == "cancelled"
        total = await tasks.cancel("t_6", "mq.tasks.more")
        assert total.status == "too_many_intents_total"
        assert "SCHEDULER_INTENT_MAX_TOTAL" in total.detail
        assert (await tasks.cancel("t_0", "mq.org.acme.t0")).status == "cancelled"  # renewed
        intents = await pool.fetch("SELECT id, org_id FROM delayed_messages ORDER BY id")
        assert [(r["id"], r["org_id"]) for r in intents] == [
            ("t_0", "acme"),
            ("t_1", "acme"),
            ("t_2", "acme"),
            ("t_4", "beta"),
            ("t_5", None),
        ]


def _duplicated(target_org: str) -> bytes:
    """An envelope naming `org_id` twice: the organisation of the subject last (the daemon's
    parser kept it), another first (what a first-key-wins worker would read)."""
    doc = json.dumps(envelope(org_id="acme")).encode()
    return doc[:-1] + f', "org_id": "{target_org}"}}'.encode()


async def test_duplicate_keys_are_refused_on_the_lane_the_verb_and_the_api(
    api: ApiHarness, database_url: str
) -> None:
    """An envelope naming `org_id` twice is refused naming the key: the `schedule` verb with
    `bad_request`, `POST /v1/delayed` with 422 `duplicate_key`, and on the delay lane it is
    dead-lettered `duplicate_key` with the key in its error (`Mq-Error`); a verb body naming
    `id` twice is refused too."""
    await api.start()
    raw = _duplicated("evil")
    _, reply = await verb(api, "schedule", raw, rest="org.evil.work")
    assert reply["error"]["code"] == "bad_request"
    assert reply["error"]["message"].startswith("org_id: appears more than once"), reply
    _, reply = await verb(api, "cancel", b'{"id": "t_a", "id": "t_b"}')
    assert reply["error"]["message"].startswith("id: appears more than once"), reply
    r = await api.call("POST", "/v1/delayed", data=raw, params={"subject": "mq.org.evil.work"})
    assert r.status == 422 and r.body["code"] == "duplicate_key", r
    assert r.body["errors"][0]["field"] == "org_id"
    short = b'{"subject": "mq.tasks.work", "in": "1h", "data": {}, "in": "1s"}'
    r = await api.call("POST", "/v1/delayed", data=short)
    assert r.status == 422 and r.body["errors"][0]["field"] == "in", r
    await api.js.publish("mq.delay.org.evil.work", raw)
    task_id = json.loads(raw)["id"]
    conn = await asyncpg.connect(database_url)
    try:
        row = await poll(
            lambda: conn.fetchrow(
                "SELECT reason, error FROM dead_letters WHERE original_id = $1", task_id
            ),
            lambda found: found is not None,
            within=10,
        )
        assert row is not None
        assert row["reason"] == "duplicate_key"
        assert row["error"].startswith("org_id: appears more than once"), row
        assert await conn.fetchval("SELECT count(*) FROM delayed_messages") == 0
    finally:
        await conn.close()


async def test_idempotency_answers_and_activity_rows_are_bounded_by_count(
    settings: Settings,
) -> None:
    """The hourly upkeep's passes (`idempotency.prune`, `activity.prune`) also delete the
    oldest rows past SCHEDULER_IDEMPOTENCY_MAX_KEYS and SCHEDULER_ACTIVITY_MAX_ROWS."""
    bounded = settings.with_overrides(idempotency_max_keys=3, activity_max_rows=4)
    now = datetime.now(UTC)
    async with instance(bounded) as (ops, pool):
        for n in range(5):
            use = KeyUse("admin", f"k{n}", "POST /v1/delayed", TARGET, "f")
            at = now + timedelta(seconds=n)
            claim = await ops.idempotency.claim(use, at, timedelta(0), timedelta(hours=24))
            await ops.idempotency.finish(claim, 200, "application/json", b"{}")  # type: ignore[arg-type]
        for n in range(6):
            at = now - timedelta(days=1) + timedelta(seconds=n)
            row = Activity(
                at, "admin", "api", None, "cancel", "DELETE", f"t{n}", {}, 200, "ok", "r", None
            )
            await ops.activity.record(row)
        assert await ops.idempotency.prune(now) == 2
        assert await ops.activity.prune(bounded.activity_retention) == 2
        keys = await pool.fetch("SELECT key FROM api_idempotency ORDER BY key")
        assert [r["key"] for r in keys] == ["k2", "k3", "k4"]
        rows = await pool.fetch("SELECT target FROM activity_log ORDER BY at")
        assert [r["target"] for r in rows] == ["t2", "t3", "t4", "t5"]


async def test_a_cancel_naming_no_target_on_another_instance_holds_for_a_task_on_the_lane(
    api: ApiHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task scheduled through one instance's API path and cancelled right after through
    another instance's `DELETE /v1/delayed/{id}` (or `scheduler delayed cancel`) without
    `target` answers `cancelled` and is never delivered: while intake is held (the task surely
    on the lane), and in 20 races with intake running. A task published to the lane directly
    is cancelled by `scheduler delayed cancel --target`."""
    kv = await hold_lease(api.js, api.settings.with_overrides(lease_ttl=30.0))
    await api.start(lease_ttl=30.0)
    async with instance(api.settings) as (other, _):
        soon = datetime.now(UTC) + timedelta(milliseconds=300)
        held = envelope(soon)
        await other.tasks.schedule(TARGET, json.dumps(held).encode())
        r = await api.call("DELETE", f"/v1/delayed/{held['id']}")
        assert r.status == 200 and r.body["status"] == "cancelled", r
        by_cli, direct = envelope(soon), envelope(soon)
        await other.tasks.schedule(TARGET, json.dumps(by_cli).encode())
        await api.publish(TARGET, direct)
        cli = Cli(api, capsys)
        code, out, _ = await cli("delayed", "cancel", by_cli["id"])
        assert code == 0 and out.strip() == f"{by_cli['id']}: cancelled"
        code, out, _ = await cli("delayed", "cancel", direct["id"], "--target", TARGET)
        assert code == 0 and out.strip() == f"{direct['id']}: cancelled"
        await kv.delete("leader")  # the daemon takes office and drains the lane
        ids = [held["id"], by_cli["id"], direct["id"]]
        for _ in range(20):
            doc = envelope(datetime.now(UTC) + timedelta(milliseconds=300))
            await other.tasks.schedule(TARGET, json.dumps(doc).encode())
            r = await api.call("DELETE", f"/v1/delayed/{doc['id']}")
            assert r.status == 200 and r.body["status"] == "cancelled", r
            ids.append(doc["id"])
        msgs = await api.read_stream("TASKS", quiet=1.5)
        assert msgs == []
        for task_id in ids:
            r = await api.call("GET", f"/v1/delayed/{task_id}", token=READ)
            assert r.status == 200 and r.body["status"] == "cancelled", r


async def test_nats_verbs_past_the_pace_are_dropped_unanswered(
    api: ApiHarness, caplog: Any
) -> None:
    """At a pace of 20 requests a second (a burst of a second's worth), 60 `stats` requests
    sent at once get about 20 answers; the rest are dropped unanswered (the caller's own
    timeout), counted in one log line. A second later the pace answers again."""
    await api.start(api_max_reads_per_second=20)
    caplog.set_level(logging.WARNING, logger="scheduler.api.nats_service")

    async def one() -> bool:
        try:
            await api.nc.request("scheduler.v1.stats", b"", timeout=1.0)
        except nats.errors.TimeoutError:
            return False
        return True

    answered = sum(await asyncio.gather(*(one() for _ in range(60))))
    assert 20 <= answered <= 30, answered
    assert any("api.nats_paced dropped=" in r.getMessage() for r in caplog.records)
    assert await one()
