"""The cron engine's prepared messages are byte for byte what `envelope()` builds when due."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.clock import to_rfc3339
from scheduler.cron.jobs import load_text
from scheduler.engine.cron.message import Prepared, envelope
from scheduler.messages.prepared import PreparedMessage

YAML = """\
scheduled_jobs:
  - name: report
    subject: mq.reports.daily
    cron: "0 6 * * *"
    priority: 3
    ttl_seconds: 600
    data: {{"text": "{text}", "n": [1, 2]}}
"""


@pytest.mark.parametrize("text", ["plain", "ünïcode ✓", "2026-11-23T06:00:00.000Z"])
def test_prepared_message_equals_envelope_at_firing_time(text: str) -> None:
    job = load_text(YAML.format(text=text)).jobs[0]
    at = datetime(2026, 11, 23, 6, tzinfo=UTC)
    ready = Prepared.build(job, datetime(2026, 11, 22, 6, tzinfo=UTC), at)
    assert ready is not None
    now = datetime(2026, 11, 23, 6, 0, 0, 3000, tzinfo=UTC)
    assert ready.message.at(to_rfc3339(now)) == envelope(job, at, now)
    assert ready.outgoing.message == ready.message  # no broker: sent as it is


def test_data_holding_the_placeholder_takes_the_slow_path() -> None:
    job = load_text(YAML.format(text="1999-12-31T23:59:59.999Z")).jobs[0]
    at = datetime(2026, 11, 23, 6, tzinfo=UTC)
    assert Prepared.build(job, at, at) is None


class _Client:
    """Just what `Wire` looks for on a nats-py client: a pending buffer no socket drains."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._pending_data_size = 0
        self._max_payload = 1 << 20
        self._flush_queue = None
        self._transport = None  # no socket: frames stay in the buffer
        self.is_connected = True
        self.stats = {"reconnects": 0, "out_msgs": 0, "out_bytes": 0}

    @property
    def max_payload(self) -> int:
        return self._max_payload

    def new_inbox(self) -> str:
        return "_INBOX.prep"

    async def _flush_pending(self) -> None:  # pragma: no cover - _flush_queue is None
        return None


def _publisher(nc: _Client) -> Any:
    from scheduler.bus.nats.publisher import Publisher

    publisher = Publisher(nc)  # type: ignore[arg-type]
    publisher._prefix = nc.new_inbox()  # as start() would, without a subscription
    return publisher


@pytest.mark.parametrize("text", ["plain", "ünïcode ✓"])
async def test_prepared_frame_equals_the_frame_of_the_envelope_at_firing_time(text: str) -> None:
    """The wire publisher sends a prepared message as the very frame of the envelope built at
    the firing time, for the reply subject it reserved when preparing it."""
    from scheduler.bus.nats.wire import _reply_of

    nc = _Client()
    publisher = _publisher(nc)
    job = load_text(YAML.format(text=text)).jobs[0]
    at = datetime(2026, 11, 23, 6, tzinfo=UTC)
    ready = Prepared.build(job, at, at, publisher)
    assert ready is not None and type(ready.outgoing) is not PreparedMessage  # framed ahead
    now = datetime(2026, 11, 23, 6, 0, 0, 7000, tzinfo=UTC)
    await publisher.publish_prepared([ready.outgoing], now)
    (sent,) = nc._pending
    reply = _reply_of(sent)
    assert reply is not None and reply.startswith(b"_INBOX.prep.")
    body, headers = envelope(job, at, now)
    expected = publisher.wire.frame(job.subject, body, reply.decode(), headers)
    assert sent == expected
    assert expected is not None and b"HPUB mq.reports.daily " in expected


async def test_a_message_prepared_elsewhere_is_sent_as_a_fresh_one() -> None:
    """A message another publisher prepared (an earlier term's) leaves this one with a reply
    subject of its own, byte for byte the envelope at the firing time."""
    from scheduler.bus.nats.wire import _reply_of

    job = load_text(YAML.format(text="plain")).jobs[0]
    at = datetime(2026, 11, 23, 6, tzinfo=UTC)
    old = _Client()
    old.new_inbox = lambda: "_INBOX.old"  # type: ignore[method-assign]
    ready = Prepared.build(job, at, at, _publisher(old))
    assert ready is not None
    nc = _Client()
    publisher = _publisher(nc)
    now = datetime(2026, 11, 23, 6, 0, 0, 7000, tzinfo=UTC)
    await publisher.publish_prepared([ready.outgoing], now)
    (sent,) = nc._pending
    reply = _reply_of(sent)
    assert reply is not None and reply.startswith(b"_INBOX.prep.")
    body, headers = envelope(job, at, now)
    assert sent == publisher.wire.frame(job.subject, body, reply.decode(), headers)
