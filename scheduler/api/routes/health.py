"""Health, readiness and leader: no token needed (probes and load balancers call them)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from scheduler.api.models import Health, LeaderView, Readiness

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    response_model=Health,
    responses={
        503: {
            "model": Health,
            "description": "the process is stopping, or its NATS connection is closed for good",
        }
    },
)
async def healthz(request: Request) -> Any:
    """200 while the process runs its loops (starting included); 503 once nats-py has given
    the connection up for good (only a restart helps)."""
    alive = request.app.state.backend.is_alive()
    return JSONResponse({"alive": alive}, status_code=200 if alive else 503)


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "not connected or not migrated yet"}},
)
async def readyz(request: Request) -> Any:
    """200 once NATS is connected and the schema migrated, on leader and standby alike."""
    ready, body = request.app.state.backend.readiness()
    return JSONResponse({"ready": ready, **body}, status_code=200 if ready else 503)


@router.get("/v1/leader", response_model=LeaderView, response_model_by_alias=True)
async def leader(request: Request) -> Any:
    """Who holds the lease (instance, epoch, since: P = 1), the partition map (every
    partition's owner, epoch and since; each engine's share; the partitions nobody holds) and
    this instance's own view (`self`). Read from the lease bucket for display (at most every
    half second); leadership is never decided by a read."""
    return await request.app.state.backend.leader()
