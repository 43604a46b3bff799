"""The property of issue 13, on a running daemon with real nats-server and PostgreSQL: whatever
bytes a producer publishes to the delay lane (subject tail, headers, payload), a well-formed
task published right after still arrives on time, the hostile message is accounted for (stored
as a task, or dead-lettered with a reason in the table and on the DLQ stream), nothing is left
on the lane, and the daemon's connection never closes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from scheduler.settings import Settings
from tests.support.hostile import Hostile, envelope, hostile
from tests.support.rawclient import header_block

EXAMPLES = 40
PAD = 1_046_000
ON_TIME = timedelta(seconds=2)  # a control task arrives at most this late (a shared 2-core host)

_WHITESPACE = b" \t\r\n\f\v"
# st.one_of picks a branch uniformly: a branch listed twice is drawn twice as often
tails = st.one_of(
    st.just(b"tasks.work"),
    st.just(b"tasks.work"),
    st.binary(min_size=1, max_size=40).map(
        lambda b: bytes(c for c in b if c not in _WHITESPACE) or b"x"
    ),
    st.sampled_from(
        [
            b"tasks.\xff",
            b"tasks.a\x00b",
            b"tasks.a\x7fb",
            b"*",
            b">",
            b"tasks..x",
            b"dlq.x",
            b"x",
            b"t." * 600 + b"x",
        ]
    ),
)
header_blocks = st.one_of(
    st.none(),
    st.none(),
    st.uuids().map(lambda u: header_block((b"Nats-Msg-Id", u.hex.encode()))),
    st.lists(
        st.tuples(
            st.sampled_from([b"mq-attempt", b"X-Trace", b"NATS-MSG-ID", b"Mq-Error", b"X:Y"]),
            st.sampled_from([b"1", b"a\nb", b"a\rb", b"a\x00b", b"\xff", b"\xc3\xa9", b""]),
        ),
        max_size=3,
    ).map(lambda pairs: header_block(*pairs)),
    st.lists(st.tuples(st.binary(min_size=1, max_size=12), st.binary(max_size=40)), max_size=3).map(
        lambda pairs: header_block(*pairs)
    ),
    st.binary(max_size=60),
)
HOSTILE_VALUES: dict[str, list[Any]] = {
    "id": ["t\n", "", "x" * 201, "a b", "\u0000", "\u00e9"],
    "priority": [0, 11, 10**30, 1.5, True, "1", None],
    "ttl_seconds": [0, -1, 3e11, 10**30, 300_000_000_000, 1],
    "delay_until": [
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "2020-01-01T00:00:00",
        "soon",
        12345,
        "+500 days",
        "+1 s",
    ],
    "timestamp": ["0001-01-01T00:00:00+01:00", "9999-12-31T23:00:00Z", "", 0],
    "data": [[], "x", {"s": "\u0000"}, {"s": "\ud800"}, {"n": float("nan")}, {"n": 10**400}],
    "schema": ["hanzo.mq.v2", None],
}


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes, or an envelope with one field made hostile (sometimes still valid)."""
    if draw(st.integers(0, 2)) == 0:
        return bytes(draw(st.binary(max_size=300)))
    doc = envelope(id=f"t_{draw(st.uuids()).hex}")
    field = draw(st.sampled_from(sorted(HOSTILE_VALUES)))
    value = draw(st.sampled_from(HOSTILE_VALUES[field]))
    if isinstance(value, str) and value.startswith("+"):
        amount, unit = value[1:].split()
        delta = timedelta(days=int(amount)) if unit == "days" else timedelta(seconds=int(amount))
        value = (datetime.now(UTC) + delta).isoformat()
    doc[field] = value
    return json.dumps(doc).encode()


def padded(payload: bytes, pad: bool) -> bytes:
    """`payload`, or with a megabyte of spaces before `data` (near max_payload). Built in the
    test, not the strategy, so hypothesis never prints a megabyte."""
    if not pad:
        return payload
    if b'"data"' in payload:
        return payload.replace(b'"data"', b" " * PAD + b'"data"', 1)
    return payload + b" " * PAD


class Accounts:
    """Deliveries and dead-letter copies seen so far, by `Nats-Msg-Id`."""

    def __init__(self, h: Hostile) -> None:
        self.h = h
        self.delivered: dict[str, Msg] = {}
        self.copies: dict[str, Msg] = {}

    async def wait(self, want: str, kind: str, within: float) -> Msg | None:
        reader = self.h.tasks if kind == "delivered" else self.h.dlq
        seen = self.delivered if kind == "delivered" else self.copies
        assert reader is not None
        async with asyncio.timeout(within + 1):
            deadline = asyncio.get_running_loop().time() + within
            while want not in seen and asyncio.get_running_loop().time() < deadline:
                for msg in await reader.take(20, within=0.2):
                    seen[(msg.headers or {}).get("Nats-Msg-Id", "")] = msg
        return seen.get(want)


@pytest.fixture
async def attacked(settings: Settings) -> AsyncIterator[tuple[Hostile, Accounts]]:
    async with hostile(settings) as h:
        # Every refusal stored in the table, so each lane message can be accounted for by its
        # row: past SCHEDULER_DEAD_LETTER_RATE a refusal is only counted (its own tests:
        # test_dead_letter_bounds.py), and the examples here share a few subjects.
        await h.begin(dead_letter_rate=0)
        yield h, Accounts(h)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tail=tails,
    headers=header_blocks,
    payload=payloads(),
    pad=st.sampled_from([False, False, False, False, True]),
)
async def test_any_bytes_on_the_lane_leave_the_daemon_working(
    attacked: tuple[Hostile, Accounts],
    database_url: str,
    tail: bytes,
    headers: bytes | None,
    payload: bytes,
    pad: bool,
) -> None:
    """Any subject tail, headers and payload: a control task still arrives on time, the
    hostile message is a stored task or a dead letter with a reason (table and stream, once),
    the lane is left empty, and the daemon never reconnects nor changes leader."""
    h, accounts = attacked
    payload = padded(payload, pad)
    daemon = h.daemon
    assert daemon is not None and daemon.bus is not None and daemon.office is not None
    ack = await h.publish_raw(b"mq.delay." + tail, payload, headers)
    stored_on_lane = "seq" in ack and not ack.get("duplicate")
    if not stored_on_lane:
        event("refused by the server")
    control, due = await h.control(delay=0.3)
    got = await accounts.wait(control, "delivered", within=ON_TIME.total_seconds() + 1)
    assert got is not None, f"control task {control} not delivered"
    assert due - timedelta(milliseconds=1) <= got.metadata.timestamp <= due + ON_TIME
    if stored_on_lane:
        await _accounted_for(h, accounts, database_url, int(ack["seq"]), payload)
    await _lane_empty(h)
    assert daemon.bus.is_connected and daemon.bus.nc is not None and not daemon.bus.nc.is_closed
    assert daemon.metrics.reconnects.labels("nats")._value.get() == 0
    assert daemon.office.epoch == 1 and daemon.office.may_act()


async def _accounted_for(
    h: Hostile, accounts: Accounts, database_url: str, seq: int, payload: bytes
) -> None:
    """The lane's message `seq` is a stored task or exactly one dead letter with a reason,
    whose copy is on the DLQ stream."""
    try:
        task_id = json.loads(payload).get("id")
    except Exception:  # not a JSON object: cannot be a task
        task_id = None
    if not (isinstance(task_id, str) and re.fullmatch(r"[\x21-\x7e]{1,200}", task_id)):
        task_id = None  # not an id a task can have (and not one to send PostgreSQL)
    conn = await asyncpg.connect(database_url)
    try:
        dead: list[asyncpg.Record] = []
        async with asyncio.timeout(5):
            while True:
                dead = await conn.fetch(
                    "SELECT intake_key, reason, error FROM dead_letters WHERE intake_key LIKE $1",
                    f"dlq-intake:MQ_DELAY:{seq}:%",
                )
                stored = task_id is not None and await conn.fetchval(  # a fired task's row
                    "SELECT EXISTS (SELECT 1 FROM delayed_messages WHERE id = $1) "  # is gone:
                    "OR EXISTS (SELECT 1 FROM fired_tasks WHERE id = $1)",  # its tombstone
                    task_id,
                )
                if dead or stored:
                    break
                await asyncio.sleep(0.05)
    finally:
        await conn.close()
    if not dead:
        event("stored as a task")
        return  # stored as a task (or an exact resend of one stored before)
    event(f"dead-lettered: {dead[0]['reason']}")
    assert len(dead) == 1
    assert dead[0]["reason"] and dead[0]["error"]
    copy = await accounts.wait(dead[0]["intake_key"], "copy", within=3.0)
    assert copy is not None, f"no DLQ copy for {dead[0]['intake_key']}"
    assert copy.headers is not None
    assert copy.headers["Mq-Error-Reason"] == dead[0]["reason"]


async def _lane_empty(h: Hostile) -> None:
    """Every message on the lane was acked or termed: nothing waits to be redelivered."""
    left = -1
    async with asyncio.timeout(5):
        while left != 0:
            left = (await h.js.stream_info("MQ_DELAY")).state.messages
            if left:
                await asyncio.sleep(0.05)
