"""`/v1/audits`: the drift audit's runs under `SCHEDULER_AUDIT_DIR`, their summary and report."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from scheduler.api.auth import Reader
from scheduler.api.models import AuditSummary
from scheduler.api.problems import ApiProblem, responses
from scheduler.operations.audits import RUN_NAME, AuditReports, AuditUnreadableError
from scheduler.operations.records import AuditRuns

router = APIRouter(prefix="/v1/audits", tags=["drift audit"])
Run = Annotated[str, Path(pattern=RUN_NAME, description="the run's folder name")]
# The report is a page the audit wrote: shown in a sandbox (its own origin, no script, nothing
# loaded from anywhere but itself), so it can never act as the console or the API.
REPORT_CSP = "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'"
READ = responses(401, 403, 404, 409, 422)
REPORT_PAGE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/html": {}}, "description": "the report page"}
}


def _reports(request: Request) -> AuditReports:
    return AuditReports(request.app.state.backend.settings.audit_dir)


@router.get("", response_model=AuditRuns, responses=responses(401, 403, 422))
async def list_audits(
    request: Request,
    _: Reader,
    limit: Annotated[int, Query(ge=1, le=366, description="at most this many runs")] = 30,
) -> AuditRuns:
    """The runs, newest day first (`configured` false when SCHEDULER_AUDIT_DIR is not set)."""
    return await asyncio.to_thread(_reports(request).listing, limit)


@router.get("/{run}", response_model=AuditSummary, responses=READ)
async def get_audit(run: Run, request: Request, _: Reader) -> Any:
    """A run's `summary.json` (the SLO verdict, per schedule and per subject)."""
    reports = _reports(request)
    summary = await _read(reports, reports.summary, run, "summary.json")
    has_report = await asyncio.to_thread(reports.has_report, run)
    return {"run": run, "has_report": has_report, "summary": summary}


@router.get(
    "/{run}/report",
    response_class=Response,
    responses=REPORT_PAGE | READ,
)
async def get_audit_report(run: Run, request: Request, _: Reader) -> Response:
    """A run's `report.html`, served in a sandbox (no script runs, nothing else loads)."""
    reports = _reports(request)
    body = await _read(reports, reports.report, run, "report.html")
    headers = {"Content-Security-Policy": REPORT_CSP, "X-Content-Type-Options": "nosniff"}
    return Response(body, media_type="text/html; charset=utf-8", headers=headers)


async def _read(reports: AuditReports, reader: Any, run: str, name: str) -> Any:
    try:
        found = await asyncio.to_thread(reader, run)
    except AuditUnreadableError as exc:
        raise ApiProblem(409, "unreadable", str(exc), id=run) from None
    if found is None:
        detail = f"no {name} of an audit run {run!r} in SCHEDULER_AUDIT_DIR"
        if reports.directory is None:
            detail = "SCHEDULER_AUDIT_DIR is not set, so there are no audit runs to read"
        raise ApiProblem(404, "not_found", detail, id=run)
    return found
