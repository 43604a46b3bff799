"""Overview: who leads and who stands by, what is pending and due, lateness, dead letters,
warnings. console.js refreshes its live part every few seconds."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from scheduler.api.ui.console import Viewer, fragment_or

router = APIRouter(prefix="/ui", include_in_schema=False)
REFRESH_SECONDS = 5


@router.get("/")
async def overview(view: Viewer) -> HTMLResponse:
    stats, instances, ready, leader, schedules = await asyncio.gather(
        view.api.get("/v1/stats"),
        view.api.get("/v1/instances"),
        view.api.get("/readyz"),
        view.api.get("/v1/leader"),
        view.api.get("/v1/schedules", limit=1),
    )
    problems = [a.detail for a in (stats, instances) if not a.ok]
    return fragment_or(
        view,
        "overview.html",
        "overview_live.html",
        active="overview",
        refresh=REFRESH_SECONDS,
        stats=stats.body if stats.ok else None,
        instances=instances.body["items"] if instances.ok else [],
        ready=ready.body or {},
        leader=leader.body or {},
        yaml_problems=schedules.body.get("problems", []) if schedules.ok else [],
        problems=problems,
    )
