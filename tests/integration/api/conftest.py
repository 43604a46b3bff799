"""The management API's fixture: a daemon with tokens and cron jobs, on real NATS and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from scheduler.settings import Settings
from tests.integration.api.harness import ApiHarness, running_api


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiHarness]:
    """Not started yet: call `await api.start(**overrides)` (tokens set, fast retries)."""
    async with running_api(settings) as harness:
        yield harness
