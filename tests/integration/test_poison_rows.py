"""Rows PostgreSQL refuses, on the intake and the dead-letter paths, and idempotent booking
(issue 13, item 4), against real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.metrics import Metrics
from scheduler.records import Fired, NewTask
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.tasks import TaskStore
from scheduler.store.postgres.values import jsonb_text
from tests.support.hostile import LANE, envelope, hostile
from tests.support.rawclient import header_block
from tests.support.stores import claim, insert


async def test_a_row_postgres_refuses_is_split_out_of_its_batch(
    settings: Settings, database_url: str
) -> None:
    """When the batch insert fails on one row (here a constraint PostgreSQL enforces that the
    daemon does not know), that row is dead-lettered `unstorable` and its neighbours are stored
    and delivered; the batch is not redelivered forever."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "ALTER TABLE delayed_messages ADD CONSTRAINT no_poison CHECK (id NOT LIKE 'poison%')"
        )
    finally:
        await conn.close()
    async with hostile(settings) as h:
        await h.prepare()
        soon = datetime.now(UTC) + timedelta(seconds=1)
        docs = [envelope(soon), envelope(soon, id="poison-1"), envelope(soon)]
        for doc in docs:
            raw = json.dumps(doc).encode()
            await h.publish_raw(LANE, raw, header_block((b"Nats-Msg-Id", doc["id"].encode())))
        daemon = await h.begin()
        assert h.tasks is not None
        got = await h.tasks.take(2, within=8)
        assert sorted(m.headers["Nats-Msg-Id"] for m in got if m.headers) == sorted(
            [docs[0]["id"], docs[2]["id"]]
        )
        rows = await h.dead_rows(database_url)
        assert [(r["original_id"], r["reason"]) for r in rows] == [("poison-1", "unstorable")]
        assert "no_poison" in rows[0]["error"]
        assert h.dlq is not None and len(await h.dlq.take(1)) == 1
        assert daemon.metrics.intake.labels("unstorable")._value.get() == 1


async def test_a_task_postgres_cannot_hold_as_json_is_dead_lettered_at_firing(
    settings: Settings, database_url: str
) -> None:
    """A task whose `data` holds a NUL escape (valid JSON, refused by `jsonb`) and whose target
    no stream captures is dead-lettered once; the bookkeeping of the neighbour that fired in
    the same flush is not retried (one `fire_log` row)."""
    async with hostile(settings) as h:
        daemon = await h.begin(max_attempts=1)
        due = datetime.now(UTC) + timedelta(seconds=1)
        poison = envelope(due, data={"s": "a\u0000b"})
        good = envelope(due)
        for target, doc in (("mq.nowhere.x", poison), ("mq.tasks.work", good)):
            raw = json.dumps(doc).encode()
            await h.js.publish("mq.delay." + target[3:], raw, headers={"Nats-Msg-Id": doc["id"]})
        await h.expect_delivered(good["id"], due)
        assert h.dlq is not None
        (copy,) = await h.dlq.take(1)
        assert copy.headers is not None and copy.headers["Mq-Error-Reason"] == "publish_failed"
        assert copy.data == json.dumps(poison).encode()
        conn = await asyncpg.connect(database_url)
        try:
            status = ""
            async with asyncio.timeout(5):
                while status != "dead":
                    status = await conn.fetchval(
                        "SELECT status FROM delayed_messages WHERE id = $1", poison["id"]
                    )
                    await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # a retrying bookkeeper would add rows meanwhile
            logged = await conn.fetchval("SELECT count(*) FROM fire_log WHERE key = $1", good["id"])
            dead = await conn.fetch("SELECT stage, payload, raw, raw_size FROM dead_letters")
        finally:
            await conn.close()
        assert logged == 1
        assert [r["stage"] for r in dead] == ["firing"]
        # the bytes once (migration 0014): whole in `raw`, no second copy in `payload`
        assert json.loads(dead[0]["payload"]) is None
        assert dead[0]["raw"] == copy.data and dead[0]["raw_size"] == len(copy.data)
        assert daemon.bus is not None and daemon.bus.is_connected


async def test_booking_the_same_delivery_twice_logs_it_once(database_url: str) -> None:
    """Recording a delivery again (a retried bookkeeping flush) adds no second `fire_log` row:
    one row per task and attempt."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    try:
        epoch = await take_office(pool, "t")
        due = datetime.now(UTC)
        task = NewTask("t_once", "mq.tasks.x", b"{}", {}, 5, due, due, None)
        await insert(tasks, [task])
        (claimed,) = await claim(tasks, epoch, [task.id], due)
        fired = [Fired(claimed, due + timedelta(milliseconds=3), "TASKS", 7)]
        await tasks.mark_fired(epoch, fired, "t")
        await tasks.mark_fired(epoch, fired, "t")
        rows = await pool.fetch("SELECT key, attempt, stream_seq FROM fire_log")
        assert [tuple(r) for r in rows] == [("t_once", 1, 7)]
    finally:
        await pool.close()


async def test_a_redelivered_bad_message_is_dead_lettered_once(database_url: str) -> None:
    """Recording the same bad intake message again (the leader died before terming it, and
    its successor judged it anew) adds no second `dead_letters` row."""
    pool = await create_pool(database_url, min_size=1, max_size=2)
    tasks = TaskStore(PostgresStore(pool, Metrics()))
    row = {
        "original_id": "bad-1",
        "key": "dlq-intake:MQ_DELAY:7:1764000000000000",
        "subject": "mq.delay.tasks.work",
        "error": "payload: is not JSON",
        "reason": "unparseable",
        "target": "mq.tasks.work",
        "raw": b"{not json",
        "headers": {"X-Nul": "a\x00b"},
    }
    try:
        await tasks.record_bad_intake([row])
        await tasks.record_bad_intake([row])
        rows = await pool.fetch("SELECT original_id, headers, payload FROM dead_letters")
    finally:
        await pool.close()
    assert len(rows) == 1
    assert json.loads(rows[0]["headers"]) == {"X-Nul": "a\\x00b"}


_JSON_TEXT = st.text(alphabet=st.characters(codec=None, categories=None), max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _JSON_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_JSON_TEXT, inner, max_size=3),
    max_leaves=8,
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(doc=_JSON, junk=st.binary(max_size=40), as_json=st.booleans())
async def test_payload_documents_are_always_accepted_by_jsonb(
    database_url: str, doc: Any, junk: bytes, as_json: bool
) -> None:
    """Whatever a payload holds (NUL escapes, lone surrogates, NaN, Infinity, broken bytes),
    the document stored for it is accepted by PostgreSQL's jsonb; a document jsonb can hold
    is stored as it is."""
    raw = json.dumps(doc).encode() if as_json else junk
    text = jsonb_text(raw)
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetchval("SELECT $1::jsonb::text", text)
    finally:
        await conn.close()
    exact: dict[str, Any] = {"parse_float": Decimal, "parse_int": Decimal}  # jsonb: numeric
    assert json.loads(stored, **exact) == json.loads(text, **exact)
