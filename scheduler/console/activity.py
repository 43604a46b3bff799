"""Activity: the operator actions the API recorded (who, when, what, on which target, the
answer), newest first, filtered as `GET /v1/activity` filters them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from scheduler.console.view import Viewer

router = APIRouter(prefix="/activity", include_in_schema=False)
PAGE_SIZE = 50
ACTIONS = ("pause", "resume", "trigger", "backfill", "cancel", "reschedule", "replay", "resolve")


@router.get("")
async def activity(
    view: Viewer,
    action: str = "",
    target: str = "",
    who: str = "",
    since: str = "",
    until: str = "",
    cursor: str = "",
) -> HTMLResponse:
    query = {"action": action.strip(), "target": target.strip(), "who": who.strip()}
    query |= {"since": since.strip(), "until": until.strip()}
    params = {**query, "since": _instant(query["since"]), "until": _instant(query["until"])}
    listed = await view.api.get("/v1/activity", limit=PAGE_SIZE, cursor=cursor or None, **params)
    context: dict[str, Any] = {"query": query, "actions": ACTIONS, "active": "activity"}
    if not listed.ok:
        errors = listed.field_errors() or {"form": listed.detail}
        return view.render(
            "activity.html", listed.status, errors=errors, items=None, next_page=None, **context
        )
    next_cursor = listed.body["next_cursor"]
    next_page = view.url("/activity", cursor=next_cursor, **query) if next_cursor else None
    return view.render(
        "activity.html", errors={}, items=listed.body["items"], next_page=next_page, **context
    )


def _instant(text: str) -> str:
    """A time from the form: RFC 3339 as typed, or a browser's `datetime-local` value (no
    offset) read as UTC; anything else goes to the API as typed, which names the field."""
    if not text:
        return ""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return text
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat()
