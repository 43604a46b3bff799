"""The console's pause note and Activity page in a real browser at 1,280 and 390 px: an
operator pauses a job with a note, sees the note on the list and the job page, and finds the
action (marked as the console's, with its session) on the Activity page, filtered."""

from __future__ import annotations

import re

from playwright.async_api import expect

from tests.browser.conftest import WIDTHS, Console, shot, tab_to
from tests.browser.test_pages import audit
from tests.integration.api.harness import READ


async def test_pause_with_a_note_shows_it_and_the_activity_page_lists_it(
    console: Console,
) -> None:
    """At both widths: the note typed into the pause form is kept and shown with who paused
    on the list and the job page; the Activity page lists the pause and the resume newest
    first as console actions, its filters narrow the table, the page needs no sideways
    scrolling and its controls are labelled and reachable by keyboard."""
    await console.api.start()
    for width in WIDTHS:
        note = f"vendor down ({width} px) <b>not bold</b>"
        page = await console.signed_in(width=width)
        await page.get_by_role("link", name="Schedules").click()
        await page.get_by_label("Why pause nightly (optional)").fill(note)
        await page.get_by_role("button", name="Pause nightly").click()
        await expect(page.get_by_role("status")).to_have_text("Paused nightly.")
        row = page.get_by_role("row").filter(has_text="nightly")
        await expect(row.locator("q.pause-note")).to_have_text(note)
        await shot(page, "schedules-paused-note")
        await page.goto(console.url + "schedules/nightly")
        await expect(page.locator("q.pause-note")).to_have_text(note)
        await expect(page.locator("main")).to_contain_text("by admin@")
        await page.get_by_role("button", name="Resume nightly").click()
        await expect(page.get_by_role("status")).to_have_text("Resumed nightly.")

        await page.get_by_role("link", name="Activity").click()
        await expect(page.get_by_role("heading", name="Activity", exact=True)).to_be_visible()
        rows = page.locator("table.activity tbody tr")
        await expect(rows.first).to_contain_text("resume")
        await expect(rows.nth(1)).to_contain_text("pause")
        await expect(rows.nth(1)).to_contain_text(note)
        await expect(rows.nth(1)).to_contain_text("console admin-")
        await audit(page)
        await tab_to(page, "Filter")
        await shot(page, "activity")
        await page.get_by_label("Action").select_option("pause")
        await page.get_by_role("button", name="Filter").click()
        await expect(page).to_have_url(re.compile(r"/ui/activity\?action=pause&"))
        await expect(rows).to_have_count(WIDTHS.index(width) + 1)
        await page.get_by_label("Since (UTC)").fill("yesterday")
        await page.get_by_role("button", name="Filter").click()
        await expect(page.locator("#err-since")).to_contain_text("RFC 3339")
        await audit(page)

    listed = await console.api.call("GET", "/v1/activity", token=READ)
    assert [(a["action"], a["via"]) for a in listed.body["items"]] == [
        ("resume", "console"), ("pause", "console")
    ] * len(WIDTHS)  # fmt: skip
    sessions = {a["session"] for a in listed.body["items"]}
    assert len(sessions) == len(WIDTHS) and all(s.startswith("admin-") for s in sessions)
