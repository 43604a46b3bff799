"""Rough edges a newcomer met in the console (issue 39, item 4), at 1,280 and 390 px: the delayed
list's `status`, what a fired task's page says of what it no longer keeps, the overview's YAML
error and lateness, the dead-letter list's target, the navigation on a phone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from playwright.async_api import Page, expect

from scheduler.api.models import TASK_STATUSES
from tests.browser.conftest import WIDTHS, Console, shot
from tests.integration.api.harness import READ, TARGET, envelope, poll


def fact(page: Page, term: str) -> str:
    """The JS expression for the text of the `<dd>` after the `<dt>` named `term`."""
    return (
        "() => { for (const dt of document.querySelectorAll('dl.facts dt')) "
        f"if (dt.textContent.trim() === {term!r}) return dt.nextElementSibling.textContent.trim(); "
        "return null; }"
    )


async def facts(page: Page, *terms: str) -> dict[str, str | None]:
    return {t: await page.evaluate(fact(page, t)) for t in terms}


async def test_delayed_list_takes_status_any_and_names_the_statuses_for_a_wrong_one(
    console: Console,
) -> None:
    """`?status=any` lists every task (as the "any" option does), and an unknown status is
    answered with the statuses the list accepts, beside the field."""
    await console.api.start()
    due = datetime.now(UTC) + timedelta(hours=1)
    for _ in range(2):
        await console.api.publish(TARGET, envelope(due))

    async def listed() -> int:
        r = await console.api.call("GET", "/v1/delayed", token=READ, params={"status": "pending"})
        return len(r.body["items"])

    await poll(listed, lambda n: n == 2)
    page = await console.signed_in()
    await page.goto(console.url + "delayed?status=any")
    await expect(page.get_by_role("heading", name="2 tasks")).to_be_visible()
    await expect(page.get_by_label("Status")).to_have_value("any")
    await page.get_by_role("button", name="Search").click()  # the form's own "any" round-trips
    await expect(page.get_by_role("heading", name="2 tasks")).to_be_visible()
    await page.goto(console.url + "delayed?status=bogus")
    error = page.locator("#err-status")
    await expect(error).to_contain_text("'bogus' is not a task status")
    await expect(error).to_contain_text(", ".join(TASK_STATUSES))
    await shot(page, "delayed-bad-status")


async def test_task_page_says_what_a_fired_task_no_longer_keeps(console: Console) -> None:
    """A pending task's page shows its priority, intake time and "never" for no expiry; once
    fired the page says those are not kept (no bare "-" or "—"), at both widths."""
    await console.api.start()
    waiting = envelope(datetime.now(UTC) + timedelta(hours=1), priority=2)
    fired = envelope(datetime.now(UTC) + timedelta(milliseconds=200), priority=3)
    await console.api.publish(TARGET, waiting)
    await console.api.publish(TARGET, fired)

    async def status() -> str:
        r = await console.api.call("GET", f"/v1/delayed/{fired['id']}", token=READ)
        return str(r.body.get("status")) if r.status == 200 else ""

    await poll(status, lambda s: s == "fired", within=10)
    terms = ("Priority", "Received", "Expires")
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        await page.goto(console.url + f"delayed/{waiting['id']}")
        shown = await facts(page, *terms)
        assert shown["Priority"] == "2" and shown["Expires"] == "never (no ttl_seconds)", shown
        assert shown["Received"] and shown["Received"][0].isdigit(), shown
        await page.goto(console.url + f"delayed/{fired['id']}")
        assert await facts(page, *terms) == dict.fromkeys(terms, "not kept once fired")
        dashes = await page.evaluate(
            "() => [...document.querySelectorAll('dl.facts dd')].filter("
            "d => ['-', '—'].includes(d.textContent.trim())).length"
        )
        assert dashes == 0
        await shot(page, "task-fired")


async def test_overview_shows_a_yaml_error_once_counts_it_and_explains_a_thin_p99(
    console: Console,
) -> None:
    """With a broken job the overview shows its error once (the banner, not again under
    Warnings), the Schedules card counts it as not loaded, and a p99 from few deliveries says
    that one late fire sets it; the dead-letter list heads its column "Target", as `dlq show`
    does; at 390 px the navigation is one line."""
    broken = Path(console.api.settings.schedules_dir) / "broken.yaml"
    broken.write_text(
        "scheduled_jobs:\n"
        "  - name: report-weekly\n"
        "    subject: mq.scheduled.report\n"
        '    cron: "61 * * * *"\n'
        "    data: {}\n"
    )
    await console.api.start(max_attempts=1)
    await console.api.publish(TARGET, envelope(None))
    await console.api.publish("mq.nowhere.x", envelope(None))

    async def state() -> tuple[int, int]:
        stats = await console.api.call("GET", "/v1/stats", token=READ)
        dead = await console.api.call("GET", "/v1/dead-letters", token=READ)
        return stats.body["lateness_ms"]["samples"], len(dead.body["items"])

    await poll(state, lambda s: s[0] > 0 and s[1] == 1, within=15)
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        text = await page.locator("main").inner_text()
        assert text.count("value out of range 0-59") == 1, text
        card = page.get_by_test_id("schedule-summary")
        await expect(card).to_contain_text("1 YAML error")
        await expect(card).to_contain_text("not loaded")
        await expect(page.get_by_test_id("p99-hint")).to_contain_text("a single late one")
        await shot(page, "overview-yaml-error")
        await assert_navigation_on_one_line(page, width)

        await page.goto(console.url + "dead-letters")
        await expect(page.locator("table thead")).to_contain_text("Target")
        await expect(page.locator("table thead")).not_to_contain_text("Subject")
        await expect(page.locator("table tbody td[data-label=Target]")).to_have_text("mq.nowhere.x")
        await shot(page, "dead-letters-target")


async def assert_navigation_on_one_line(page: Page, width: int) -> None:
    """Every navigation link sits on one line, each can be scrolled to and clicked."""
    tops = await page.evaluate(
        "() => [...document.querySelectorAll('header.top nav li')].map("
        "li => Math.round(li.getBoundingClientRect().top))"
    )
    assert len(tops) == 6 and len(set(tops)) == 1, (width, tops)
    nav = page.get_by_role("navigation", name="Console")
    label = "Delayed tasks" if width > 760 else "Delayed"
    link = nav.get_by_role("link", name=label, exact=True)
    await link.scroll_into_view_if_needed()
    await expect(link).to_be_in_viewport()
    last = nav.get_by_role("link", name="Activity")
    await last.scroll_into_view_if_needed()
    await expect(last).to_be_in_viewport()
