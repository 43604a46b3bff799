"""The cron engine's prepared messages are byte for byte what `envelope()` builds when due."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from scheduler.clock import to_rfc3339
from scheduler.engine.recurring import Prepared, envelope
from scheduler.schedules import load_text

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
