"""What the operator half answers about the activity log, as records
(`scheduler.operations.activity`; the HTTP API serves them as they are)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from scheduler.operations.records import Instant, Record


class ActivityEntry(Record):
    id: int
    at: Instant = Field(description="when the request was taken")
    who: str = Field(description="the token kind and the client's address, e.g. admin@10.0.0.7")
    via: Literal["api", "console"] = Field(description="a direct API call, or the web console")
    session: str | None = Field(description="the console session's tag (via console only)")
    action: str = Field(description="pause, resume, trigger, cancel, reschedule, replay, ...")
    route: str = Field(description="method and route, e.g. POST /v1/schedules/{name}/pause")
    target: str = Field(description="job name, task id, dead-letter id; `*` for a filter")
    detail: dict[str, Any] = Field(
        description="bounded: the note, the new due time, the filter, counts, the refusal"
    )
    http_status: int
    outcome: str = Field(description="the operation's status (paused, ...) or the problem's code")
    request_id: str = Field(description="the answer's X-Request-Id (and the log line's)")
    idempotency_key: str | None


class ActivityPage(Record):
    items: list[ActivityEntry]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")
