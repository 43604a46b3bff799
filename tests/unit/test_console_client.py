"""The console's in-process API calls (httpx's ASGITransport): what the API's app receives is
the path and query as given, the browser's Host and address, the server's address, the
session's tag in the scope, and only the console's headers; an oversized answer is refused."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from scheduler.api.activity import CONSOLE_SCOPE
from scheduler.console import client
from scheduler.console.client import Api


class Recorder:
    """An ASGI app that keeps the scope and body of each request and answers JSON."""

    def __init__(self, answer: bytes = b'{"ok": true}') -> None:
        self.answer = answer
        self.seen: list[tuple[Scope, bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.seen.append((scope, body))
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": self.answer})


def console_request(app: Recorder) -> Request:
    """The browser's request to a console page, on `app`."""
    headers = [(b"host", b"sched.example:8055"), (b"user-agent", b"Firefox")]
    scope = {"type": "http", "method": "GET", "path": "/ui/", "query_string": b""}
    scope |= {"headers": headers, "client": ("10.1.2.3", 50000), "server": ("10.0.0.9", 8055)}
    return Request({**scope, "scheme": "https", "app": app, "root_path": ""})


@pytest.mark.parametrize(
    "path",
    ["/v1/delayed/a?b#c", "/v1/delayed/..", "/v1/delayed/.", "/v1/delayed/%2F", "/v1/delayed/ü x"],
)
async def test_the_api_sees_the_path_and_query_as_given(path: str) -> None:
    """A task id with `?`, `#`, `%`, spaces, non-ASCII or dot segments reaches the API's app as
    one path segment, unresolved; parameters arrive as sent, empty ones left out."""
    app = Recorder()
    params: dict[str, Any] = {"subject": "a b&c=d+e", "limit": 5, "flag": True, "cursor": None}
    answer = await Api(console_request(app), None).get(path, **params)
    assert answer.ok and answer.body == {"ok": True}
    scope, _ = app.seen[0]
    assert scope["path"] == path
    query = Request(scope).query_params
    assert dict(query) == {"subject": "a b&c=d+e", "limit": "5", "flag": "true"}


async def test_the_api_sees_the_browser_the_server_and_the_session() -> None:
    """The API's app gets the browser's address and Host, the server's address, the scheme,
    the token, the key and the JSON body, the session's tag in the scope, and none of httpx's
    own headers."""
    app = Recorder()
    api = Api(console_request(app), "admin-token", "admin-0123456789ab")
    await api.call("POST", "/v1/schedules/nightly/pause", body={"note": "ü"}, key="k-1")
    scope, body = app.seen[0]
    assert scope["client"] == ("10.1.2.3", 50000) and scope["server"] == ("10.0.0.9", 8055)
    assert scope["scheme"] == "https" and scope[CONSOLE_SCOPE] == "admin-0123456789ab"
    assert dict(scope["headers"]) == {
        b"host": b"sched.example:8055",
        b"accept": b"application/json",
        b"authorization": b"Bearer admin-token",
        b"idempotency-key": b"k-1",
        b"content-type": b"application/json",
        b"content-length": str(len(body)).encode(),
    }
    assert body == b'{"note": "\\u00fc"}'


async def test_no_session_no_tag_and_an_oversized_answer_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a session (no token configured) the scope carries no console tag; an answer
    larger than the console takes raises instead of being held."""
    app = Recorder(answer=b"x" * 100)
    api = Api(console_request(app), None)
    await api.get("/v1/stats")
    assert CONSOLE_SCOPE not in app.seen[0][0]
    monkeypatch.setattr(client, "MAX_BODY", 99)
    with pytest.raises(ValueError, match="larger than the console takes"):
        await api.get("/v1/stats")
