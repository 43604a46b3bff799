"""Schedules: every cron job with its next occurrences and last fires; pause, resume and
trigger (after a confirmation); the YAML's errors as a banner."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from scheduler.api.models import JOB_NAME
from scheduler.api.ui.console import Actor, View, Viewer, page_url, shown

router = APIRouter(prefix="/ui/schedules", include_in_schema=False)
PAGE_SIZE = 25
NEXT_SHOWN = 5
FIRES_SHOWN = 3
DETAIL_CALLS = 8  # job details fetched at once for a page of the list
ACTIONS = {"pause": "Paused", "resume": "Resumed", "trigger": "Triggered"}


@router.get("")
async def schedules(view: Viewer, cursor: str = "") -> HTMLResponse:
    listed = await view.api.get("/v1/schedules", limit=PAGE_SIZE, cursor=cursor or None)
    if not listed.ok:
        return view.failed(listed)
    jobs = await _details(view, [item["name"] for item in listed.body["items"]])
    return view.render(
        "schedules.html",
        active="schedules",
        jobs=jobs,
        yaml_problems=listed.body.get("problems", []),
        next_page=page_url("/ui/schedules", cursor=listed.body["next_cursor"])
        if listed.body["next_cursor"]
        else None,
        next_shown=NEXT_SHOWN,
        fires_shown=FIRES_SHOWN,
    )


async def _details(view: View, names: list[str]) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(DETAIL_CALLS)

    async def one(name: str) -> dict[str, Any] | None:
        async with gate:
            answer = await view.api.get(f"/v1/schedules/{name}")
        return answer.body if answer.ok else None

    found = await asyncio.gather(*(one(name) for name in names))
    return [job for job in found if job is not None]


@router.get("/{name}")
async def schedule(view: Viewer, name: str) -> HTMLResponse:
    return await shown(view, f"/v1/schedules/{name}", "schedule.html", "job", "schedules")


@router.get("/{name}/trigger")
async def confirm_trigger(view: Viewer, name: str) -> HTMLResponse:
    path = f"/v1/schedules/{name}"
    return await shown(view, path, "confirm_trigger.html", "job", "schedules", "/ui/schedules")


@router.post("/{name}/{action}")
async def act(form: Actor, name: str, action: str) -> Response:
    view = form.view
    back = _back(form.get("back"), name)
    if action not in ACTIONS:
        return view.render("error.html", 404, title="Not found", message=f"no action {action!r}")
    note = form.get("note") if action == "pause" else ""
    body = {"note": note} if note else None  # the API bounds it (422 naming `note`)
    answer = await view.api.call("POST", f"/v1/schedules/{name}/{action}", body=body, key=form.key)
    if not answer.ok:
        return view.failed(answer, back)
    message = f"{ACTIONS[action]} {name}."
    if action == "trigger":
        body = answer.body
        message = (
            f"Triggered {name}: published to {body['subject']} "
            f"(stream {body['stream']}, sequence {body['seq']}, message id {body['msg_id']})."
        )
    return view.redirect(back, ("ok", message))


def _back(back: str, name: str) -> str:
    if back == "list" or not re.fullmatch(JOB_NAME, name):
        return "/ui/schedules"
    return f"/ui/schedules/{name}"
