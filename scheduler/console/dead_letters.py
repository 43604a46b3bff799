"""Dead letters: list by reason, subject, stage and state; the error and the original message;
replay one or a filtered batch (each after a confirmation, the batch with its count); resolve."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from scheduler.console.view import Actor, View, Viewer, shown

router = APIRouter(prefix="/dead-letters", include_in_schema=False)
PAGE_SIZE = 50
BATCH_MAX = 1000  # the API's limit for one batch replay
STAGES = ("intake", "firing", "replay")
RESOLVED = {"false": "unresolved", "true": "resolved", "": "all"}


@router.get("")
async def dead_letters(
    view: Viewer,
    reason: str = "",
    subject: str = "",
    stage: str = "",
    resolved: str = "false",
    cursor: str = "",
) -> HTMLResponse:
    query = _query(reason, subject, stage, resolved)
    listed = await view.api.get("/v1/dead-letters", limit=PAGE_SIZE, cursor=cursor or None, **query)
    context: dict[str, Any] = {"query": query, "stages": STAGES, "states": RESOLVED}
    if not listed.ok:
        errors = listed.field_errors() or {"form": listed.detail}
        return view.render(
            "dead_letters.html", listed.status, active="dead-letters", errors=errors,
            items=None, next_page=None, **context,
        )  # fmt: skip
    next_cursor = listed.body["next_cursor"]
    next_page = view.url("/dead-letters", cursor=next_cursor, **query) if next_cursor else None
    return view.render(
        "dead_letters.html", active="dead-letters", errors={}, items=listed.body["items"],
        next_page=next_page, **context,
    )  # fmt: skip


@router.get("/replay")
async def confirm_batch(
    view: Viewer, reason: str = "", subject: str = "", stage: str = ""
) -> HTMLResponse:
    """How many unresolved dead letters the filter matches (up to a batch), before replaying."""
    query = _query(reason, subject, stage, "false")
    matched = await _count(view, query)
    if isinstance(matched, Response):
        return matched
    return view.render(
        "confirm_batch.html", active="dead-letters", query=query, matched=matched,
        capped=matched >= BATCH_MAX,
    )  # fmt: skip


@router.post("/replay")
async def replay_batch(form: Actor) -> Response:
    view = form.view
    query = _query(form.get("reason"), form.get("subject"), form.get("stage"), "false")
    back = view.url("/dead-letters", **query)
    try:
        limit = int(form.get("count"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= BATCH_MAX:
        message = f"count: replay between 1 and {BATCH_MAX} at once (confirm the count again)"
        return view.render("error.html", 422, title="Not done", message=message, back=back)
    filters = {k: v for k, v in query.items() if k != "resolved" and v}
    answer = await view.api.call(
        "POST", "/v1/dead-letters/replay", body={**filters, "limit": limit}, key=form.key
    )
    if not answer.ok:
        return view.failed(answer, back)
    refused = Counter(r["status"] for r in answer.body["results"] if r["status"] != "replayed")
    message = f"Replayed {answer.body['replayed']} of {len(answer.body['results'])}."
    if refused:
        message += " Not replayed: " + ", ".join(f"{n} {why}" for why, n in refused.items()) + "."
    return view.redirect(back, ("ok" if not refused else "error", message))


@router.get("/{dead_id}")
async def dead_letter(view: Viewer, dead_id: str) -> HTMLResponse:
    path = f"/v1/dead-letters/{dead_id}"
    back = view.url("/dead-letters")
    return await shown(view, path, "dead_letter.html", "dead", "dead-letters", back)


@router.get("/{dead_id}/replay")
async def confirm_replay(view: Viewer, dead_id: str) -> HTMLResponse:
    path = f"/v1/dead-letters/{dead_id}"
    back = view.url("/dead-letters")
    return await shown(view, path, "confirm_replay.html", "dead", "dead-letters", back)


@router.post("/{dead_id}/replay")
async def replay(form: Actor, dead_id: str) -> Response:
    view = form.view
    back = view.url(f"/dead-letters/{dead_id}")
    answer = await view.api.call("POST", f"/v1/dead-letters/{dead_id}/replay", key=form.key)
    if not answer.ok:
        return view.failed(answer, back)
    how = "back to pending" if answer.body.get("via") == "firing" else "through the delay lane"
    return view.redirect(back, ("ok", f"Replayed task {answer.body.get('task_id')} {how}."))


@router.post("/{dead_id}/resolve")
async def resolve(form: Actor, dead_id: str) -> Response:
    view = form.view
    back = view.url(f"/dead-letters/{dead_id}")
    resolved = form.get("resolved") != "false"
    body = {"resolved": resolved}
    answer = await view.api.call("PATCH", f"/v1/dead-letters/{dead_id}", body=body, key=form.key)
    if not answer.ok:
        return view.failed(answer, back)
    return view.redirect(back, ("ok", "Resolved." if resolved else "Opened again."))


def _query(reason: str, subject: str, stage: str, resolved: str) -> dict[str, str]:
    state = resolved if resolved in RESOLVED else "false"
    return {"reason": reason.strip(), "subject": subject.strip(), "stage": stage, "resolved": state}


async def _count(view: View, query: dict[str, str]) -> int | HTMLResponse:
    """Unresolved dead letters matching `query`, counted through the list, up to a batch."""
    matched, cursor = 0, None
    while matched < BATCH_MAX:
        page = await view.api.get("/v1/dead-letters", limit=500, cursor=cursor, **query)
        if not page.ok:
            return view.failed(page, view.url("/dead-letters", **query))
        matched += len(page.body["items"])
        cursor = page.body["next_cursor"]
        if cursor is None:
            break
    return min(matched, BATCH_MAX)
