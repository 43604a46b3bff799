"""`Idempotency-Key` on every call that changes state (the IETF draft
"The Idempotency-Key HTTP Header Field", as Stripe runs it).

- The key is 1..200 printable ASCII characters without spaces; anything else answers 400
  `bad_idempotency_key` naming the header. Without the header a call runs as before.
- A key belongs to its caller (the token kind) and to the first request that used it: route,
  target and body. The same key on another route, target or body answers 422
  `idempotency_key_reused`, and nothing runs.
- The first request's answer (2xx, and the 4xx the operation itself gave: 404, 409) is stored in
  PostgreSQL (`api_idempotency`) for `KEEP` (24 h; the hourly upkeep deletes expired rows); a
  retry with the same key and request gets it again, status and body, with
  `Idempotency-Replayed: true`, and nothing runs again.
- While the first request runs, a duplicate answers 409 `idempotency_key_in_use` with
  `Retry-After`: it never runs twice. A first request that ended without an answer to keep
  (503: PostgreSQL or NATS unavailable) releases the key at once; one that died with its
  process holds it for `LOCK` (60 s), then a retry takes it over.
- Invalid input (422 `validation`, 400) and refused tokens are answered before the key is
  looked at, and are never stored.

A manual trigger also derives its message's `Nats-Msg-Id` from the job and the key, and a retry
reuses the first request's instant: even when the first answer was never stored (the process
died between the PubAck and the store), the retry's publish is dropped by the target stream's
duplicate window and the answer is still true.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

from fastapi import Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.responses import Response

from scheduler.api import activity
from scheduler.api.auth import Caller
from scheduler.api.problems import ApiProblem, problem_response
from scheduler.operations.backlog import TRANSIENT
from scheduler.operations.bundle import Operations
from scheduler.operations.stores import Claim, KeyUse, Recorded

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED = "Idempotency-Replayed"
MAX_LENGTH = 200
PATTERN = r"^[!-~]{1,200}$"  # printable ASCII, no space
LOCK = timedelta(seconds=60)
KEEP = timedelta(hours=24)
STORE_TIMEOUT = 2.0

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        description=(
            "Makes a retry safe: the first answer for this key is stored for 24 h and served "
            f"again (with `{REPLAYED}: true`) to a retry of the same request; the same key on "
            "another request answers 422, a duplicate sent while the first runs 409 with "
            "Retry-After. 1..200 printable ASCII characters, no spaces (a UUID serves well)."
        ),
        json_schema_extra={"pattern": PATTERN, "minLength": 1, "maxLength": MAX_LENGTH},
    ),
]
Run = Callable[[Claim | None], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Write:
    """One write request as `once` runs it: the caller, the object it acts on (`target`), its
    body and key, and how its answer is shaped (`answer`, `exclude_none`)."""

    request: Request
    ops: Operations
    caller: Caller
    key: str | None
    target: str
    body: BaseModel | None
    answer: type[BaseModel]
    exclude_none: bool = False

    def use(self, key: str) -> KeyUse:
        """What `key` is bound to: the caller, the route, the target and a digest of the body."""
        route = f"{self.request.method} {self.request.scope['route'].path}"
        doc = None if self.body is None else self.body.model_dump(mode="json")
        fingerprint = json.dumps([route, self.target, doc], sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(fingerprint.encode()).hexdigest()
        return KeyUse(self.caller.kind, key, route, self.target, digest)

    def answered(self, result: Any) -> JSONResponse:
        """The operation's result as the route's answer model says."""
        model = self.answer.model_validate(result)
        return JSONResponse(model.model_dump(mode="json", exclude_none=self.exclude_none))


async def once(
    request: Request,
    ops: Operations,
    caller: Caller,
    key: str | None,
    target: str,
    body: BaseModel | None,
    answer: type[BaseModel],
    run: Run,
    exclude_none: bool = False,
) -> Any:
    """Run `run` once per key: its answer (validated as `answer`) is stored and replayed.
    Every call is recorded in the activity log (`scheduler.api.activity`), except a replay."""
    write = Write(request, ops, caller, key, target, body, answer, exclude_none)
    entry = activity.Entry(request, caller, key, target, body, ops.clock.now())

    async def watched(claim: Claim | None) -> Any:
        try:
            return await run(claim)
        except ApiProblem as problem:
            entry.refused(problem.code, problem.detail)
            raise

    with activity.recording(entry):
        try:
            result = await _once(write, watched)
        except ApiProblem as problem:
            if problem.code not in activity.NOT_RECORDED:
                entry.refused(problem.code, problem.detail)
                await activity.record(ops, entry, problem.status)
            raise
        except Exception:
            entry.refused("error", "the request failed with an unexpected error")
            await activity.record(ops, entry, 500)
            raise
    if not (isinstance(result, Response) and result.headers.get(REPLAYED)):
        status = result.status_code if isinstance(result, Response) else 200
        await activity.record(ops, entry, status)
    return result


async def _once(write: Write, run: Run) -> Any:
    """The idempotency core: `run` without a key; with one, the stored answer, or `run` once
    and its answer stored."""
    if write.key is None:
        return await run(None)
    ops = write.ops
    use = write.use(_checked(write.key))
    got = await ops.idempotency.claim(use, ops.clock.now(), LOCK, KEEP)
    if isinstance(got, Recorded):
        return _recorded(got, use)
    try:
        result = await run(got)
    except ApiProblem as problem:
        if problem.status >= 500:
            await _release(ops, got)
            raise
        response: Response = problem_response(
            problem.status, problem.code, problem.detail, problem.headers, **problem.extra
        )
    except Exception:
        await _release(ops, got)
        raise
    else:
        response = write.answered(result)
    await _store(ops, got, response)
    return response


def _checked(key: str) -> str:
    if re.fullmatch(PATTERN, key) is None:
        raise ApiProblem(
            400,
            "bad_idempotency_key",
            f"{HEADER}: must be 1 to {MAX_LENGTH} printable ASCII characters without spaces "
            f"(got {len(key)} characters)",
            errors=[{"field": f"header.{HEADER}", "message": "1..200 printable ASCII"}],
        )
    return key


def _recorded(row: Recorded, use: KeyUse) -> Response:
    if (row.route, row.target) != (use.route, use.target):
        raise ApiProblem(
            422,
            "idempotency_key_reused",
            f"{HEADER} {use.key!r} was first used for {row.route} on {row.target!r}; this is "
            f"{use.route} on {use.target!r}: send a new key with a new request",
        )
    if row.fingerprint != use.fingerprint:
        raise ApiProblem(
            422,
            "idempotency_key_reused",
            f"{HEADER} {use.key!r} was first used on {row.target!r} with another body: send "
            "a new key with a new request",
        )
    if row.state == "running":
        raise ApiProblem(
            409,
            "idempotency_key_in_use",
            f"a request with {HEADER} {use.key!r} is still running; retry to get its answer",
            headers={"Retry-After": "1"},
        )
    assert row.status is not None and row.body is not None and row.media_type is not None
    return Response(row.body, row.status, {REPLAYED: "true"}, media_type=row.media_type)


async def _release(ops: Operations, claim: Claim) -> None:
    try:
        await ops.idempotency.release(claim, ops.clock.now())
    except TRANSIENT as exc:  # the key's lock runs out by itself (LOCK)
        log.warning("api.idempotency_release_failed key=%r error=%r", claim.use.key, exc)


async def _store(ops: Operations, claim: Claim, response: Response) -> None:
    """Store the answer; PostgreSQL unreachable, the write backlog retries it (meanwhile a
    retry answers 409, then the stored answer)."""
    args = (claim, response.status_code, response.media_type or "", bytes(response.body))
    try:
        async with asyncio.timeout(STORE_TIMEOUT):
            await ops.idempotency.finish(*args)
    except TRANSIENT as exc:
        log.warning("api.idempotency_store_deferred key=%r error=%r", claim.use.key, exc)
        what = f"api_idempotency answer key={claim.use.key!r} route={claim.use.route}"
        ops.backlog.add(what, lambda: ops.idempotency.finish(*args))
