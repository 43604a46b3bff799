"""What the daemon's HTTP ports serve while the management API is still being built.

The management API and the console (FastAPI, their pydantic models, the templates) take about
0.6 s to import and build on a 2-core host, half of a cold start. The daemon therefore binds
its ports first with `StartingApp`, which answers the probes at once (`/healthz`, `/readyz`,
from the daemon's own state, as the full API does) and every other request with a 503 problem
and `Retry-After: 1`, without reading its body. The API is imported and built in a worker
thread (`scheduler.daemon.listeners.build_api_app`) while the daemon connects, is elected and
starts firing; it is swapped in before the daemon reports itself running, so `/readyz` answers
200 only once the whole API serves. The metrics port needs nothing of the API: `MetricsApp`
serves it from the start.

This module imports no web framework; `tests/unit/test_cold_start.py` holds the daemon's start
path to that.
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

PROBES = ("/healthz", "/readyz")
READ_METHODS = ("GET", "HEAD")
STARTING_DETAIL = (
    "the daemon is starting and its management API is not served yet; retry in a second"
)


class Probes(Protocol):
    """What the probes ask the daemon (`scheduler.daemon.lifecycle.Daemon`)."""

    def is_alive(self) -> bool: ...

    def readiness(self) -> tuple[bool, dict[str, Any]]: ...


class StartingApp:
    """The API port's app: the probes and a 503 until `app` is set, then `app` alone."""

    def __init__(self, probes: Probes) -> None:
        self.probes = probes
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        if app is not None:
            await app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in PROBES and method in READ_METHODS:
            if path == "/healthz":
                alive = self.probes.is_alive()
                status, body = (200 if alive else 503), {"alive": alive}
            else:
                ready, info = self.probes.readiness()
                status, body = (200 if ready else 503), {"ready": ready, **info}
            await _answer(send, method, status, "application/json", body, {})
            return
        problem = {
            "type": "https://mq-scheduler.dev/problems/unavailable",
            "title": "Service Unavailable",
            "status": 503,
            "detail": STARTING_DETAIL,
            "code": "unavailable",
        }
        await _answer(send, method, 503, "application/problem+json", problem, {"retry-after": "1"})


class HostCheck(Protocol):
    """The API's Host policy (`scheduler.api.edge.HostPolicy`)."""

    def allows(self, host: str, local: str | None) -> bool: ...


class MetricsApp:
    """The metrics port's app: `GET /metrics` (and HEAD) in Prometheus' text format; 405 for
    another method there, 404 elsewhere; 400 for a Host the API's policy refuses (`hosts`:
    the same guard against DNS rebinding as the API's). It never reads a request body, and
    `render` is the edge's cached exposition (`scheduler.daemon.edge.CachedRender`)."""

    def __init__(self, render: Callable[[], bytes], hosts: HostCheck | None = None) -> None:
        self.render = render
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        if self.hosts is not None and not self._host_allowed(scope):
            text = "text/plain; charset=utf-8"
            await _send(send, method, 400, text, b"Host not allowed", {"connection": "close"})
        elif scope["path"] != "/metrics":
            await _send(send, method, 404, "text/plain; charset=utf-8", b"Not Found", {})
        elif method not in READ_METHODS:
            text, allow = "text/plain; charset=utf-8", {"allow": "GET, HEAD"}
            await _send(send, method, 405, text, b"Method Not Allowed", allow)
        else:
            text = "text/plain; version=0.0.4; charset=utf-8"
            await _send(send, method, 200, text, self.render(), {})

    def _host_allowed(self, scope: Scope) -> bool:
        assert self.hosts is not None
        host = ""
        for name, value in scope.get("headers") or []:
            if name == b"host":
                host = value.decode("latin-1")
                break
        server = scope.get("server")
        return self.hosts.allows(host, server[0] if server else None)


async def _answer(
    send: Send, method: str, status: int, media: str, body: Any, headers: dict[str, str]
) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await _send(send, method, status, media, data, headers)


async def _send(
    send: Send, method: str, status: int, media: str, data: bytes, headers: dict[str, str]
) -> None:
    fields: MutableMapping[str, str] = {
        "content-type": media,
        "content-length": str(len(data)),
        "cache-control": "no-store",
        "x-content-type-options": "nosniff",
        **headers,
    }
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(k.encode(), v.encode()) for k, v in fields.items()],
        }
    )
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else data})
