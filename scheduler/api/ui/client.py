"""The console's way to the management API: a request through the same ASGI app, in-process.

The console never reads PostgreSQL or NATS itself. Each page asks the API's routes, sending the
token its session stands for and the browser's address, so tokens, validation, race guarantees,
problem details and the `api.write who=... action=...` log line are exactly those of any other
client (the CLI, a script), without a network hop. Each call also carries the session's tag in
its ASGI scope, so the activity log records console actions as `via: console` with the session
(`scheduler.api.activity`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.types import Message

from scheduler.api.activity import CONSOLE_SCOPE

MAX_BODY = 64 << 20


@dataclass(frozen=True, slots=True)
class Answer:
    """One API answer: status, decoded JSON body (None when not JSON), raw bytes, headers."""

    status: int
    body: Any
    raw: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def code(self) -> str:
        return str(self.body.get("code", "")) if isinstance(self.body, dict) else ""

    @property
    def detail(self) -> str:
        """The problem's own explanation (what is wrong and what to do)."""
        if isinstance(self.body, dict) and self.body.get("detail"):
            return str(self.body["detail"])
        return f"the API answered {self.status}"

    def field_errors(self) -> dict[str, str]:
        """Invalid inputs by name (`subject`, `delay_until`), from a 422's `errors`."""
        errors = self.body.get("errors") if isinstance(self.body, dict) else None
        out: dict[str, str] = {}
        for err in errors or []:
            name = str(err.get("field", "")).split(".")[-1]
            out.setdefault(name, str(err.get("message", "invalid")))
        return out


class Api:
    """Management API calls on behalf of one console request."""

    def __init__(self, request: Request, token: str | None, session: str | None = None) -> None:
        self.request = request
        self.token = token
        self.session = session  # the console session's tag, for the activity log

    async def get(self, path: str, **params: Any) -> Answer:
        return await self.call("GET", path, params=params)

    async def call(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        body: Any = None,
        key: str | None = None,
    ) -> Answer:
        query = urlencode({k: _text(v) for k, v in (params or {}).items() if v not in (None, "")})
        payload = b"" if body is None else json.dumps(body).encode()
        headers = [(b"host", self.request.headers.get("host", "console").encode("latin-1"))]
        headers.append((b"accept", b"application/json"))
        if self.token is not None:
            headers.append((b"authorization", f"Bearer {self.token}".encode("latin-1")))
        if key is not None:  # the API refuses a malformed one (400 naming the header)
            headers.append((b"idempotency-key", key.encode("latin-1", "replace")))
        if body is not None:
            headers.append((b"content-type", b"application/json"))
            headers.append((b"content-length", str(len(payload)).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": self.request.url.scheme,
            "path": path,
            "raw_path": quote(path).encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": headers,
            "client": self.request.scope.get("client"),
            "server": self.request.scope.get("server"),
        }
        if self.session is not None:  # a scope key, not a header: no network client sets it
            scope[CONSOLE_SCOPE] = self.session
        return await _exchange(self.request.app, scope, payload)


async def _exchange(app: Any, scope: dict[str, Any], payload: bytes) -> Answer:
    sent = asyncio.Event()
    status = [500]
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    request_read = [False]

    async def receive() -> Message:
        if not request_read[0]:
            request_read[0] = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await sent.wait()  # nothing more to read: report the disconnect once the answer is out
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
            headers.update(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in message["headers"]
            )
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if sum(map(len, chunks)) > MAX_BODY:
                raise ValueError("API answer larger than the console takes")
            if not message.get("more_body"):
                sent.set()

    await app(scope, receive, send)
    raw = b"".join(chunks)
    body = None
    if "json" in headers.get("content-type", ""):
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
    return Answer(status[0], body, raw, headers)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
