"""Drift: the latest drift audit's summary (SLO verdict, per schedule, per subject) and its full
report, from `SCHEDULER_AUDIT_DIR` through the API."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from scheduler.api.routes.audits import REPORT_CSP
from scheduler.console.view import Viewer

router = APIRouter(prefix="/drift", include_in_schema=False)
RUNS_LISTED = 30


@router.get("")
async def drift(view: Viewer, run: str = "") -> HTMLResponse:
    runs = await view.api.get("/v1/audits", limit=RUNS_LISTED)
    if not runs.ok:
        return view.failed(runs)
    items = runs.body["items"]
    chosen = run or (items[0]["run"] if items else "")
    summary, problem = None, None
    if chosen:
        answer = await view.api.get(f"/v1/audits/{chosen}")
        if answer.ok:
            summary = answer.body
        else:
            problem = answer.detail
    return view.render(
        "drift.html",
        active="drift",
        listing=runs.body,
        chosen=chosen,
        audit=summary,
        problem=problem,
        schedules=_rows(summary, "schedules"),
        subjects=_rows(summary, "subjects"),
    )


@router.get("/{run}/report.html")
async def report(view: Viewer, run: str) -> Response:
    """The audit's own page, passed through in a sandbox: no script runs, it cannot reach the
    console's cookies or pages, and nothing loads from elsewhere."""
    answer = await view.api.get(f"/v1/audits/{run}/report")
    if not answer.ok:
        return view.failed(answer, view.url("/drift"))
    # its own policy: the console's middleware adds the other security headers, not its CSP
    headers = {"Content-Security-Policy": REPORT_CSP + "; frame-ancestors 'none'"}
    return Response(answer.raw, media_type="text/html; charset=utf-8", headers=headers)


def _rows(audit: dict[str, Any] | None, part: str) -> list[tuple[str, dict[str, Any]]]:
    """A summary's schedules or subjects, the ones that break the SLO first, then by name."""
    if audit is None or not isinstance(audit["summary"].get(part), dict):
        return []
    slo = audit["summary"].get("slo") or {}
    breaches = set(slo.get("breaches") or [])
    rows = [
        (name, stats) for name, stats in audit["summary"][part].items() if isinstance(stats, dict)
    ]
    return sorted(rows, key=lambda row: (row[0] not in breaches, row[0]))
