"""Schedules: every cron job with its next occurrences and last fires; pause, resume,
trigger and backfill (after a confirmation); the YAML's errors as a banner."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from scheduler.api.models import JOB_NAME
from scheduler.console.trends import WINDOWS, charts, state_of
from scheduler.console.view import Actor, View, Viewer, shown

router = APIRouter(prefix="/schedules", include_in_schema=False)
PAGE_SIZE = 25
NEXT_SHOWN = 5
FIRES_SHOWN = 3
DETAIL_CALLS = 8  # job details fetched at once for a page of the list
ACTIONS = {"pause": "Paused", "resume": "Resumed", "trigger": "Triggered"}
STATES = ("", "active", "paused", "failed")  # "" is any
SEARCH_MAX = 100
SCAN_MAX = 500  # jobs read at most for one page of a search (the next page goes on from there)


@router.get("")
async def schedules(view: Viewer, cursor: str = "", q: str = "", state: str = "") -> HTMLResponse:
    query = {"q": q.strip(), "state": state}
    errors = _check(query)
    if errors:
        return _page(view, 422, query=query, errors=errors, jobs=[], yaml_problems=[])
    found = await _find(view, query, cursor)
    if isinstance(found, HTMLResponse):
        return found
    listed, problems, next_cursor, scanned = found
    jobs = await _details(view, [item["name"] for item in listed])
    return _page(
        view, 200, query=query, errors={}, jobs=jobs, yaml_problems=problems, scanned=scanned,
        next_page=view.url("/schedules", cursor=next_cursor, **query) if next_cursor else None,
    )  # fmt: skip


def _page(view: View, status: int, **context: Any) -> HTMLResponse:
    context.setdefault("next_page", None)
    context.setdefault("scanned", 0)
    return view.render(
        "schedules.html", status, active="schedules", states=STATES, next_shown=NEXT_SHOWN,
        fires_shown=FIRES_SHOWN, **context,
    )  # fmt: skip


def _check(query: dict[str, str]) -> dict[str, str]:
    """The search form's problems, by field (bounded before anything is read)."""
    errors = {}
    if len(query["q"]) > SEARCH_MAX:
        errors["q"] = f"q: at most {SEARCH_MAX} characters (got {len(query['q'])})"
    if query["state"] not in STATES:
        errors["state"] = f"state: one of {', '.join(s or 'any' for s in STATES)}"
    return errors


def matches(job: dict[str, Any], query: dict[str, str]) -> bool:
    """The job's name, subject or description holds `q` (any case), and it is in `state`."""
    text = query["q"].casefold()
    fields = (job["name"], job["subject"], job.get("description") or "")
    if text and not any(text in f.casefold() for f in fields):
        return False
    return not query["state"] or state_of(job) == query["state"]


async def _find(
    view: View, query: dict[str, str], cursor: str
) -> tuple[list[dict[str, Any]], list[Any], str | None, int] | HTMLResponse:
    """One page of matching jobs: the API's pages read in name order until PAGE_SIZE match or
    SCAN_MAX jobs were read (the next page then continues the search from there)."""
    found: list[dict[str, Any]] = []
    problems: list[Any] = []
    scanned, next_cursor = 0, cursor or None
    filtered = any(query.values())
    while True:
        listed = await view.api.get("/v1/schedules", limit=PAGE_SIZE, cursor=next_cursor)
        if not listed.ok:
            return view.failed(listed)
        problems = listed.body.get("problems", [])
        scanned += len(listed.body["items"])
        found += [job for job in listed.body["items"] if matches(job, query)]
        next_cursor = listed.body["next_cursor"]
        if not filtered or next_cursor is None or len(found) >= PAGE_SIZE or scanned >= SCAN_MAX:
            return found, problems, next_cursor, scanned


async def _details(view: View, names: list[str]) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(DETAIL_CALLS)

    async def one(name: str) -> dict[str, Any] | None:
        async with gate:
            answer = await view.api.get(f"/v1/schedules/{name}")
        return answer.body if answer.ok else None

    found = await asyncio.gather(*(one(name) for name in names))
    return [job for job in found if job is not None]


@router.get("/{name}")
async def schedule(view: Viewer, name: str, window: str = "1h") -> HTMLResponse:
    window = window if window in WINDOWS else "1h"
    job, history = await asyncio.gather(
        view.api.get(f"/v1/schedules/{name}"),
        view.api.get("/v1/stats/history", window=window, job=name),
    )
    if not job.ok:
        return view.failed(job)
    return view.render(
        "schedule.html", active="schedules", job=job.body, window=window, windows=WINDOWS,
        history_path=view.url(f"/schedules/{job.body['name']}"),
        history=history.body if history.ok else None,
        charts=charts(history.body) if history.ok else None,
    )  # fmt: skip


@router.get("/{name}/trigger")
async def confirm_trigger(view: Viewer, name: str) -> HTMLResponse:
    path = f"/v1/schedules/{name}"
    back = view.url("/schedules")
    return await shown(view, path, "confirm_trigger.html", "job", "schedules", back)


@router.get("/{name}/backfill")
async def confirm_backfill(view: Viewer, name: str, start: str = "", end: str = "") -> Response:
    """The backfill form (from, to: UTC) and, once both are given, how many occurrences the
    window holds and how many an earlier backfill already fired (the API's dry run)."""
    job = await view.api.get(f"/v1/schedules/{name}")
    if not job.ok:
        return view.failed(job, view.url("/schedules"))
    start, end = start[:64], end[:64]
    window = {"start": start or _default(timedelta(days=1)), "end": end or _default(None)}
    plan = None
    if start and end:
        body = {"from": _utc(start), "to": _utc(end), "dry_run": True}
        plan = await view.api.call("POST", f"/v1/schedules/{name}/backfill", body=body)
        if not plan.ok:
            return view.failed(plan, view.url(f"/schedules/{name}/backfill"))
    return view.render(
        "confirm_backfill.html",
        active="schedules",
        job=job.body,
        window=window,
        plan=plan.body if plan else None,
    )


@router.post("/{name}/backfill")
async def backfill(form: Actor, name: str) -> Response:
    view = form.view
    back = _back(view, "detail", name)
    body = {"from": _utc(form.get("start")), "to": _utc(form.get("end"))}
    answer = await view.api.call("POST", f"/v1/schedules/{name}/backfill", body=body, key=form.key)
    if not answer.ok:
        return view.failed(answer, back)
    done = answer.body
    message = (
        f"Backfilled {name}: {done['fired']} occurrences fired, "
        f"{done['already_fired']} already fired before."
    )
    return view.redirect(back, ("ok", message))


def _default(ago: timedelta | None) -> str:
    """A form's default instant (UTC, minutes): now, or `ago` before the hour."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if ago is not None:
        now = now.replace(minute=0) - ago
    return now.strftime("%Y-%m-%dT%H:%M")


def _utc(text: str) -> str:
    """A form's instant as RFC 3339: a `datetime-local` value (no offset) is UTC; anything
    else goes to the API as typed, which names what is wrong with it."""
    text = text[:64]
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?", text):
        return text + ("Z" if text.count(":") == 2 else ":00Z")
    return text


@router.post("/{name}/{action}")
async def act(form: Actor, name: str, action: str) -> Response:
    view = form.view
    back = _back(view, form.get("back"), name)
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


def _back(view: View, back: str, name: str) -> str:
    if back == "list" or not re.fullmatch(JOB_NAME, name):
        return view.url("/schedules")
    return view.url(f"/schedules/{name}")
