"""The console's structure on a running daemon: every console route answers with the security
headers (one middleware covers them all), the static files come with their types and cache
lifetime, and a console action reaches the activity log as the console's, from the browser's
address, which no network request can claim. The console mounted at another path runs on the
twins (tests/unit/test_console_elsewhere.py)."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDict
from starlette.routing import BaseRoute, Mount

from scheduler.console.console import SECURITY_HEADERS, STATIC_CACHE, build_app
from scheduler.console.session import SESSION_COOKIE, Signer
from tests.integration.api.harness import READ, ApiHarness, poll

PARAMS = {
    "name": "nightly",
    "task_id": "no-such-task",
    "dead_id": str(uuid.UUID(int=0)),
    "run": "2026-11-21",
    "action": "pause",
    "rest:path": "no/such/page",
}


def _param(m: re.Match[str]) -> str:
    """The value of the path parameter `m` names."""
    return PARAMS[m.group(1)]


async def fetch(
    api: ApiHarness, method: str, path: str, cookie: str | None = None, **extra: Any
) -> tuple[int, CIMultiDict[str], str]:
    """One request to the daemon's API port, redirects not followed, no cookie jar; the
    answer's headers by any case."""
    headers = {"Cookie": f"{SESSION_COOKIE}={cookie}"} if cookie else {}
    headers |= extra.pop("headers", {})
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
        async with http.request(
            method, api.url + path, headers=headers, allow_redirects=False, **extra
        ) as resp:
            return resp.status, CIMultiDict(resp.headers), await resp.text()


def console_routes(api: ApiHarness) -> list[tuple[str, str]]:
    """(method, path) of every console route of the daemon's app, path parameters filled."""
    assert api.daemon is not None
    app = build_app(api.daemon)
    routes = []
    for route in flat(app.routes):
        path: str = getattr(route, "path", "")
        if not (path == "/ui" or path.startswith("/ui/")) or isinstance(route, Mount):
            continue
        filled = re.sub(r"\{([^}]+)\}", _param, path)
        routes += [(method, filled) for method in sorted(route.methods)]  # type: ignore[attr-defined]
    return routes


def flat(routes: list[BaseRoute]) -> Iterator[BaseRoute]:
    """The app's routes, included routers opened (FastAPI keeps each included router whole,
    as `original_router`)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from flat(inner.routes) if inner is not None else [route]


async def synced(api: ApiHarness) -> None:
    """Wait until the daemon has loaded the three jobs of the schedules YAML."""

    async def names() -> list[str]:
        return [j["name"] for j in (await api.call("GET", "/v1/schedules")).body["items"]]

    await poll(names, lambda found: len(found) == 3)


def assert_console_headers(headers: Mapping[str, str], where: str, **expected: str) -> None:
    for name, value in {**SECURITY_HEADERS, **expected}.items():
        assert headers.get(name) == value, (where, name, headers.get(name))


async def test_every_console_route_answers_with_the_security_headers(api: ApiHarness) -> None:
    """Each console route, signed out, signed in (a page, a form, a live refresh), answers
    with the CSP, nosniff, DENY, the referrer and opener policies and no-store."""
    await api.start()
    session, cookie = Signer(api.settings).new_session("admin", time.time())
    routes = console_routes(api)
    assert len(routes) >= 25 and ("GET", "/ui") in routes and ("POST", "/ui/login") in routes
    for method, path in routes:
        form = {"csrf": session.csrf, "idem": uuid.uuid4().hex, "back": "list"}
        data = form if method == "POST" else None
        for who in (None, cookie):
            status, headers, _ = await fetch(api, method, path, who, data=data)
            where = f"{method} {path} {'signed in' if who else 'signed out'}: {status}"
            assert status < 500, where
            assert_console_headers(headers, where)
        if method == "GET":
            fragment = {"X-Console-Fragment": "1"}
            status, headers, _ = await fetch(api, method, path, headers=fragment)
            assert_console_headers(headers, f"fragment {path}: {status}")


async def test_the_audit_report_keeps_its_sandbox_and_gets_the_rest(
    api: ApiHarness, tmp_path: Any
) -> None:
    """The drift report is passed through under its own sandboxing CSP; every other console
    header is the middleware's."""
    run = tmp_path / "audit" / "2026-11-21"
    run.mkdir(parents=True)
    (run / "summary.json").write_text('{"date": "2026-11-21"}')
    (run / "report.html").write_text("<p>report</p>")
    await api.start(audit_dir=tmp_path / "audit")
    _, cookie = Signer(api.settings).new_session("read", time.time())
    status, headers, body = await fetch(api, "GET", "/ui/drift/2026-11-21/report.html", cookie)
    assert status == 200 and body == "<p>report</p>"
    csp = headers["Content-Security-Policy"]
    assert csp.startswith("sandbox") and csp.endswith("frame-ancestors 'none'")
    assert_console_headers(headers, "report", **{"Content-Security-Policy": csp})


async def test_static_files_are_served_with_their_type_and_an_hour_of_cache(
    api: ApiHarness,
) -> None:
    """console.css and console.js come as text/css and text/javascript (UTF-8), cacheable for an
    hour, with the console's other headers and a validator a browser can revalidate with;
    a name that is not there is a 404 that is never cached."""
    await api.start()
    kinds = {
        "console.css": "text/css; charset=utf-8",
        "console.js": "text/javascript; charset=utf-8",
    }
    for name, kind in kinds.items():
        status, headers, body = await fetch(api, "GET", f"/ui/static/{name}")
        assert status == 200 and body, name
        assert headers["Content-Type"] == kind, name
        assert_console_headers(headers, name, **{"Cache-Control": STATIC_CACHE})
        again = {"If-None-Match": headers["ETag"]}
        status, headers, _ = await fetch(api, "GET", f"/ui/static/{name}", headers=again)
        assert status == 304 and headers["Cache-Control"] == STATIC_CACHE, name
    for missing in ("/ui/static/nothing.js", "/ui/static/"):
        status, headers, body = await fetch(api, "GET", missing)
        assert status == 404 and "{% block" not in body, missing
        assert headers["Cache-Control"] == "no-store", missing
    assert api.daemon is not None
    counted = api.daemon.metrics.registry.get_sample_value(
        "mq_scheduler_api_requests_total", {"route": "/ui/static", "method": "GET", "status": "200"}
    )
    assert counted == 2  # by the mount's path, not as `unmatched`


async def test_console_requests_are_counted_by_their_full_route(api: ApiHarness) -> None:
    """A console page is counted in mq_scheduler_api_requests_total under its whole route
    template, `/ui/schedules/{name}`."""
    await api.start()
    await synced(api)
    _, cookie = Signer(api.settings).new_session("read", time.time())
    assert (await fetch(api, "GET", "/ui/schedules/nightly", cookie))[0] == 200
    assert api.daemon is not None
    labels = {"route": "/ui/schedules/{name}", "method": "GET", "status": "200"}
    registry = api.daemon.metrics.registry
    assert registry.get_sample_value("mq_scheduler_api_requests_total", labels) == 1


async def test_a_console_action_is_the_consoles_and_a_header_cannot_claim_it(
    api: ApiHarness,
) -> None:
    """A pause from the console is recorded `via: console` with its session's tag, from the
    browser's address; the same pause sent to the API with the scope key as a header, or
    the console's tag as a header, is recorded as the API's."""
    await api.start()
    await synced(api)
    session, cookie = Signer(api.settings).new_session("admin", time.time())
    form = {"csrf": session.csrf, "idem": uuid.uuid4().hex, "back": "list"}
    status, headers, _ = await fetch(api, "POST", "/ui/schedules/nightly/pause", cookie, data=form)
    assert status == 303 and headers["Location"] == "/ui/schedules"
    forged = {"mq_scheduler.console_session": "admin-forged", "X-Console-Session": "admin-x"}
    assert (await api.call("POST", "/v1/schedules/nightly/resume", headers=forged)).status == 200
    rows = (await api.call("GET", "/v1/activity", token=READ)).body["items"]
    seen = [(r["action"], r["via"], r["session"], r["who"]) for r in rows]
    tag = seen[1][2]
    assert seen == [
        ("resume", "api", None, "admin@127.0.0.1"),
        ("pause", "console", tag, "admin@127.0.0.1"),
    ]
    assert re.fullmatch(r"admin-[0-9a-f]{12}", tag)
