"""Hostile input of issue 18 item 5 not covered by test_hostile_intake.py: producer headers that
would steer JetStream (rollup, another task's message id, expectations, TTL, schedules), payloads
exactly at the size limit, and one id sent by several producers at once."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.js.api import StreamConfig

from scheduler.bus.nats.connection import stream_configs
from scheduler.messages.envelope import HEADER_RESERVE
from scheduler.settings import Settings
from tests.integration.test_hostile_intake import assert_still_connected, raw_doc, reasons
from tests.support.hostile import LANE, TARGET, envelope, hostile
from tests.support.rawclient import header_block

LANE_REFUSES = [
    (b"Nats-Rollup", b"all", 10111),  # rollup not permitted
    (b"Nats-Rollup", b"sub", 10111),
    (b"Nats-Expected-Stream", b"TASKS", 10060),  # expected stream does not match
    (b"Nats-Expected-Last-Sequence", b"999", 10071),  # wrong last sequence
    (b"Nats-Expected-Last-Msg-Id", b"nope", 10070),  # wrong last msg ID
    (b"Nats-TTL", b"1s", 10166),  # per-message TTL is disabled
    (b"Nats-Schedule", b"@every 1s", 10188),  # message schedules is disabled
]


async def test_the_lane_refuses_headers_that_would_purge_or_steer_it(settings: Settings) -> None:
    """On the lane the daemon provisions, a producer's rollup, TTL, schedule and wrong
    expectation headers are refused by the server itself (the error code in the PubAck): the
    lane is never purged, and a task waiting on it is still delivered."""
    async with hostile(settings) as h:
        await h.prepare()
        waiting = envelope(datetime.now(UTC) + timedelta(milliseconds=300))
        await h.publish_raw(LANE, raw_doc(waiting), header_block((b"Nats-Msg-Id", b"w")))
        server = h.nc.connected_server_version
        for name, value, code in LANE_REFUSES:
            if name == b"Nats-TTL" and (server.major, server.minor) < (2, 11):
                continue  # 2.10 knows no per-message TTL: the header is an ordinary one
            if name == b"Nats-Schedule" and (server.major, server.minor) < (2, 12):
                continue  # likewise before 2.12
            doc = envelope()
            ack = await h.publish_raw(LANE, raw_doc(doc), header_block((name, value)))
            assert ack.get("error", {}).get("err_code") == code, (name, ack)
        assert (await h.js.stream_info("MQ_DELAY")).state.messages == 1
        await h.begin()
        await h.expect_delivered(waiting["id"], datetime.fromisoformat(waiting["delay_until"]))


async def test_steering_headers_that_pass_the_lane_are_not_delivered(settings: Settings) -> None:
    """On a lane an operator configured to allow rollups (and per-message TTLs on 2.11+),
    headers that pass it are stripped before delivery: the target stream, which allows
    rollups too, keeps what it held, deliveries carry no TTL, expectations meant for the lane
    do not make the target refuse them, and a task whose header names another task's message
    id is delivered beside it, not dropped as its duplicate."""
    async with hostile(settings) as h:
        server = h.nc.connected_server_version
        ttl = (server.major, server.minor) >= (2, 11)
        lane, dlq = stream_configs(h.settings, embedded=False)
        lane.allow_rollup_hdrs = True
        await h.js.add_stream(lane)
        await h.js.add_stream(dlq)
        tasks = StreamConfig(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
        tasks.allow_rollup_hdrs = True
        if ttl:
            lane.allow_msg_ttl = tasks.allow_msg_ttl = True
            await h.js.update_stream(lane)
        await h.js.update_stream(tasks)
        kept = await h.js.publish("mq.tasks.work", b"already here", headers={"Nats-Msg-Id": "k"})
        await h.begin()
        assert h.tasks is not None
        assert [m.data for m in await h.tasks.take(1)] == [b"already here"]
        due = datetime.now(UTC) + timedelta(milliseconds=100)
        first = envelope(due)  # sent to the lane without a message id of its own
        await h.publish_raw(LANE, raw_doc(first), None)
        await h.expect_delivered(first["id"], due)
        due = datetime.now(UTC) + timedelta(milliseconds=500)
        sent: list[str] = []
        steering = [
            (b"Nats-Rollup", b"all"),
            (b"Nats-Rollup", b"sub"),
            (b"Nats-Expected-Stream", b"MQ_DELAY"),
            (b"Nats-Expected-Last-Sequence", b"LAST"),
            (b"Nats-Schedule-Target", b"mq.tasks.other"),
            (b"Nats-Schedule-TTL", b"1s"),
            *([(b"Nats-TTL", b"1s")] if ttl else []),
        ]
        for name, value in steering:
            doc = envelope(due)
            if value == b"LAST":
                value = str((await h.js.stream_info("MQ_DELAY")).state.last_seq).encode()
            block = header_block((b"Nats-Msg-Id", doc["id"].encode()), (name, value))
            ack = await h.publish_raw(LANE, raw_doc(doc), block)
            assert "error" not in ack, (name, ack)
            sent.append(doc["id"])
        other = envelope(due)  # its producer header names the first task's message id
        block = header_block((b"Nats-Msg-Id", first["id"].encode()))
        ack = await h.publish_raw(LANE, raw_doc(other), block)
        assert "error" not in ack and not ack.get("duplicate"), ack
        sent.append(other["id"])
        got = await h.tasks.take(len(sent), within=8)
        assert sorted(m.headers["Nats-Msg-Id"] for m in got if m.headers) == sorted(sent)
        for msg in got:
            assert msg.headers is not None
            names = {k.lower() for k in msg.headers}
            assert not {n for n in names if n.startswith("nats-") and n != "nats-msg-id"}
        await asyncio.sleep(1.5)  # past every TTL a producer asked for
        info = await h.js.stream_info("TASKS")
        assert info.state.first_seq == kept.seq  # nothing purged, nothing expired
        assert info.state.messages == 2 + len(sent)
        assert_still_connected(h.daemon)  # type: ignore[arg-type]


def _padded(target_bytes: int, size: int) -> bytes:
    """An envelope of exactly `size` bytes."""
    doc = envelope(data={"pad": ""})
    doc["data"]["pad"] = "x" * (size - len(raw_doc(doc)))
    out = raw_doc(doc)
    assert len(out) == size
    return out


async def test_payloads_one_under_at_and_one_over_the_limit(
    settings: Settings, database_url: str
) -> None:
    """A delivery of subject + payload one byte under the limit and exactly at it is stored
    and delivered; one byte over is dead-lettered `too_large`, and the others are unharmed."""
    async with hostile(settings) as h:
        daemon = await h.begin()
        assert daemon.bus is not None
        limit = daemon.bus.max_payload - HEADER_RESERVE
        subject = len(TARGET.encode())
        sizes = {"under": limit - subject - 1, "at": limit - subject, "over": limit - subject + 1}
        ids: dict[str, str] = {}
        for name, size in sizes.items():
            payload = _padded(subject, size)
            ids[name] = json.loads(payload)["id"]
            assert "seq" in await h.publish_raw(LANE, payload, None)
        assert h.tasks is not None
        got = await h.tasks.take(2, within=8)
        delivered = {m.headers["Nats-Msg-Id"]: len(m.data) for m in got if m.headers}
        assert delivered == {ids["under"]: sizes["under"], ids["at"]: sizes["at"]}
        found = await reasons(h, database_url, 1)
        reason, error = found[ids["over"]]
        assert reason == "too_large" and f"over the limit of {limit} bytes" in error
        assert_still_connected(daemon)


async def test_one_id_sent_by_several_producers_at_once_is_stored_once(
    settings: Settings, database_url: str
) -> None:
    """Ten producers publish ten different tasks under one id at the same moment (each with
    its own message id, so the lane keeps all ten): exactly one is delivered and the nine
    others are dead-lettered `duplicate_id`; a later task is delivered as usual."""
    async with hostile(settings) as h:
        await h.prepare()
        due = datetime.now(UTC) + timedelta(milliseconds=500)
        shared = envelope(due)
        docs: list[dict[str, Any]] = [{**shared, "data": {"n": n}} for n in range(10)]
        acks = await asyncio.gather(
            *(
                h.publish_raw(LANE, raw_doc(doc), header_block((b"Nats-Msg-Id", f"p{n}".encode())))
                for n, doc in enumerate(docs)
            )
        )
        assert all("seq" in ack for ack in acks)
        daemon = await h.begin()  # all ten wait on the lane: they arrive in one batch
        more = [{**envelope(due), "id": shared["id"], "data": {"n": 10 + n}} for n in range(5)]
        await asyncio.gather(*(h.publish_raw(LANE, raw_doc(doc), None) for doc in more))
        assert h.tasks is not None
        got = await h.tasks.take(2, within=4)
        assert len(got) == 1 and got[0].headers is not None
        assert got[0].headers["Nats-Msg-Id"] == shared["id"]
        assert json.loads(got[0].data)["data"] in [d["data"] for d in docs + more]
        rows: list[Any] = []
        async with asyncio.timeout(10):
            while len(rows) < 14:
                rows = await h.dead_rows(database_url)
                await asyncio.sleep(0.05)
        assert len(rows) == 14 and {r["reason"] for r in rows} == {"duplicate_id"}
        control, at = await h.control()
        await h.expect_delivered(control, at)
        assert_still_connected(daemon)
