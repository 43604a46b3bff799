"""`/v1/stats`: the numbers an operator looks at first."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from scheduler.api.auth import Reader
from scheduler.api.models import Stats
from scheduler.api.problems import responses
from scheduler.api.routes.common import Ops

router = APIRouter(tags=["statistics"])


@router.get("/v1/stats", response_model=Stats, responses=responses(401, 403, 422, 503))
async def stats(
    ops: Ops,
    _: Reader,
    top: Annotated[int, Query(ge=1, le=100, description="subjects listed by name")] = 10,
) -> Any:
    """Pending tasks by subject (top N plus `other`), due within 1/5/15/60 minutes, lateness
    p50/p99 of the last 5 minutes, unresolved dead letters, leader and epoch. The figures are
    read once per SCHEDULER_FORECAST_INTERVAL and shared by every caller; `at` says when."""
    return await ops.stats.stats(top)
