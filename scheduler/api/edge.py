"""What every API request passes before routing: a request id, the Host allow-list, the body bound.

Pure ASGI middlewares (no `BaseHTTPMiddleware`: nothing here reads a body into memory), added by
`scheduler.api.app.build_api` outside everything FastAPI does, so they run before a route's
body is parsed or a dependency checks a token:

- `RequestId` gives every request an id (`X-Request-Id` on every answer); a 500 names it and
  the log line of the exception carries it (`scheduler.api.problems`).
- `HostGuard` answers 400 `host_not_allowed` to a `Host` not on the allow-list
  (`host_policy`): the guard against DNS rebinding, where a page on `attacker.example`, made
  to resolve to 127.0.0.1, would read an open API as its own origin.
- `BodyGuard` answers 400 `body_not_allowed` to a body on a GET, HEAD, DELETE or OPTIONS
  route (none takes one) before a byte of it is read; a body on a method or path no route
  serves gets the app's 404, or 405 with `Allow`, the body unread and the connection closed.
  It refuses a declared `Content-Length` over `SCHEDULER_API_MAX_BODY` with 413 before a
  byte is read, counts a streamed body as it arrives and stops at the same bound; checks the
  admin token of a `/v1/` write that carries a body before the body is read
  (`scheduler.api.auth.write_refusal`). Then it reads the whole body within
  `SCHEDULER_API_BODY_TIMEOUT` of the head (408 `body_timeout` past it) before the app runs,
  so a body still arriving holds no admission slot (`scheduler.api.gate`), and a client that
  goes away mid-body leaves one `api.body_abandoned` line. Its refusals close the connection:
  the daemon discards at most 1 MiB more for at most 2 s so the answer is not lost to a reset
  (`scheduler.api.lingering`), then reads nothing more of a client that keeps sending. A
  body on a GET, HEAD, DELETE or OPTIONS is not read at all, and its connection's answer goes
  out 1 s after the head (`LingeringTransport.hold`, set by `scheduler.api.deadlines`).
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.api import auth, problems
from scheduler.api.deadlines import BODY_METHODS
from scheduler.settings import Settings

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
# Probes (kubelet sends the pod IP, a load balancer its own name) answer under any Host: they
# carry no task, payload or token.
UNGUARDED = frozenset({"/healthz", "/readyz"})
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CLOSE = {"Connection": "close"}

log = logging.getLogger(__name__)


class RequestId:
    """A fresh id per request (never the client's: it goes into logs), as `X-Request-Id`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = (b"x-request-id", problems.request_id(scope).encode())

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        await self.app(scope, receive, tagged)


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which `Host` names the API answers: `any_host`, or loopback names, the address the
    connection arrived on, the bound address and `patterns` (`name` or `*.suffix`)."""

    any_host: bool
    patterns: tuple[str, ...]
    bound: str

    def allows(self, host: str, local: str | None) -> bool:
        if self.any_host:
            return True
        name = host_name(host)
        if not name:
            return False
        if name in LOOPBACK or name == self.bound or (local and name == local.lower()):
            return True
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)


def host_policy(settings: Settings) -> HostPolicy:
    """Open mode (no token set): loopback names, the server's own address and the configured
    list. With tokens: any Host unless SCHEDULER_API_ALLOWED_HOSTS is set, because a page that
    rebinds a name to the API cannot send a token (it never had one; the console's cookie
    belongs to the name the operator signed in on) and a cluster reaches the API under names
    the daemon cannot know (Service, Ingress)."""
    patterns = tuple(p.strip().lower().rstrip(".") for p in settings.api_allowed_hosts)
    patterns = tuple(p for p in patterns if p)
    open_mode = settings.admin_token is None and settings.read_token is None
    any_host = "*" in patterns or (not open_mode and not patterns)
    bound = settings.http_host.strip("[]").lower()
    return HostPolicy(any_host, patterns, "" if bound in WILDCARD_BINDS else bound)


def host_name(host: str) -> str:
    """The name of a Host header, without port or IPv6 brackets, lower case ('' if malformed)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        return name if bracket and (not rest or rest.startswith(":")) else ""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name.rstrip(".") if ":" not in name else ""


class HostGuard:
    """400 `host_not_allowed` for a Host the policy does not allow."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.policy.any_host or scope["path"] in UNGUARDED:
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host") or ""
        server = scope.get("server")
        local = str(server[0]) if server else None
        if self.policy.allows(host, local):
            await self.app(scope, receive, send)
            return
        shown = host.encode("unicode_escape").decode()[:100]
        detail = (
            f"Host {shown!r} is not served here: the API answers loopback names, its own "
            "address and the names in SCHEDULER_API_ALLOWED_HOSTS (a guard against DNS "
            "rebinding); add this name there, or reach the API by one of those"
        )
        answer = problems.problem_response(400, "host_not_allowed", detail, dict(_CLOSE))
        await answer(scope, receive, send)


class BodyGuard:
    """Bodies refused where no route takes one, else read whole under their bounds (size,
    deadline) before the app runs; writes authenticated before their body is read."""

    def __init__(self, app: ASGIApp, settings: Callable[[], Settings], router: Router) -> None:
        self.app = app
        self.settings = settings  # the daemon's, read per request as the auth dependencies do
        self.limit = int(settings().api_max_body)
        self.router = router  # the app's: which route, if any, this request reaches

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._too_large(scope, receive, send)
            return
        if scope["method"] in WRITES and scope["path"].startswith("/v1/"):
            refusal = auth.write_refusal(Request(scope), self.settings())
            if refusal is not None:
                headers = {**refusal.headers, **_CLOSE}
                answer = problems.problem_response(
                    refusal.status, refusal.code, refusal.detail, headers, **refusal.extra
                )
                await answer(scope, receive, send)
                return
        if not self._routed(scope):  # the app's 404, or 405 with `Allow`: the body unread
            await self.app(scope, _replay(b"", receive), _closing(send))
            return
        if scope["method"] not in BODY_METHODS:
            await _answer(scope, receive, send, 400, "body_not_allowed", _no_body(scope))
            return
        body = await self._read(scope, receive, send)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    def _routed(self, scope: Scope) -> bool:
        """Whether a route serves this method and path (only asked of requests with a body)."""
        return any(route.matches(scope)[0] is Match.FULL for route in self.router.routes)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once the client was answered (413, 408) or went away."""
        timeout = self.settings().api_body_timeout.total_seconds()
        try:
            async with asyncio.timeout(timeout):
                got = await _collect(receive, self.limit)
        except TimeoutError:
            detail = (
                f"the request body did not arrive within {timeout:g}s "
                "(SCHEDULER_API_BODY_TIMEOUT); send it at once, or raise the setting"
            )
            await _answer(scope, receive, send, 408, "body_timeout", detail)
            return None
        if got is _Cut.OVER:
            await self._too_large(scope, receive, send)
            return None
        if got is _Cut.GONE:
            log.info("api.body_abandoned method=%s path=%s", scope["method"], scope["path"])
            return None
        return got

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = (
            f"the request body is larger than {self.limit} bytes (SCHEDULER_API_MAX_BODY); "
            "send less (one task or filter per call), or raise the setting"
        )
        await _answer(scope, receive, send, 413, "body_too_large", detail, limit=self.limit)


class _Cut(Enum):
    OVER = "the body passed the bound"
    GONE = "the client disconnected before the end of its body"


async def _collect(receive: Receive, limit: int) -> bytes | _Cut:
    """Read `http.request` messages to the end of the body: its bytes, or why not."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _Cut.GONE
        body += message.get("body", b"")
        if len(body) > limit:
            return _Cut.OVER
        if not message.get("more_body", False):
            return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the app `body` (already read, or b"" to leave the client's
    unread), then the connection's own."""
    pending = [body]

    async def replayed() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replayed


def _closing(send: Send) -> Send:
    """A `send` whose answer closes the connection (the body left unread is not waited for)."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [h for h in message.get("headers", []) if h[0] != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing


def _has_body(scope: Scope) -> bool:
    if _header(scope, b"transfer-encoding") is not None:
        return True
    length = _header(scope, b"content-length")
    return length is not None and length not in ("", "0")


def _no_body(scope: Scope) -> str:
    method, path = scope["method"], scope["path"]
    shown = path.encode("unicode_escape").decode()[:100]
    return (
        f"{method} {shown} takes no request body: send it without one (no Content-Length "
        "or Transfer-Encoding); only POST, PUT and PATCH routes take one"
    )


async def _answer(
    scope: Scope, receive: Receive, send: Send, status: int, code: str, detail: str, **extra: Any
) -> None:
    """A problem answer that closes the connection (its body, if any, is left unread)."""
    answer = problems.problem_response(status, code, detail, dict(_CLOSE), **extra)
    await answer(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None
