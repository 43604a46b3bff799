"""Recording every operator action in the activity log (`activity_log`, see
`scheduler.operations.activity`), at the one point every write route passes through.

Every write route runs its operation inside `scheduler.api.idempotency.once`, which opens an
`Entry` for the request (`recording`) and writes one row when the answer is known (`record`):
who, when, the route, its target, a bounded detail, the HTTP status and the outcome, the
request id and the Idempotency-Key. `scheduler.api.routes.common.log_write` (which `done` calls)
adds the action's name and the operation's outcome to the open entry (`noted`), so a route
added later is recorded without doing anything; one that never calls it (or whose batch was
empty) is recorded under its handler's first word (`replay_batch`: `replay`).

- Recorded: every request that reached its operation, done or refused (404, 409, 422, 503),
  and requests refused at the key (400 `bad_idempotency_key`, 422 `idempotency_key_reused`).
- Not recorded again: a retry served the stored answer (`Idempotency-Replayed: true`) and a
  duplicate sent while the first still runs (409 `idempotency_key_in_use`): nothing ran, and
  the first request's row carries the same key.
- Not recorded: requests refused before the route runs (401/403 token checks, 400/413/422
  input validation): no action was taken; `mq_scheduler_api_requests_total` counts them.

Who: the token kind and the client's address (`Caller.who`). The web console calls the API
in-process (`scheduler.console.client`) and marks its requests with the session's tag in the
ASGI scope under `CONSOLE_SCOPE`: a key of the scope, not a header, so no client on the
network can set it (uvicorn builds the scope of every network request itself).

The row is written on the API's own pool within `RECORD_TIMEOUT`; a failure never turns a done
action into an error answer: it is logged (`api.activity_unrecorded`, with every field) and
counted (`mq_scheduler_activity_unrecorded_total`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from scheduler.api.auth import Caller
from scheduler.api.events import ApiEvents
from scheduler.api.problems import request_id
from scheduler.operations import Outcome
from scheduler.operations.activity import DETAIL_TEXT, bounded, clip
from scheduler.operations.bundle import Operations
from scheduler.operations.stores import Activity

log = logging.getLogger(__name__)

CONSOLE_SCOPE = "mq_scheduler.console_session"
RECORD_TIMEOUT = 1.0
NOT_RECORDED = frozenset({"idempotency_key_in_use"})  # a duplicate of a request still running
MAX_OUTCOMES = 8  # distinct statuses counted for a batch (the rest as `other`)

_CURRENT: ContextVar[Entry | None] = ContextVar("mq_scheduler_activity", default=None)


@dataclass
class Entry:
    """What is known of one write request while it runs."""

    request: Request
    caller: Caller
    key: str | None
    target: str
    body: BaseModel | None
    at: datetime
    action: str | None = None
    outcomes: Counter[str] = field(default_factory=Counter)
    last: Outcome | None = None
    code: str | None = None  # the problem's code, when the route answered one
    message: str | None = None

    def refused(self, code: str, message: str) -> None:
        self.code, self.message = code, message

    def row(self, status: int) -> Activity:
        route = self.request.scope.get("route")
        session = self.request.scope.get(CONSOLE_SCOPE)
        return Activity(
            at=self.at,
            who=clip(self.caller.who),
            via="console" if isinstance(session, str) else "api",
            session=clip(session, 64) if isinstance(session, str) else None,
            action=clip(self.action or _verb(getattr(route, "name", None)), 64),
            route=clip(f"{self.request.method} {getattr(route, 'path', self.request.url.path)}"),
            target=clip(self._target()),
            detail=self._detail(),
            http_status=status,
            outcome=clip(self._outcome(status), 64),
            request_id=request_id(self.request.scope),
            idempotency_key=None if self.key is None else clip(self.key),
        )

    def _target(self) -> str:
        """The object the path names (job, task, dead letter), else what the key is bound to."""
        named = [str(v) for v in self.request.path_params.values()]
        return named[0] if named else self.target

    def _outcome(self, status: int) -> str:
        if self.code is not None:
            return self.code
        if len(self.outcomes) == 1:
            return next(iter(self.outcomes))
        if self.outcomes:
            return "done" if 200 <= status < 300 else "refused"
        return "done" if 200 <= status < 300 else "error"

    def _detail(self) -> dict[str, Any]:
        route = self.request.scope.get("route")
        declared = getattr(getattr(route, "dependant", None), "query_params", ())
        # only the parameters the route reads: an undeclared `?note=` must not pose as one
        names = {p.alias for p in declared}
        query = {k: v for k, v in self.request.query_params.items() if k in names}
        body = {} if self.body is None else dict(self.body)
        data = self.last.data if self.last is not None and len(self.outcomes) == 1 else {}
        detail = bounded(query, body, data)
        why = self.message or (self.last.detail if self.last is not None else "")
        if why:
            detail["message"] = clip(why, DETAIL_TEXT)
        if sum(self.outcomes.values()) > 1:
            detail["outcomes"] = _counts(self.outcomes)
        return detail


def _verb(handler: str | None) -> str:
    """A route's action when it noted none: its handler's first word (`replay_batch`:
    `replay`), as the handlers are named verb first."""
    return (handler or "write").split("_")[0]


def _counts(outcomes: Counter[str]) -> dict[str, int]:
    top = dict(outcomes.most_common(MAX_OUTCOMES))
    rest = sum(outcomes.values()) - sum(top.values())
    return {clip(k, 64): v for k, v in top.items()} | ({"other": rest} if rest else {})


@contextmanager
def recording(entry: Entry) -> Iterator[Entry]:
    """Make `entry` the open entry of this request while its operation runs."""
    token = _CURRENT.set(entry)
    try:
        yield entry
    finally:
        _CURRENT.reset(token)


def noted(action: str, outcome: Outcome) -> None:
    """The operation's name and outcome, on the open entry (none open: nothing to do)."""
    entry = _CURRENT.get()
    if entry is None:
        return
    entry.action = entry.action or action
    entry.outcomes[outcome.status] += 1
    entry.last = outcome


def current() -> Entry | None:
    return _CURRENT.get()


async def record(ops: Operations, entry: Entry, status: int) -> None:
    """Write the entry's row; a failure is logged and counted, never raised."""
    row = entry.row(status)
    try:
        async with asyncio.timeout(RECORD_TIMEOUT):
            await ops.activity.record(row)
    except Exception as exc:  # the action is done: its answer must not become an error
        events: ApiEvents = entry.request.app.state.backend.metrics
        events.action_unrecorded()
        log.warning(
            "api.activity_unrecorded who=%s via=%s action=%s target=%r status=%d outcome=%s "
            "request_id=%s key=%r error=%r",
            row.who,
            row.via,
            row.action,
            row.target,
            row.http_status,
            row.outcome,
            row.request_id,
            row.idempotency_key,
            exc,
        )
