"""Errors as RFC 9457 problem details (`application/problem+json`), one shape for every error.

`{"type", "title", "status", "detail", "code", ...}`: `code` is the machine word a script
branches on (`unauthorized`, `forbidden`, `not_found`, `too_late`, `in_flight`, `validation`,
...), `detail` says what is wrong and what to do. Validation errors also list every field in
`errors`. Every route declares the problems it can answer, so the OpenAPI document is complete.
"""

from __future__ import annotations

import logging
import math
import uuid
from http import HTTPStatus
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler.errors import RequestError, ServiceUnavailableError
from scheduler.operations import Outcome

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://mq-scheduler.dev/problems/"
# Outcome statuses that are not a conflict: the service could not do it now (retry later).
UNAVAILABLE = frozenset({"publish_failed"})
REQUEST_ID_KEY = "mq.request_id"  # where the request's id lives in the ASGI scope


def request_id(scope: Any) -> str:
    """The request's id, made on first use (`scheduler.api.edge.RequestId` asks first)."""
    rid = scope.get(REQUEST_ID_KEY)
    if not isinstance(rid, str):
        rid = scope[REQUEST_ID_KEY] = uuid.uuid4().hex
    return rid


class FieldProblem(BaseModel):
    field: str = Field(description="where: `body.delay_until`, `query.limit`, `path.id`")
    message: str


class Problem(BaseModel):
    """An error (RFC 9457 problem details)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="a URI naming the kind of problem")
    title: str
    status: int = Field(description="the HTTP status code")
    detail: str = Field(description="what is wrong and what to do about it")
    code: str = Field(description="machine-readable kind: not_found, too_late, in_flight, ...")
    errors: list[FieldProblem] | None = Field(default=None, description="every invalid field")


class ApiProblem(Exception):
    """Raised by handlers and dependencies; rendered as a problem response."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {
        "type": TYPE_BASE + code,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "code": code,
        **{k: v for k, v in extra.items() if v is not None},
    }
    return JSONResponse(body, status_code=status, headers=headers, media_type=MEDIA_TYPE)


def from_outcome(outcome: Outcome, what: str) -> ApiProblem:
    """The problem for an operation that did not succeed: 404, 503 or 409 with its status."""
    detail = outcome.detail or f"{what} {outcome.id!r}: {outcome.status}"
    if outcome.status == "not_found":
        return ApiProblem(404, "not_found", detail, id=outcome.id)
    status = 503 if outcome.status in UNAVAILABLE else 409
    return ApiProblem(status, outcome.status, detail, id=outcome.id, **outcome.data)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problems a route may answer (401/403/503 come with every route
    that needs a token, 422 with every route that takes input)."""
    return {
        s: {"model": Problem, "content": {MEDIA_TYPE: {}}, "description": _DESCRIBE.get(s, "")}
        for s in statuses
    }


def links(parameter: str, pointer: str, *operations: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI links from a list's first item to the operations on it (clients and fuzzers
    follow them)."""
    return {
        200: {
            "links": {
                op: {"operationId": op, "parameters": {parameter: f"$response.body#{pointer}"}}
                for op in operations
            }
        }
    }


_DESCRIBE = {
    400: "The request is malformed (body is not JSON, a cursor was altered, or a status "
    "filter names no task status).",
    401: "No bearer token, or one the daemon does not know.",
    403: "The token may not do this (a read token on a write), or writes are disabled "
    "because SCHEDULER_ADMIN_TOKEN is not set.",
    404: "No such object.",
    409: "The object's state does not allow it; `code` says why (too_late, in_flight, ...).",
    422: "A parameter or body field is invalid; `errors` lists each one.",
    503: "The daemon is starting, PostgreSQL or NATS cannot be reached, too many API requests "
    "run at once (`overloaded`) or a query outlasted the API's statement timeout "
    "(`query_timeout`); retry after the `Retry-After` header's seconds.",
}


def install(app: FastAPI) -> None:
    """Render every error of `app` as problem details."""

    @app.exception_handler(ApiProblem)
    async def _api_problem(_: Request, exc: ApiProblem) -> JSONResponse:
        return problem_response(exc.status, exc.code, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        status = 400 if exc.code == "bad_cursor" else 422
        errors = [{"field": exc.field, "message": str(exc)}] if exc.field else None
        return problem_response(status, exc.code, str(exc), errors=errors)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_field_problem(e) for e in exc.errors()]
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            detail = "body: not valid JSON (" + errors[0]["message"] + ")"
            return problem_response(400, "bad_json", detail, errors=errors)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem_response(422, "validation", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        detail = str(exc.detail)
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed(app, request))
            detail = f"{request.method} is not supported here; use {headers['Allow']}"
        elif exc.status_code == 400:
            code, detail = "bad_body", f"the request body could not be read: {detail}"
        return problem_response(exc.status_code, code, detail, headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, asyncpg.QueryCanceledError | TimeoutError):
            return _query_timeout(request, exc)
        # Never the exception's text in the answer (paths, SQL, addresses): the log has it,
        # under the request id the answer names.
        rid = request_id(request.scope)
        headers = {"X-Request-Id": rid}
        if isinstance(exc, ServiceUnavailableError | asyncpg.PostgresConnectionError | OSError):
            log.warning(
                "api.unavailable request_id=%s path=%s error=%r", rid, request.url.path, exc
            )
            detail = (
                "a backing service (PostgreSQL or NATS) is unavailable; retry shortly "
                f"(request id {rid} in the daemon log)"
            )
            return problem_response(
                503, "unavailable", detail, {**headers, "Retry-After": "1"}, request_id=rid
            )
        log.error("api.error request_id=%s path=%s", rid, request.url.path, exc_info=exc)
        detail = f"unexpected error; the daemon log has it under request id {rid}"
        return problem_response(500, "internal", detail, headers, request_id=rid)


def _query_timeout(request: Request, exc: Exception) -> JSONResponse:
    """A statement cut by SCHEDULER_API_STATEMENT_TIMEOUT (or a wait for a connection or an
    answer that outlasted it): 503, retry later; nothing it was about changed (a cut statement
    rolls back)."""
    limit = request.app.state.backend.settings.api_statement_timeout.total_seconds()
    log.warning("api.query_timeout path=%s limit=%gs error=%r", request.url.path, limit, exc)
    detail = (
        f"the query took longer than {limit:g}s (SCHEDULER_API_STATEMENT_TIMEOUT) and was "
        "cancelled; nothing was changed. Narrow the request (a subject, a due window, a smaller "
        "limit) or retry after the Retry-After delay"
    )
    retry = {"Retry-After": str(max(1, math.ceil(limit)))}
    return problem_response(503, "query_timeout", detail, retry)


def _allowed(app: FastAPI, request: Request) -> list[str]:
    """Every method some route serves at this path (the router's own 405 names one route's)."""
    path = request.url.path
    methods: set[str] = set()
    for route in getattr(app.state, "api_routes", ()):
        if route.path_regex.match(path):
            methods |= route.methods
    return sorted(methods)


def _field_problem(error: Any) -> dict[str, str]:
    loc = [str(part) for part in error.get("loc", ())]
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return {"field": ".".join(loc) or "body", "message": message}
