"""The firing path's pre-built header blocks and the fast PubAck reader must match the generic
paths byte for byte / field for field (the generic ones are checked against a real server in
tests/integration/test_wire.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.bus.nats.frames import delivery_headers
from scheduler.bus.nats.inflight import parse_ack, parse_block
from scheduler.bus.nats.wire import Wire
from scheduler.records import ClaimedTask, PubAck, PublishError


class _RawClient:
    """Just the attributes `Wire` looks for to take its raw path."""

    _pending: list[bytes] = []
    _pending_data_size = 0
    _max_payload = 1 << 20
    _transport = None  # no socket: nothing is sent in these tests
    is_connected = True

    async def _flush_pending(self) -> None:  # pragma: no cover - never awaited here
        return None


def _task(task_id: str, headers: dict[str, str] | None = None, attempts: int = 1) -> ClaimedTask:
    due = datetime(2026, 11, 22, 6, 0, 0, 123000, tzinfo=UTC)
    return ClaimedTask(
        id=task_id,
        target="mq.inference.chat",
        payload=b'{"id":"x"}',
        headers=headers or {},
        priority=5,
        due_at=due,
        scheduled_for=due,
        expires_at=None,
        attempts=attempts,
        seq=7,
    )


@pytest.mark.parametrize("task_id", ["0190c1e2-7b3f-7000-8000-000000000001", "job@2026", "a" * 200])
@pytest.mark.parametrize("attempts", [1, 3, 12])
def test_block_frame_equals_generic_frame(task_id: str, attempts: int) -> None:
    task = _task(task_id, attempts=attempts)
    fired_at = "2026-11-22T06:00:00.125Z"
    block = delivery_headers(task, fired_at, fired_at.encode())
    assert isinstance(block, bytes)
    generic = {
        "Nats-Msg-Id": task_id,
        "Mq-Scheduled-For": "2026-11-22T06:00:00.123Z",
        "Mq-Fired-At": fired_at,
        "Mq-Attempt": str(attempts),
    }
    assert parse_block(block) == generic
    wire = Wire(_RawClient())  # type: ignore[arg-type]
    assert wire.raw
    reply = "_INBOX.abc.42"
    want = wire.frame(task.target, task.payload, reply, generic)
    assert want is not None
    assert Wire.frame_block(task.target, task.payload, reply, block) == want


def test_producer_headers_or_odd_ids_take_the_generic_path() -> None:
    fired_at = "2026-11-22T06:00:00.125Z"
    with_headers = delivery_headers(_task("t1", {"Trace-Id": "abc"}), fired_at, fired_at.encode())
    assert with_headers == {
        "Trace-Id": "abc",
        "Nats-Msg-Id": "t1",
        "Mq-Scheduled-For": "2026-11-22T06:00:00.123Z",
        "Mq-Fired-At": fired_at,
        "Mq-Attempt": "1",
    }
    for odd in ("bad\r\nInjected: 1", "naïve-id"):
        assert isinstance(delivery_headers(_task(odd), fired_at, fired_at.encode()), dict)


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b'{"stream":"BENCH","seq":1}', PubAck("BENCH", 1, False)),
        (b'{"stream":"MQ_TASKS","seq":184467440737}', PubAck("MQ_TASKS", 184467440737, False)),
        (b'{"stream":"S","seq":9,"duplicate":true}', PubAck("S", 9, True)),
        (b'{"stream":"S","domain":"hub","seq":9}', PubAck("S", 9, False)),
        (b'{"stream":"S","seq":}', None),
        (b'{"stream":"S\\"x","seq":3}', PubAck('S"x', 3, False)),
    ],
)
def test_fast_puback_reader_agrees_with_json(data: bytes, want: PubAck | None) -> None:
    got = parse_ack(data, None, "mq.x")
    if want is None:
        assert isinstance(got, PublishError) and "unreadable" in str(got)
    else:
        assert got == want


def test_error_puback_is_an_error() -> None:
    data = b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}'
    got = parse_ack(data, None, "mq.x")
    assert isinstance(got, PublishError) and "10077" in str(got)
