"""The console's structure on a running daemon: every console route answers with the security
headers (one middleware covers them all), the static files come with their types and cache
lifetime, and a console action reaches the activity log as the console's, from the browser's
address, which no network request can claim."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDict
from starlette.routing import BaseRoute, Mount

from scheduler import __version__
from scheduler.console.console import SECURITY_HEADERS, STATIC_CACHE, build_app
from scheduler.console.session import SESSION_COOKIE, Signer
from tests.integration.api.harness import ADMIN, READ, ApiHarness, poll

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


# -- mounted elsewhere --------------------------------------------------------------------------
BASE = "/ops/console"


def console_links(html: str) -> list[str]:
    return re.findall(r'(?:href|action|src)="(/[^"]*)"', html)


def elsewhere(api: ApiHarness) -> httpx.AsyncClient:
    """A client of this daemon's API built with the console at BASE, called in-process."""
    assert api.daemon is not None
    app = build_app(api.daemon, base=BASE)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1")


async def test_the_console_mounted_elsewhere_keeps_to_its_path(api: ApiHarness) -> None:
    """With the console at another path a page leads to that path's sign-in form; signing in
    there sets the cookie for that path and returns to the page asked for; every page, its
    style sheet, script and links stay under the path, and `/ui/` is nobody's page."""
    await api.start()
    await synced(api)
    async with elsewhere(api) as http:
        asked = await http.get(f"{BASE}/schedules")
        assert asked.status_code == 303
        assert asked.headers["location"] == f"{BASE}/login?next=%2Fops%2Fconsole%2Fschedules"
        form = await http.get(asked.headers["location"])
        assert form.status_code == 200 and f'action="{BASE}/login"' in form.text
        signed = await http.post(
            f"{BASE}/login", data={"token": ADMIN, "next": f"{BASE}/schedules"}
        )
        assert signed.status_code == 303 and signed.headers["location"] == f"{BASE}/schedules"
        assert f"Path={BASE}" in signed.headers["set-cookie"]
        for page in ("/", "/schedules", "/schedules/nightly", "/delayed", "/dead-letters",
                     "/drift", "/activity", "/schedules/nightly/backfill"):  # fmt: skip
            shown = await http.get(BASE + page)
            assert shown.status_code == 200, (page, shown.text)
            assert_console_headers(shown.headers, page)
            links = console_links(shown.text)
            assert f"{BASE}/static/console.js?v={__version__}" in links, page
            assert f"{BASE}/logout" in links and f"{BASE}/activity" in links, page
            assert all(link.startswith(BASE) or link == "/docs" for link in links), links
        script = await http.get(f"{BASE}/static/console.js")
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        bare = await http.get(BASE)
        assert bare.status_code == 308 and bare.headers["location"] == f"{BASE}/"
        assert (await http.get("/ui/")).status_code == 404


async def test_an_action_from_the_console_elsewhere_redirects_there(api: ApiHarness) -> None:
    """A pause sent from the console at another path is done, and its answer sends the
    browser back under that path with the flash message."""
    await api.start()
    await synced(api)
    async with elsewhere(api) as http:
        await http.post(f"{BASE}/login", data={"token": ADMIN, "next": f"{BASE}/"})
        page = await http.get(f"{BASE}/schedules")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf is not None
        form = {"csrf": csrf.group(1), "idem": uuid.uuid4().hex, "back": "list"}
        done = await http.post(f"{BASE}/schedules/nightly/pause", data=form)
        assert done.status_code == 303 and done.headers["location"] == f"{BASE}/schedules"
        shown = await http.get(done.headers["location"])
        assert "Paused nightly." in shown.text
    assert (await api.call("GET", "/v1/schedules/nightly", token=READ)).body["paused"]
