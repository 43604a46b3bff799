"""The console mounted at another path than `/ui`, in-process on the twins
(tests/support/edge_twins.py): its pages, sign-in, links and actions keep to that path."""

from __future__ import annotations

import re
import uuid

import httpx

from scheduler import __version__
from scheduler.console.console import SECURITY_HEADERS, build_app
from tests.support.edge_twins import ADMIN, READ, EdgeOnTwins

BASE = "/ops/console"


def assert_console_headers(headers: httpx.Headers, where: str) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (where, name, headers.get(name))


def console_links(html: str) -> list[str]:
    return re.findall(r'(?:href|action|src)="(/[^"]*)"', html)


def elsewhere(api: EdgeOnTwins) -> httpx.AsyncClient:
    """A client of the API on twins built with the console at BASE, called in-process."""
    app = build_app(api.backend, base=BASE)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1")


async def test_the_console_mounted_elsewhere_keeps_to_its_path(api: EdgeOnTwins) -> None:
    """With the console at another path a page leads to that path's sign-in form; signing in
    there sets the cookie for that path and returns to the page asked for; every page, its
    style sheet, script and links stay under the path, and `/ui/` is nobody's page."""
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


async def test_an_action_from_the_console_elsewhere_redirects_there(api: EdgeOnTwins) -> None:
    """A pause sent from the console at another path is done, and its answer sends the
    browser back under that path with the flash message."""
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
