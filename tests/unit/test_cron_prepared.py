"""The cron engine's prepared messages are byte for byte what `envelope()` builds when due."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.clock import to_rfc3339
from scheduler.cron.jobs import load_text
from scheduler.engine.cron.message import Prepared, envelope

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
    assert ready.message(to_rfc3339(now)) == envelope(job, at, now)


def test_data_holding_the_placeholder_takes_the_slow_path() -> None:
    job = load_text(YAML.format(text="1999-12-31T23:59:59.999Z")).jobs[0]
    at = datetime(2026, 11, 23, 6, tzinfo=UTC)
    assert Prepared.build(job, at, at) is None


class _Client:
    """Just what `Wire` looks for on a nats-py client; nothing is sent in these tests."""

    _pending: list[bytes] = []
    _pending_data_size = 0
    _transport = None  # no socket: nothing is sent in these tests

    async def _flush_pending(self) -> None:
        return None


@pytest.mark.parametrize("text", ["plain", "ünïcode ✓"])
def test_prepared_frame_equals_the_frame_of_the_envelope_at_firing_time(text: str) -> None:
    from scheduler.bus.nats.publisher import Publisher

    publisher = Publisher(_Client())  # type: ignore[arg-type]
    job = load_text(YAML.format(text=text)).jobs[0]
    at = datetime(2026, 11, 23, 6, tzinfo=UTC)
    ready = Prepared.build(job, at, at, publisher)
    assert ready is not None and ready.publisher is publisher and len(ready.frame_parts) == 3
    now = datetime(2026, 11, 23, 6, 0, 0, 7000, tzinfo=UTC)
    body, headers = envelope(job, at, now)
    expected = publisher.wire.frame(job.subject, body, ready.reply, headers)
    assert ready.frame(to_rfc3339(now).encode()) == expected
    assert expected is not None and b"HPUB mq.reports.daily " in expected
