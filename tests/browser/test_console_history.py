"""Issue 26 on the console, in Chromium at 1,280 and 390 px: cron in plain words and next runs
in relative time; the schedules search and state filter; the overview's parts' health,
schedules summary and history charts with an abnormal fire and its cause; subjects that wrap
at dots; a dead letter's original bytes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from playwright.async_api import expect

from scheduler.operations.history import bucket_start
from tests.browser.conftest import WIDTHS, Console, shot
from tests.browser.test_pages import audit
from tests.integration.api.harness import READ, envelope, poll
from tests.integration.api.test_history_api import log_fire

LONG_SUBJECT = "mq.nowhere.reconciliation-of-quarterly-ledgers.settlement-batches-europe.x"
# Every token of each `code.subject` as rendered: how many line boxes it spans (1: unbroken).
TOKEN_LINES_JS = """() => {
  const out = [];
  for (const code of document.querySelectorAll("td code, dd code")) {
    if (!code.textContent.includes(".")) continue;
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      let start = 0;
      for (const token of node.textContent.split(".")) {
        if (token.length > 1) {
          const range = document.createRange();
          range.setStart(node, start);
          range.setEnd(node, start + token.length);
          const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
          out.push([token, tops.size]);
        }
        start += token.length + 1;
      }
    }
  }
  return out;
}"""


async def test_schedules_read_in_words_with_relative_next_runs_and_filter_by_search_and_state(
    console: Console,
) -> None:
    """Each job's cron reads in words; next runs read `in ...` with the exact instant as the
    tooltip; the search form (a plain GET) and the state filter narrow the list; a bad state
    or an overlong search is refused with the field named; the job's page has no duplicate
    UTC column and charts its own history."""
    await console.api.start()
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        await page.goto(console.url + "schedules")
        nightly = page.get_by_role("row").filter(has_text="nightly")
        await expect(nightly).to_contain_text("At 02:30")
        first = nightly.locator("ol.times time").first
        await expect(first).to_have_text(re.compile(r"^in \d+ (h|min|d)$"))
        assert "UTC" in (await first.get_attribute("title") or "")
        await page.get_by_role("textbox", name="Search").fill("NIGHT")
        await page.get_by_role("button", name="Search").click()
        await expect(page.get_by_role("link", name="nightly", exact=True)).to_be_visible()
        await expect(page.get_by_role("link", name="every-second", exact=True)).to_have_count(0)
        await audit(page)
        await shot(page, "schedules-search")
        await page.goto(console.url + "schedules?state=paused")
        await expect(page.get_by_role("link", name="frozen", exact=True)).to_be_visible()
        await expect(page.get_by_role("link", name="nightly", exact=True)).to_have_count(0)
        await page.goto(console.url + "schedules?state=failed")
        await expect(page.get_by_test_id("no-match")).to_contain_text("No job matches")
        for query, field in (("state=gone", "state: one of"), ("q=" + "x" * 101, "q: at most")):
            response = await page.goto(console.url + "schedules?" + query)
            assert response is not None and response.status == 422
            await expect(page.locator(".field-error")).to_contain_text(field)
        await page.goto(console.url + "schedules/nightly")
        heads = await page.get_by_role("region", name="Next runs").locator("th").all_inner_texts()
        assert heads == ["When", "Europe/Berlin", "Jitter"]
        await expect(page.locator("dl.facts")).to_contain_text("At 02:30")
        await expect(
            page.get_by_role("img", name="Lateness p99 per minute, last hour")
        ).to_be_visible()
        await audit(page)
        await shot(page, "schedule-words")


async def test_overview_shows_health_summary_and_history_with_an_abnormal_fire_and_cause(
    console: Console,
) -> None:
    """The overview shows NATS connected, PostgreSQL reachable, the lease holder and the clock
    skew; the schedules' counts and next fire; the history charts, where a 7,341 ms fire after
    a change of leader is coloured abnormal and listed with that cause; the day window too."""
    daemon = await console.api.start()
    due = bucket_start(datetime.now(UTC) - timedelta(minutes=20), timedelta(minutes=1))
    await log_fire(daemon, "t-before", due - timedelta(minutes=5), 3, 900, "old-leader")
    await log_fire(daemon, "t-gap", due, 7341, 901, "new-leader")
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        health = page.get_by_test_id("health")
        await expect(health).to_contain_text("connected")
        await expect(health).to_contain_text("reachable")
        await expect(health).to_contain_text(daemon.settings.instance_id)
        await expect(health).to_contain_text("bound 100 ms")
        summary = page.get_by_test_id("schedule-summary")
        assert (await summary.locator("dd").all_inner_texts()) == ["2", "1", "0"]
        await expect(summary).to_contain_text("Next fire: every-second")
        chart = page.get_by_role("img", name="Lateness p99 per minute, last hour")
        await expect(chart.locator("rect.abnormal")).to_have_count(1)
        abnormal = page.get_by_test_id("abnormal")
        await expect(abnormal).to_contain_text("7,341 ms")
        await expect(abnormal).to_contain_text("leader change: epoch 900 (old-leader)")
        await audit(page)
        await shot(page, "overview-history")
        await page.get_by_role("link", name="last day").click()
        await expect(
            page.get_by_role("img", name="Lateness p99 per hour, last day")
        ).to_be_visible()
        await expect(page.get_by_test_id("abnormal")).to_contain_text("7,341 ms")
        await audit(page)
        await shot(page, "overview-day")


async def dead_letters(console: Console) -> list[Any]:
    got: list[Any] = (await console.api.call("GET", "/v1/dead-letters", token=READ)).body["items"]
    return got


async def test_dead_letters_wrap_subjects_at_dots_and_show_the_bytes_as_published(
    console: Console,
) -> None:
    """In the dead-letter list and page a long subject breaks only between its tokens, at
    1,280 and 390 px; the original message is the published bytes, key order and spacing kept
    (not the database's re-encoding)."""
    await console.api.start(max_attempts=1)
    task = envelope(None)
    task = {"data": {"zeta": 1, "alpha": 2}, **{k: v for k, v in task.items() if k != "data"}}
    published = json.dumps(task, separators=(",  ", ": ")).encode()
    await console.api.publish(LONG_SUBJECT, published)
    [letter] = await poll(lambda: dead_letters(console), lambda items: len(items) == 1, within=15)
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        for path in ("dead-letters", f"dead-letters/{letter['id']}"):
            await page.goto(console.url + path)
            tokens = await page.evaluate(TOKEN_LINES_JS)
            assert tokens, "no subject shown"
            split = [token for token, lines in tokens if lines > 1]
            assert not split, f"{path} at {width} px: tokens broken mid-word: {split}"
            await audit(page)
            await shot(page, path.split("/")[0] + ("-detail" if "/" in path else "") + "-wrap")
        payload = await page.get_by_test_id("payload").inner_text()
        assert payload == published.decode()
