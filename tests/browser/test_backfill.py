"""Backfill from a job's page in a real browser, at 1,280 and 390 px: a window form, a
confirmation that says how many occurrences it will fire, and each occurrence fired once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playwright.async_api import expect

from tests.browser.conftest import WIDTHS, Console, shot
from tests.browser.test_pages import AUDIT_JS


async def test_backfill_from_the_job_page_after_a_confirmation(console: Console) -> None:
    """From `frozen`'s page an operator opens Backfill, gives a three-hour window, sees that it
    holds 3 occurrences, fires them, and a second look at the same window has none left to
    fire; every page is labelled and fits 1,280 and 390 px."""
    await console.api.start()
    top = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start, end = top - timedelta(hours=3), top
    fired_once = False
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        await page.goto(console.url + "schedules/frozen")
        await page.get_by_role("link", name="Backfill frozen").click()
        await expect(page.get_by_role("heading", name="Backfill frozen")).to_be_visible()
        await page.get_by_label("From (UTC)").fill(start.strftime("%Y-%m-%dT%H:%M"))
        await page.get_by_label("To (UTC)").fill(end.strftime("%Y-%m-%dT%H:%M"))
        await page.get_by_role("button", name="Count occurrences").click()
        plan = page.locator("section[aria-labelledby=h-plan]")
        if not fired_once:
            await expect(page.get_by_role("heading", name="Fire 3 occurrences?")).to_be_visible()
            await expect(plan).to_contain_text("The window holds 3 occurrences")
            assert await page.evaluate(AUDIT_JS) == []
            await shot(page, "backfill-confirm")
            await page.get_by_role("button", name="Fire 3 occurrences").click()
            await expect(page.get_by_role("status")).to_contain_text(
                "Backfilled frozen: 3 occurrences fired, 0 already fired before."
            )
            await expect(page).to_have_url(console.url + "schedules/frozen")
            fires = page.get_by_role("region", name="Last fires")
            await expect(fires.get_by_role("row").filter(has_text="manual")).to_have_count(3)
            fired_once = True
        else:
            await expect(page.get_by_role("heading", name="Nothing left to fire")).to_be_visible()
            await expect(plan).to_contain_text("3 an earlier backfill already fired")
            await expect(page.get_by_role("button", name="Fire", exact=False)).to_have_count(0)
            assert await page.evaluate(AUDIT_JS) == []
            await shot(page, "backfill-confirm-done")
    msgs = await console.api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.frozen")
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [
        f"frozen@backfill-{(start + timedelta(hours=i)).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        for i in range(3)
    ]


async def test_a_window_the_api_refuses_shows_its_reason(console: Console) -> None:
    """A window reaching into the future is refused on the confirmation step with the API's
    explanation, and nothing fires."""
    await console.api.start()
    page = await console.signed_in(width=390)
    later = datetime.now(UTC) + timedelta(hours=2)
    query = f"?start=2026-01-01T00:00&end={later.strftime('%Y-%m-%dT%H:%M')}"
    await page.goto(console.url + "schedules/frozen/backfill" + query)
    await expect(page.locator("main")).to_contain_text("is in the future")
    assert await page.evaluate(AUDIT_JS) == []
    await shot(page, "backfill-refused")
    msgs = await console.api.read_stream("SCHEDULED", quiet=0.3, subject="mq.scheduled.frozen")
    assert msgs == []
