"""Overview: who leads and who stands by, the parts' health, a summary of the schedules, what
is pending and due, lateness, history charts, dead letters, warnings. console.js refreshes its
live part every few seconds."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from scheduler.console.trends import WINDOWS, Summary, charts, summarize
from scheduler.console.view import View, Viewer, fragment_or

router = APIRouter(include_in_schema=False)
REFRESH_SECONDS = 5
SUMMARY_PAGE = 500  # the API's largest page
SUMMARY_PAGES = 4  # jobs counted at most: SUMMARY_PAGE * SUMMARY_PAGES (the rest: "partial")
SUMMARY_MAX_AGE = 5.0  # every open tab polls: the summary is read once per this for all of them
_kept: dict[str, tuple[float, tuple[list[dict[str, Any]], bool]]] = {}


@router.get("/")
async def overview(view: Viewer, window: str = "1h") -> HTMLResponse:
    window = window if window in WINDOWS else "1h"
    stats, instances, ready, leader, schedules, history, health = await asyncio.gather(
        view.api.get("/v1/stats"),
        view.api.get("/v1/instances"),
        view.api.get("/readyz"),
        view.api.get("/v1/leader"),
        view.api.get("/v1/schedules", limit=1),
        view.api.get("/v1/stats/history", window=window),
        view.api.get("/v1/stats/health"),
    )
    problems = [a.detail for a in (stats, instances, history, health) if not a.ok]
    yaml_problems = schedules.body.get("problems", []) if schedules.ok else []
    ready_doc = ready.body or {}
    return fragment_or(
        view,
        "overview.html",
        "overview_live.html",
        active="overview",
        refresh=REFRESH_SECONDS,
        refresh_url=view.url("/", window=window if window != "1h" else None),
        window=window,
        windows=WINDOWS,
        history_path=view.url("/"),
        stats=stats.body if stats.ok else None,
        instances=instances.body["items"] if instances.ok else [],
        ready=ready_doc,
        warnings=other_warnings(ready_doc.get("warnings") or [], yaml_problems),
        leader=leader.body or {},
        yaml_problems=yaml_problems,
        history=history.body if history.ok else None,
        charts=charts(history.body) if history.ok else None,
        health=health.body if health.ok else None,
        summary=await schedule_summary(view),
        problems=problems,
    )


def other_warnings(warnings: list[str], yaml_problems: list[dict[str, Any]]) -> list[str]:
    """/readyz's warnings less the schedules YAML's errors, which the banner above shows."""
    shown = [str(p.get("message", "")) for p in yaml_problems]
    return [w for w in warnings if not any(m and m in w for m in shown)]


async def schedule_summary(view: View) -> Summary | None:
    """Active, paused and failed jobs and the next occurrence. The jobs are read at most every
    few seconds for every tab (the same for every reader), over at most SUMMARY_PAGES pages;
    the next occurrence is worked out at each render, so it is never in the past."""
    kept = _kept.get("jobs")
    if kept is None or time.monotonic() - kept[0] >= SUMMARY_MAX_AGE:
        jobs: list[dict[str, Any]] = []
        cursor = None
        for _ in range(SUMMARY_PAGES):
            page = await view.api.get("/v1/schedules", limit=SUMMARY_PAGE, cursor=cursor)
            if not page.ok:
                return None
            jobs += page.body["items"]
            cursor = page.body["next_cursor"]
            if cursor is None:
                break
        kept = (time.monotonic(), (jobs, cursor is not None))
        _kept["jobs"] = kept
    jobs, partial = kept[1]
    return summarize(jobs, datetime.now(UTC), partial=partial)
