"""Hostile producers against a running daemon on real NATS and PostgreSQL (issue 13, items 1-6
and 13): every bad message is dead-lettered alone with a precise reason, its batch neighbours
are stored and delivered, and the daemon's connection never closes."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats

from scheduler.daemon.lifecycle import Daemon
from scheduler.engine.delayed.dead_letters import DLQ_INFLIGHT
from scheduler.settings import Settings
from tests.integration.test_daemon import aget
from tests.support.hostile import LANE, Hostile, envelope, hostile
from tests.support.rawclient import header_block


def raw_doc(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def msg_id(doc: dict[str, Any]) -> bytes:
    return header_block((b"Nats-Msg-Id", str(doc["id"]).encode()))


def assert_still_connected(daemon: Daemon) -> None:
    assert daemon.bus is not None and daemon.bus.nc is not None
    assert daemon.bus.is_connected and not daemon.bus.nc.is_closed
    assert daemon.metrics.reconnects.labels("nats")._value.get() == 0


async def reasons(h: Hostile, database_url: str, count: int) -> dict[str, tuple[str, str]]:
    """original_id -> (reason, error) of the dead letters, once `count` are recorded."""
    rows: list[Any] = []
    async with asyncio.timeout(10):
        while len(rows) < count:
            rows = await h.dead_rows(database_url)
            await asyncio.sleep(0.05)
    return {r["original_id"]: (r["reason"], r["error"]) for r in rows}


async def test_a_delivery_that_cannot_fit_is_refused_at_intake_as_too_large(
    settings: Settings, database_url: str
) -> None:
    """A payload under the old payload-only limit but with big producer headers is refused
    `too_large` (its delivery would exceed max_payload); the connection stays up."""
    async with hostile(settings) as h:
        daemon = await h.begin()
        assert daemon.bus is not None
        limit = daemon.bus.max_payload
        doc = envelope(data={"pad": ""})
        doc["data"]["pad"] = "x" * (limit - 4096 - 10 - len(raw_doc(doc)))
        headers = header_block((b"Nats-Msg-Id", doc["id"].encode()), (b"X-Big", b"y" * 4000))
        assert "seq" in await h.publish_raw(LANE, raw_doc(doc), headers)
        control, due = await h.control()
        await h.expect_delivered(control, due)
        found = await reasons(h, database_url, 1)
        reason, error = found[doc["id"]]
        assert reason == "too_large"
        assert "headers" in error and str(limit) in error
        (copy,) = await h.dlq.take(1) if h.dlq else []
        assert copy.headers is not None and copy.headers["Mq-Error-Reason"] == "too_large"
        assert_still_connected(daemon)


async def test_a_dead_letter_copy_that_cannot_fit_is_cut_to_the_envelope(
    settings: Settings, database_url: str
) -> None:
    """A message near max_payload is dead-lettered with its envelope minus `data` (the reason
    kept) instead of a copy the server would refuse; the table keeps its first
    SCHEDULER_DEAD_LETTER_PAYLOAD_CAP bytes, its size, and that it was cut."""
    async with hostile(settings) as h:
        daemon = await h.begin()
        assert daemon.bus is not None
        limit = daemon.bus.max_payload
        doc = envelope(priority=0, data={"pad": ""})
        doc["data"]["pad"] = "x" * (limit - 200 - len(raw_doc(doc)))
        assert "seq" in await h.publish_raw(LANE, raw_doc(doc), msg_id(doc))
        control, due = await h.control()
        await h.expect_delivered(control, due)
        (copy,) = await h.dlq.take(1) if h.dlq else []
        assert copy.headers is not None
        assert copy.headers["Mq-Error-Reason"] == "too_large"
        assert "over the limit" in copy.headers["Mq-Error"]
        assert "Mq-Truncated" in copy.headers
        cut = json.loads(copy.data)
        assert "data" not in cut and cut["id"] == doc["id"] and cut["priority"] == 0
        rows = await h.dead_rows(database_url)
        assert [r["reason"] for r in rows] == ["too_large"]
        cap = daemon.settings.dead_letter_payload_cap
        assert rows[0]["raw"] == raw_doc(doc)[:cap] and cap < len(raw_doc(doc))
        assert rows[0]["raw_size"] == len(raw_doc(doc)) and rows[0]["raw_truncated"]
        assert_still_connected(daemon)


async def test_a_stored_task_that_no_longer_fits_is_dead_lettered_not_sent(
    settings: Settings, database_url: str
) -> None:
    """A task stored before these limits (or under a server with a larger max_payload) whose
    delivery cannot fit is dead-lettered `too_large` at once, its copy cut to the envelope; the
    connection stays up and the next task is delivered."""
    async with hostile(settings) as h:
        limit = 1024 * 1024  # the test server's max_payload (checked below)
        doc = envelope(data={"pad": "x" * (limit - 300)})
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "INSERT INTO delayed_messages (id, target, payload, headers, due_at, "
                "scheduled_for) VALUES ($1, $2, $3, $4::jsonb, now(), now())",
                doc["id"],
                "mq.tasks.work",
                raw_doc(doc),
                json.dumps({"X-Pad": "y" * 400}),
            )
        finally:
            await conn.close()
        daemon = await h.begin()  # loads the task, claims it, cannot send it
        assert daemon.bus is not None and daemon.bus.max_payload == limit
        assert h.dlq is not None
        (copy,) = await h.dlq.take(1, within=10)
        assert copy.headers is not None and copy.headers["Mq-Error-Reason"] == "too_large"
        assert "cannot fit" in copy.headers["Mq-Error"] and "Mq-Truncated" in copy.headers
        assert json.loads(copy.data)["id"] == doc["id"]
        control, due = await h.control()
        await h.expect_delivered(control, due)
        rows = await h.dead_rows(database_url)
        assert [(r["reason"], r["stage"]) for r in rows] == [("too_large", "firing")]
        assert_still_connected(daemon)


async def test_healthz_fails_once_the_nats_connection_is_closed_for_good(
    settings: Settings,
) -> None:
    """When the client gives the connection up for good, /healthz answers 503, not 200."""
    async with hostile(settings) as h:
        daemon = await h.begin()
        assert daemon.bus is not None and daemon.bus.nc is not None
        assert daemon.endpoints.api is not None
        url = daemon.endpoints.api.url + "/healthz"
        assert (await aget(url))[0] == 200
        nc = daemon.bus.nc
        # nats-py closes a connection for good when it reads a protocol error such as the
        # server's answer to an oversize frame. Provoking that over the socket is a race: the
        # server closes on unread bytes, the reset can discard its -ERR, and the client then
        # reconnects. The client's own close leaves it in the same closed-for-good state.
        await nc.close()
        assert nc.is_closed
        status, body = await aget(url)
        assert status == 503 and json.loads(body) == {"alive": False}
        status, body = await aget(daemon.endpoints.api.url + "/readyz")
        assert status == 503 and json.loads(body)["nats"] == "closed"


async def test_undecodable_subjects_and_headers_are_dead_lettered(
    settings: Settings, database_url: str
) -> None:
    """Non-UTF-8 subjects and headers, a malformed header block, control characters (a DEL
    too) and a fake status message are bad messages with a reason, not a crash of the read
    loop (no reconnect, no flap)."""
    async with hostile(settings) as h:
        await h.prepare()
        docs = [envelope() for _ in range(6)]
        cases = [
            (b"mq.delay.tasks.\xff", msg_id(docs[0]), "undecodable"),
            (LANE, header_block((b"X-Bin", b"\xff\xfe")), "undecodable"),
            (LANE, header_block((b"X-\xff", b"v")), "undecodable"),
            (LANE, b"garbage\r\n\r\n", "undecodable"),
            (LANE, header_block((b"X-Name With Space", b"v")), "invalid_header"),
            (b"mq.delay.tasks.a\x00b", msg_id(docs[5]), "target_refused"),
        ]
        for (subject, headers, _), doc in zip(cases, docs, strict=True):
            assert "seq" in await h.publish_raw(subject, raw_doc(doc), headers)
        # an empty message whose headers mimic a pull status: still a message to judge
        status = b"NATS/1.0 408 Request Timeout\r\n\r\n"
        assert "seq" in await h.publish_raw(LANE, b"", status)
        daemon = await h.begin()
        control, due = await h.control()
        await h.expect_delivered(control, due)
        # Alone on an idle lane, a subject with a DEL byte is never handed to a consumer
        # filtered on mq.delay.> (nats-server 2.15): the intake consumer has no filter.
        dele = envelope()
        assert "seq" in await h.publish_raw(b"mq.delay.tasks.a\x7fb", raw_doc(dele), None)
        await reasons(h, database_url, len(cases) + 2)
        control, due = await h.control()
        await h.expect_delivered(control, due)
        found = await reasons(h, database_url, len(cases) + 2)
        assert found[dele["id"]][0] == "target_refused"
        for (_, _, reason), doc in zip(cases, docs, strict=True):
            assert found[doc["id"]][0] == reason, (doc["id"], found[doc["id"]])
        assert found[docs[0]["id"]][1].startswith("subject: is not UTF-8")
        assert sorted(r for r, _ in found.values()).count("unparseable") == 1
        dlq = await h.dlq.take(len(cases) + 2) if h.dlq else []
        assert len(dlq) == len(cases) + 2
        assert all(m.headers and m.headers["Mq-Error-Reason"] for m in dlq)
        assert daemon.office is not None and daemon.office.epoch == 1  # one term: no flap
        assert_still_connected(daemon)


async def test_numbers_out_of_range_are_refused_by_field_and_spare_their_batch(
    settings: Settings, database_url: str
) -> None:
    """Times and numbers beyond what the daemon can compute with are refused naming the
    field; the good tasks fetched in the same batch are stored and delivered."""
    async with hostile(settings) as h:
        await h.prepare()
        soon = datetime.now(UTC) + timedelta(seconds=1)
        good = [envelope(soon), envelope(soon)]
        deep = b"[" * 100_000 + b"]" * 100_000
        cases: list[tuple[bytes, str, str]] = []
        for field, value in [
            ("ttl_seconds", 300_000_000_000),
            ("ttl_seconds", 10**30),
            ("delay_until", "0001-01-01T00:00:00+01:00"),
            ("delay_until", "9999-12-31T23:59:59-01:00"),
            ("timestamp", "0001-01-01T00:00:00+01:00"),
            ("timestamp", "9999-12-31T23:00:00+00:00"),
        ]:
            extra: dict[str, Any] = {field: value}
            doc = envelope(**extra)
            cases.append((raw_doc(doc), doc["id"], field))
        huge = envelope()
        text = raw_doc(huge).replace(b'"n": 1', b'"n": ' + b"9" * 5000)
        cases.append((text, huge["id"], "payload"))
        nested = envelope()
        cases.append((raw_doc(nested).replace(b"1}", deep + b"}"), nested["id"], "payload"))
        await h.publish_raw(LANE, raw_doc(good[0]), msg_id(good[0]))
        for raw, task_id, _ in cases:
            assert "seq" in await h.publish_raw(LANE, raw, msg_id({"id": task_id}))
        await h.publish_raw(LANE, raw_doc(good[1]), msg_id(good[1]))
        daemon = await h.begin()
        found = await reasons(h, database_url, len(cases))
        for _, task_id, field in cases:
            reason, error = found[task_id]
            assert reason in ("invalid_envelope", "unparseable"), (task_id, found[task_id])
            assert error.startswith(field + ":"), (field, error)
        assert h.tasks is not None
        got = await h.tasks.take(2, within=8)
        assert sorted(m.headers["Nats-Msg-Id"] for m in got if m.headers) == sorted(
            d["id"] for d in good
        )
        assert_still_connected(daemon)


async def test_values_postgres_cannot_hold_never_fail_a_batch(
    settings: Settings, database_url: str
) -> None:
    """NUL in a header value, NaN/Infinity and lone surrogates are refused at the boundary;
    a NUL escape inside `data` is valid JSON and delivered byte for byte; neighbours flow."""
    async with hostile(settings) as h:
        await h.prepare()
        soon = datetime.now(UTC) + timedelta(seconds=1)
        good = [envelope(soon), envelope(soon)]
        nul_data = envelope(soon, data={"s": "a\u0000b"})
        nul_header, nan, inf, surrogate = (envelope() for _ in range(4))
        bad = [
            (
                raw_doc(nul_header),
                header_block((b"X-Nul", b"a\x00b")),
                nul_header,
                "invalid_header",
            ),
            (raw_doc(nan).replace(b'"n": 1', b'"n": NaN'), None, nan, "invalid_envelope"),
            (raw_doc(inf).replace(b'"n": 1', b'"n": -Infinity'), None, inf, "invalid_envelope"),
            (
                raw_doc(surrogate).replace(b'"n": 1', b'"n": "\\ud800"'),
                None,
                surrogate,
                "unparseable",
            ),
        ]
        await h.publish_raw(LANE, raw_doc(good[0]), msg_id(good[0]))
        for raw, headers, doc, _ in bad:
            assert "seq" in await h.publish_raw(LANE, raw, headers or msg_id(doc))
        await h.publish_raw(LANE, raw_doc(nul_data), msg_id(nul_data))
        await h.publish_raw(LANE, raw_doc(good[1]), msg_id(good[1]))
        daemon = await h.begin()
        found = await reasons(h, database_url, len(bad))
        for _, _, doc, reason in bad:
            assert found[doc["id"]][0] == reason, found[doc["id"]]
        assert found[nan["id"]][1].startswith("data:")
        assert h.tasks is not None
        got = {m.headers["Nats-Msg-Id"]: m for m in await h.tasks.take(3, within=8) if m.headers}
        assert set(got) == {good[0]["id"], good[1]["id"], nul_data["id"]}
        assert got[nul_data["id"]].data == raw_doc(nul_data)
        assert_still_connected(daemon)


async def test_ids_and_header_values_are_matched_in_full_and_reserved_headers_stripped(
    settings: Settings, database_url: str
) -> None:
    """An id with a trailing newline and header values with CR, LF or NUL are refused;
    producer headers named `Mq-*` or `Nats-*` in any case are not forwarded."""
    async with hostile(settings) as h:
        daemon = await h.begin()
        newline = envelope(id="t_newline\n")
        assert "seq" in await h.publish_raw(LANE, raw_doc(newline), None)
        bad_headers: dict[str, str] = {}
        for name, value in [(b"X-Cr", b"a\rb"), (b"X-Lf", b"a\nb")]:
            doc = envelope()
            bad_headers[doc["id"]] = name.decode()
            headers = header_block((b"Nats-Msg-Id", doc["id"].encode()), (name, value))
            assert "seq" in await h.publish_raw(LANE, raw_doc(doc), headers)
        keep = envelope(datetime.now(UTC) + timedelta(milliseconds=200))
        headers = header_block(
            (b"Nats-Msg-Id", keep["id"].encode()),
            (b"mq-attempt", b"99"),
            (b"MQ-SCHEDULED-FOR", b"1999-01-01T00:00:00Z"),
            (b"nAtS-Rollup", b"sub"),
            (b"X-Keep", b"yes"),
        )
        assert "seq" in await h.publish_raw(LANE, raw_doc(keep), headers)
        msg = await h.expect_delivered(keep["id"], datetime.fromisoformat(keep["delay_until"]))
        assert msg.headers is not None
        names = [k.lower() for k in msg.headers]
        assert names.count("mq-attempt") == 1 and msg.headers["Mq-Attempt"] == "1"
        assert names.count("mq-scheduled-for") == 1 and "nats-rollup" not in names
        assert msg.headers["X-Keep"] == "yes"
        found = await reasons(h, database_url, 3)
        newline_id = "t_newline\\n"  # control characters are escaped in text columns
        assert found[newline_id][0] == "invalid_envelope"
        assert found[newline_id][1].startswith("id:")
        for task_id, header in bad_headers.items():
            reason, error = found[task_id]
            assert reason == "invalid_header" and header in error
        assert_still_connected(daemon)


async def test_an_id_reused_for_another_task_is_refused_as_duplicate_id(
    settings: Settings, database_url: str
) -> None:
    """An id already stored for another target or other bytes is dead-lettered
    `duplicate_id`; an exact resend (same id, target and bytes) is an idempotent no-op."""
    async with hostile(settings) as h:
        await h.js.add_stream(name="OTHER", subjects=["mq.other.>"])
        daemon = await h.begin()
        doc = envelope(datetime.now(UTC) + timedelta(milliseconds=600))
        first = raw_doc(doc)
        await h.publish_raw(LANE, first, header_block((b"Nats-Msg-Id", b"a")))
        await h.publish_raw(b"mq.delay.other.x", first, header_block((b"Nats-Msg-Id", b"b")))
        changed = raw_doc({**doc, "data": {"n": 2}})
        await h.publish_raw(LANE, changed, header_block((b"Nats-Msg-Id", b"c")))
        await h.publish_raw(LANE, first, header_block((b"Nats-Msg-Id", b"d")))  # exact resend
        await h.expect_delivered(doc["id"], datetime.fromisoformat(doc["delay_until"]))
        rows: list[Any] = []
        async with asyncio.timeout(10):
            while len(rows) < 2:
                rows = await h.dead_rows(database_url)
                await asyncio.sleep(0.05)
        assert sorted((r["reason"], r["subject"]) for r in rows) == [
            ("duplicate_id", "mq.delay.other.x"),
            ("duplicate_id", "mq.delay.tasks.work"),
        ]
        assert all("already" in r["error"] for r in rows)
        assert h.tasks is not None and await h.tasks.take(1, within=1.0) == []
        assert daemon.metrics.intake.labels("duplicate")._value.get() == 1
        assert_still_connected(daemon)


async def test_a_dead_letter_stream_that_never_answers_does_not_stall_intake(
    settings: Settings, database_url: str
) -> None:
    """Dead-letter copies are sent concurrently and bounded: with a DLQ that swallows publishes
    without an ack, a good task published after more bad messages than copies may be in flight
    is still delivered on time; every bad message is in the table (no rate bound here)."""
    async with hostile(settings) as h:
        daemon = await h.begin(dead_letter_rate=0)
        await h.js.delete_stream(daemon.settings.dlq_stream)
        sink = await nats.connect(settings.nats_servers)
        try:
            await sink.subscribe("mq.dlq.>", cb=None)  # a responder that never acks
            await sink.flush()
            for _ in range(DLQ_INFLIGHT + 44):
                await h.publish_raw(LANE, b"{not json", None)
            await reasons(h, database_url, DLQ_INFLIGHT + 44)  # recorded; copies on their way
            control, due = await h.control(delay=0.5)  # fetched in a later batch
            await h.expect_delivered(control, due, late=1.5)
        finally:
            await sink.close()
        assert_still_connected(daemon)
