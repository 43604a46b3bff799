"""The management API's fixture: a daemon with tokens and cron jobs, on real NATS and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import aiohttp
import nats
import pytest

from scheduler.settings import Settings
from tests.integration.api.harness import ADMIN, READ, ApiHarness, write_jobs


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiHarness]:
    """Not started yet: call `await api.start(**overrides)` (tokens set, fast retries)."""
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    await js.add_stream(name="SCHEDULED", subjects=["mq.scheduled.>"], duplicate_window=120)
    write_jobs(settings)
    tuned = settings.with_overrides(
        admin_token=ADMIN,
        read_token=READ,
        backoff=timedelta(milliseconds=100),
        forecast_interval=timedelta(milliseconds=200),
    )
    async with aiohttp.ClientSession() as http:
        harness = ApiHarness(tuned, nc, http)
        try:
            yield harness
        finally:
            await harness.stop()
            await nc.close()
