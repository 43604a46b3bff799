"""`/v1/instances`: every running instance, leader and standbys, from their heartbeats."""

from __future__ import annotations

from fastapi import APIRouter, Request

from scheduler.api.auth import Reader
from scheduler.api.problems import responses
from scheduler.operations.records import InstanceList

router = APIRouter(tags=["health"])


@router.get("/v1/instances", response_model=InstanceList, responses=responses(401, 403, 503))
async def list_instances(request: Request, _: Reader) -> InstanceList:
    """Each instance with its role, epoch, since when and its latest heartbeat; the leader
    first. An instance that stopped leaves the list; one silent for 15 s is `stale`. For
    display: who leads is decided by the lease (`GET /v1/leader`)."""
    return InstanceList(items=await request.app.state.backend.instances())
