"""Who sees and does what in the console: the admin token acts, the read token only looks, no
token sees nothing (when tokens are configured), and with no token configured reads are open
and actions refused, as in the API. Sessions are signed cookies that a token change ends."""

from __future__ import annotations

import base64
import json
from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import Console, sign_in
from tests.integration.api.harness import ADMIN, READ

PAGES = ("", "schedules", "schedules/nightly", "delayed", "dead-letters", "drift")


async def post_form(page: Page, path: str, fields: dict[str, str]) -> dict[str, Any]:
    """Send a form as the console's own pages would (same origin, the session's cookie)."""
    script = """async ([path, fields]) => {
        const r = await fetch(path, {method: "POST", body: new URLSearchParams(fields),
                                     redirect: "manual", credentials: "same-origin"});
        return {status: r.status, text: await r.text(), type: r.type};
    }"""
    return dict(await page.evaluate(script, [path, fields]))


async def csrf_of(page: Page) -> str:
    return str(await page.locator("input[name=csrf]").first.get_attribute("value"))


async def test_read_token_looks_but_cannot_act(console: Console) -> None:
    """Signed in with the read token every page shows, the actions are disabled and say why, and
    a pause sent anyway (with the session's form token) is refused by the API with 403."""
    await console.api.start()
    page = await console.signed_in(READ)
    for path in PAGES:
        await page.goto(console.url + path)
        assert await page.title() != "Sign in · mq-scheduler"
    await page.goto(console.url + "schedules")
    await expect(page.locator("#why-no-act")).to_contain_text("read token: you can look")
    pause = page.get_by_role("button", name="Pause nightly")
    await expect(pause).to_be_disabled()
    await expect(page.get_by_role("button", name="Trigger nightly")).to_be_disabled()
    answer = await post_form(
        page, "/ui/schedules/nightly/pause", {"csrf": await csrf_of(page), "back": "list"}
    )
    assert answer["status"] == 403, answer
    assert "needs the admin token (SCHEDULER_ADMIN_TOKEN)" in answer["text"]
    assert not (await console.api.call("GET", "/v1/schedules/nightly")).body["paused"]


async def test_no_token_sees_nothing_and_a_token_change_ends_sessions(console: Console) -> None:
    """Without signing in every page leads to the sign-in form and shows no data, a live
    refresh gets 401 and a forged form does nothing; a wrong token is refused; the session
    cookie is HttpOnly and SameSite=Strict, a tampered one is refused, and changing the
    admin token on the daemon ends the session."""
    await console.api.start()
    page = await console.page()
    for path in (
        *PAGES,
        "dead-letters/00000000-0000-0000-0000-000000000000",
        "drift/x/report.html",
    ):
        await page.goto(console.url + path)
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        shown = await page.locator("body").inner_text()
        assert not {"nightly", "test-1", "mq.scheduled", "leader"} & set(shown.split()), shown
    live = await page.evaluate(
        "async () => (await fetch('/ui/', {headers: {'X-Console-Fragment': '1'}})).status"
    )
    assert live == 401
    forged = await post_form(page, "/ui/schedules/nightly/pause", {"back": "list"})
    assert forged["type"] == "opaqueredirect"  # to the sign-in page
    assert not (await console.api.call("GET", "/v1/schedules/nightly")).body["paused"]

    await page.goto(console.url + "schedules")
    await page.get_by_label("Token").fill("not-a-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("not one this daemon knows")
    await sign_in(page, ADMIN)
    await expect(page.get_by_role("heading", name="Schedules")).to_be_visible()  # where it was
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "mqs_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert ADMIN not in cookie["value"] and READ not in cookie["value"]
    assert "Sign in" not in await page.title()

    body, mac = cookie["value"].split(".")
    doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    doc["k"] = "admin" if doc["k"] == "read" else "read"  # same signature, other content
    altered = base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")
    # a cookie read back is one to set again (the same keys): playwright types the two apart
    await page.context.add_cookies([{**cookie, "value": f"{altered}.{mac}"}])  # type: ignore[typeddict-item]
    await page.goto(console.url + "schedules")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.context.add_cookies([cookie])  # type: ignore[list-item]
    await page.goto(console.url + "schedules")
    await expect(page.get_by_role("heading", name="Schedules")).to_be_visible()

    await console.api.stop()
    await console.api.start()  # same tokens: the session is kept by the browser alone
    await page.goto(console.url + "schedules")  # (another port; cookies ignore ports)
    await expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
    await console.api.stop()
    await console.api.start(admin_token="a-new-admin-token")
    await page.goto(console.url + "schedules")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


async def test_sign_out_ends_the_session_in_the_browser(console: Console) -> None:
    """Sign out (a form with the session's token) drops the cookie and shows the sign-in page;
    a form token from another session is refused."""
    await console.api.start()
    page = await console.signed_in()
    other = await console.signed_in()
    stale = await csrf_of(other)
    answer = await post_form(page, "/ui/schedules/nightly/pause", {"csrf": stale})
    assert answer["status"] == 403 and "Form expired" in answer["text"]
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_role("status")).to_have_text("Signed out.")
    assert not [c for c in await page.context.cookies() if c["name"] == "mqs_session"]
    await page.goto(console.url)
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


async def test_without_tokens_configured_reads_are_open_and_actions_refused(
    console: Console,
) -> None:
    """With no token on the daemon the pages show without signing in and say so; every action
    is disabled, and one sent anyway gets the API's 403 naming SCHEDULER_ADMIN_TOKEN."""
    await console.api.start(admin_token=None, read_token=None)
    page = await console.page()
    await page.goto(console.url + "login")
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    await expect(page.locator("#why-no-act")).to_contain_text("No token is configured")
    await page.goto(console.url + "schedules")
    await expect(page.get_by_role("button", name="Pause nightly")).to_be_disabled()
    answer = await post_form(page, "/ui/schedules/nightly/pause", {})
    assert answer["status"] == 403 and "set SCHEDULER_ADMIN_TOKEN" in answer["text"]
    assert not (await console.api.call("GET", "/v1/schedules/nightly", token=None)).body["paused"]
