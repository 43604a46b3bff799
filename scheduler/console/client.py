"""The console's way to the management API: a request through the same ASGI app, in-process,
by httpx's `ASGITransport`.

The console never reads PostgreSQL or NATS itself. Each page asks the API's routes, sending the
token its session stands for and the browser's address, so tokens, validation, race guarantees,
problem details and the `api.write who=... action=...` log line are exactly those of any other
client (the CLI, a script), without a network hop. Each call also carries the session's tag in
its ASGI scope, so the activity log records console actions as `via: console` with the session
(`scheduler.api.activity`): the transport calls the app through `_as_console`, which writes the
tag into the scope the transport built. A scope key is not a header: no client on the network
can set it (uvicorn builds the scope of every network request itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
        url = _raw_path(path) + (f"?{query}" if query else "")
        payload = None if body is None else json.dumps(body).encode()
        headers = self._headers(key, json_body=payload is not None)
        async with self._client() as client:
            response = await client.request(method, url, content=payload, headers=headers)
        return _answer(response)

    def _client(self) -> httpx.AsyncClient:
        """A client whose transport calls this app as this console request: the browser's
        address, the server's, the session's tag."""
        scope = self.request.scope
        app = _as_console(self.request.app, scope.get("server"), self.session)
        transport = httpx.ASGITransport(app, client=scope.get("client"))  # type: ignore[arg-type]
        base = f"{self.request.url.scheme}://console"
        client = httpx.AsyncClient(transport=transport, base_url=base, trust_env=False)
        client.headers.clear()  # no User-Agent, Accept-Encoding: only what `_headers` sends
        return client

    def _headers(self, key: str | None, json_body: bool) -> list[tuple[bytes, bytes]]:
        """The browser's Host, JSON, the token, the Idempotency-Key, the body's type (httpx
        adds its length)."""
        host = self.request.headers.get("host", "console").encode("latin-1")
        headers = [(b"host", host), (b"accept", b"application/json")]
        if self.token is not None:
            headers.append((b"authorization", f"Bearer {self.token}".encode("latin-1")))
        if key is not None:  # the API refuses a malformed one (400 naming the header)
            headers.append((b"idempotency-key", key.encode("latin-1", "replace")))
        if json_body:
            headers.append((b"content-type", b"application/json"))
        return headers


def _as_console(app: ASGIApp, server: Any, session: str | None) -> ASGIApp:
    """`app` as the console calls it: the scope keeps the console request's server address
    (the API's Host guard compares with it) and carries the session's tag; the answer is
    bounded (MAX_BODY)."""

    async def console_call(scope: Scope, receive: Receive, send: Send) -> None:
        scope["server"] = server
        if session is not None:
            scope[CONSOLE_SCOPE] = session
        seen = [0]

        async def bounded(message: Message) -> None:
            if message["type"] == "http.response.body":
                seen[0] += len(message.get("body", b""))
                if seen[0] > MAX_BODY:
                    raise ValueError("API answer larger than the console takes")
            await send(message)

        await app(scope, receive, bounded)

    return console_call


def _raw_path(path: str) -> str:
    """`path` percent-encoded as the API's routes will read it back: every character of a
    segment but `/` quoted, and a `.` or `..` segment kept as a name (httpx would otherwise
    resolve it as a step up)."""
    return "/".join(
        quote(part) if part not in (".", "..") else part.replace(".", "%2E")
        for part in path.split("/")
    )


def _answer(response: httpx.Response) -> Answer:
    raw = response.content
    body = None
    if "json" in response.headers.get("content-type", ""):
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
    return Answer(response.status_code, body, raw, dict(response.headers))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
