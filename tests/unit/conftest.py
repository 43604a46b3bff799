"""The unit tests' shared fixture: the management API in-process on the operator half's twins."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.edge_twins import EdgeOnTwins, edge_on_twins


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[EdgeOnTwins]:
    """The API on twins with the API suite's cron jobs (a module may define its own `api`)."""
    async with edge_on_twins(tmp_path) as edge:
        yield edge
