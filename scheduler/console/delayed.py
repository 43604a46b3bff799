"""Delayed tasks: search by id, subject, org, status and due window; a task's envelope (shown
as text, never as markup); cancel (after a confirmation) and reschedule."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from scheduler.api.models import TASK_STATUSES
from scheduler.console.view import Actor, Viewer, shown
from scheduler.durations import parse_duration

router = APIRouter(prefix="/delayed", include_in_schema=False)
PAGE_SIZE = 50
STATUSES = TASK_STATUSES
ANY = "any"  # the status select's "any" option (no status filter), also typed in a URL
FILTERS = ("subject", "org_id", "status", "due_after", "due_before")


@router.get("")
async def search(
    view: Viewer,
    id: str = "",
    subject: str = "",
    org_id: str = "",
    status: str = "",
    due_after: str = "",
    due_before: str = "",
    cursor: str = "",
) -> Response:
    query = {"id": id.strip(), "subject": subject.strip(), "org_id": org_id.strip()}
    status = "" if status == ANY else status
    query |= {"status": status, "due_after": due_after.strip(), "due_before": due_before.strip()}
    context: dict[str, Any] = {
        "active": "delayed",
        "query": query,
        "statuses": STATUSES,
        "tasks": None,
    }
    if query["id"]:
        found = await view.api.get(f"/v1/delayed/{query['id']}")
        if found.ok:
            return view.redirect(view.url(f"/delayed/{quote(query['id'], safe='')}"))
        errors = found.field_errors() or {"id": found.detail}
        return view.render("delayed.html", found.status, errors=errors, next_page=None, **context)
    filters = {name: query[name] for name in FILTERS}
    listed = await view.api.get("/v1/delayed", limit=PAGE_SIZE, cursor=cursor or None, **filters)
    if not listed.ok:
        errors = listed.field_errors() or {"form": listed.detail}
        return view.render("delayed.html", listed.status, errors=errors, next_page=None, **context)
    next_cursor = listed.body["next_cursor"]
    next_page = view.url("/delayed", cursor=next_cursor, **filters) if next_cursor else None
    context["tasks"] = listed.body["items"]
    return view.render("delayed.html", errors={}, next_page=next_page, **context)


@router.get("/{task_id}")
async def task(view: Viewer, task_id: str) -> HTMLResponse:
    path = f"/v1/delayed/{task_id}"
    return await shown(view, path, "task.html", "task", "delayed", view.url("/delayed"))


@router.get("/{task_id}/cancel")
async def confirm_cancel(view: Viewer, task_id: str) -> HTMLResponse:
    path = f"/v1/delayed/{task_id}"
    back = view.url("/delayed")
    return await shown(view, path, "confirm_cancel.html", "task", "delayed", back)


@router.post("/{task_id}/cancel")
async def cancel(form: Actor, task_id: str) -> Response:
    view = form.view
    back = view.url(f"/delayed/{quote(task_id, safe='')}")
    answer = await view.api.call("DELETE", f"/v1/delayed/{task_id}", key=form.key)
    if not answer.ok:
        return view.failed(answer, back)
    return view.redirect(back, ("ok", f"Cancelled {task_id}: it will not be delivered."))


@router.post("/{task_id}/reschedule")
async def reschedule(form: Actor, task_id: str) -> Response:
    view = form.view
    back = view.url(f"/delayed/{quote(task_id, safe='')}")
    at, after = form.get("at"), form.get("in")
    if after and not at:
        try:
            at = (datetime.now(UTC) + parse_duration(after)).isoformat()
        except ValueError as exc:
            message = f"in: {exc} (e.g. 90s, 10m, 2h)"
            return view.render("error.html", 422, title="Not done", message=message, back=back)
    if not at:
        message = "Give a new due time (RFC 3339, e.g. 2026-11-25T10:00:00Z) or a delay (10m)."
        return view.render("error.html", 422, title="Not done", message=message, back=back)
    answer = await view.api.call("PATCH", f"/v1/delayed/{task_id}", body={"delay_until": at})
    if not answer.ok:
        return view.failed(answer, back)
    return view.redirect(back, ("ok", f"Rescheduled {task_id} to {answer.body['due_at']}."))
