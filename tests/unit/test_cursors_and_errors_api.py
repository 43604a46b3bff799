"""Cursors signed and range-checked, and a 500 that names a request id instead of an
exception's text (issue 25), in-process on the twins (tests/support/edge_twins.py). The edge's
bodies, Host allow-list, /docs and a cursor carried to another instance stay on a running daemon
(tests/integration/api/test_edge.py)."""

from __future__ import annotations

import base64
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.operations import paging
from tests.integration.api.harness import TARGET, envelope, poll
from tests.support.edge_twins import EdgeOnTwins

PROBLEM = "application/problem+json"


def unsigned(kind: str, *key: Any) -> str:
    text = json.dumps([kind, *key])
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


CRAFTED = [
    ("/v1/delayed", "delayed", [1, 40000, 1], "priority"),
    ("/v1/delayed", "delayed", [10**20, 1, 1], "time"),
    ("/v1/delayed", "delayed", [1, 1, 2**70], "seq"),
    ("/v1/delayed", "delayed", [1e20, 1, 1], "time"),
    ("/v1/delayed", "delayed_fired", [1, "a\x00b"], "id"),
    ("/v1/schedules", "schedules", ["a\x00b"], "name"),
    ("/v1/dead-letters", "dead-letters", [10**20, "x"], "time"),
    ("/v1/delayed", None, "Zm9v", ""),  # base64 of "foo"
    ("/v1/delayed", None, "A", ""),  # not even base64
]


@pytest.mark.parametrize(("path", "kind", "key", "names"), CRAFTED)
async def test_crafted_cursors_are_refused_400_naming_the_problem(
    api: EdgeOnTwins, path: str, kind: str | None, key: Any, names: str
) -> None:
    """Out-of-range numbers, a NUL, garbage: 400 `bad_cursor` naming what is wrong, never a
    500 or an exception's text (signed with the daemon's own key, so only the range checks
    stand between them and the database)."""
    cursor = key if kind is None else paging.encode(kind, key)
    r = await api.call("GET", path, params={"cursor": cursor})
    assert r.status == 400, r
    assert r.body["code"] == "bad_cursor" and r.body["detail"].startswith("cursor:")
    assert names in r.body["detail"]
    assert "Error" not in r.body["detail"]


async def test_an_edited_or_unsigned_cursor_is_refused(api: EdgeOnTwins) -> None:
    """A cursor whose key was changed (or one never signed) is refused: the signature names it."""
    for i in range(3):
        await api.store_task(TARGET, envelope(datetime.now(UTC) + timedelta(hours=1, seconds=i)))

    async def page() -> Any:
        return await api.call("GET", "/v1/delayed", params={"status": "pending", "limit": 1})

    first = await poll(page, lambda r: r.body["next_cursor"] is not None)
    good = first.body["next_cursor"]
    assert (await api.call("GET", "/v1/delayed", params={"cursor": good})).status == 200
    raw = bytearray(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))
    raw[-2] ^= 1  # one bit of the key
    edited = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    for cursor in (edited, unsigned("delayed", 1, 5, 1)):
        r = await api.call("GET", "/v1/delayed", params={"cursor": cursor})
        assert r.status == 400 and r.body["code"] == "bad_cursor", r
        assert "signature" in r.body["detail"]


async def test_a_500_names_a_request_id_and_no_exception_text(
    api: EdgeOnTwins, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected error answers 500 with a request id (body and X-Request-Id), never the
    exception's text; the log has the exception under the same id."""
    operations = api.backend.operations
    assert operations is not None

    async def boom(*_: Any) -> Any:
        raise RuntimeError("secret internal text /var/lib/x password=hunter2")

    monkeypatch.setattr(operations.tasks, "list", boom)
    with caplog.at_level(logging.ERROR, logger="scheduler.api"):
        r = await api.call("GET", "/v1/delayed")
    assert r.status == 500 and r.headers["Content-Type"] == PROBLEM, r.headers
    assert "secret" not in json.dumps(r.body) and "RuntimeError" not in json.dumps(r.body)
    rid = {k.lower(): v for k, v in r.headers.items()}["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid) and r.body["request_id"] == rid
    assert rid in r.body["detail"]
    logged = [rec for rec in caplog.records if rid in rec.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "secret internal text" in str(logged[0].exc_info[1])
    ok = await api.call("GET", "/v1/schedules")
    ok_rid = {k.lower(): v for k, v in ok.headers.items()}["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", ok_rid) and ok_rid != rid
