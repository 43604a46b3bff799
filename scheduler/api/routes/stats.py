"""`/v1/stats`: the numbers an operator looks at first; their history, and the parts' health."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from scheduler.api.auth import Reader
from scheduler.api.models import JOB_NAME
from scheduler.api.problems import responses
from scheduler.api.routes.common import Ops
from scheduler.operations.history import health as health_of
from scheduler.operations.records import History, PartsHealth, Stats

router = APIRouter(tags=["statistics"])


@router.get("/v1/stats", response_model=Stats, responses=responses(401, 403, 422, 503))
async def stats(
    ops: Ops,
    _: Reader,
    top: Annotated[int, Query(ge=1, le=100, description="subjects listed by name")] = 10,
) -> Stats:
    """Pending tasks by subject (top N plus `other`), due within 1/5/15/60 minutes, lateness
    p50/p99 of the last 5 minutes, unresolved dead letters, leader and epoch. The figures are
    read once per SCHEDULER_FORECAST_INTERVAL and shared by every caller; `at` says when."""
    return await ops.stats.stats(top)


@router.get("/v1/stats/history", response_model=History, responses=responses(401, 403, 422, 503))
async def history(
    ops: Ops,
    _: Reader,
    window: Annotated[
        Literal["1h", "1d"], Query(description="1h: 60 one-minute buckets; 1d: 24 one-hour ones")
    ] = "1h",
    job: Annotated[
        str | None,
        Query(pattern=JOB_NAME, max_length=100, description="one cron job's deliveries only"),
    ] = None,
) -> History:
    """Lateness p50/p99/max, deliveries per minute and dead letters per bucket over the last
    hour or day, from the fire log (manual fires left out); the deliveries at least
    `abnormal_ms` late, worst first, with their cause when the fire log tells it (a retry, a
    change of leader). At most 100,000 deliveries are read per answer, the newest
    (`truncated`, `covered_since`); each window is read once per 10 s and shared."""
    return await ops.stats.history.read(window, job)


@router.get("/v1/stats/health", response_model=PartsHealth, responses=responses(401, 403, 503))
async def parts_health(ops: Ops, _: Reader, request: Request) -> PartsHealth:
    """The answering instance's NATS connection; whether PostgreSQL answers on the API's pool
    (round trip); this host's clock minus PostgreSQL's against SCHEDULER_MAX_CLOCK_SKEW; the
    lease holder and how long it has held office. PostgreSQL is asked at most every 2 s."""
    backend = request.app.state.backend
    _, ready = backend.readiness()
    leader = await backend.leader()
    ping = await ops.stats.health.ping()
    bound = backend.settings.max_clock_skew.total_seconds() * 1000
    return health_of(ready, leader, ping, bound, ops.clock.now())
