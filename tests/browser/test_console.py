"""The console in a real browser: an operator signs in, pauses, resumes and triggers a job and
sees the fire, finds and cancels a delayed task (never delivered) and lists fired ones, replays
dead letters (each delivered once), and the console shows payloads as text."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import Console, shot, tab_to
from tests.browser.test_access import post_form
from tests.integration.api.harness import READ, TARGET, envelope, poll

XSS = "<script>window.__xss = 'payload'</script><img src=x onerror=\"window.__xss = 'img'\">"


async def no_script_ran(page: Page) -> None:
    assert await page.evaluate("() => window.__xss === undefined"), "a payload ran as script"


async def test_admin_pauses_resumes_and_triggers_a_job_and_sees_the_fire(
    console: Console, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed in with the admin token, an operator sees the overview refresh itself, pauses a
    job from the keyboard, resumes it, triggers it after a confirmation, and the fire shows on
    the job's page and in the stream; each action leaves the API's own write log line."""
    caplog.set_level(logging.INFO, logger="scheduler.api")
    await console.api.start()
    page = await console.page()
    await page.goto(console.url)
    await expect(page).to_have_url(console.url + "login?next=%2Fui%2F")
    await page.get_by_label("Token").fill("admin-secret-token")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    await expect(page.locator(".card").first).to_contain_text("test-1")
    await expect(page.get_by_role("table").first).to_contain_text("leader")
    updated = page.locator(".updated time")
    first = await updated.get_attribute("datetime")
    await expect(updated).not_to_have_attribute("datetime", str(first), timeout=9_000)
    await expect(page.locator(".card").first).to_contain_text("test-1")  # refreshed in place
    toggle = page.get_by_role("button", name="Pause auto-refresh")
    await toggle.click()
    await expect(page.get_by_role("button", name="Resume auto-refresh")).to_have_attribute(
        "aria-pressed", "true"
    )
    await page.get_by_role("link", name="Schedules").click()
    await expect(page.get_by_role("heading", name="Schedules")).to_be_visible()

    await tab_to(page, "Pause nightly")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("status")).to_have_text("Paused nightly.")
    job = (await console.api.call("GET", "/v1/schedules/nightly")).body
    assert job["paused"] and job["paused_by"].startswith("admin@")
    await page.get_by_role("button", name="Resume nightly").click()
    await expect(page.get_by_role("status")).to_have_text("Resumed nightly.")
    assert not (await console.api.call("GET", "/v1/schedules/nightly")).body["paused"]

    await page.get_by_role("link", name="Trigger nightly").click()
    await expect(page.get_by_role("heading", name="Trigger nightly now?")).to_be_visible()
    await shot(page, "trigger-confirm")
    await page.get_by_role("button", name="Trigger nightly now").click()
    await expect(page.get_by_role("status")).to_contain_text("Triggered nightly")
    await expect(page).to_have_url(console.url + "schedules/nightly")
    fires = page.get_by_role("region", name="Last fires")
    await expect(fires.get_by_role("row").filter(has_text="manual")).to_have_count(1)
    msgs = await console.api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.nightly")
    assert len(msgs) == 1 and msgs[0].headers["Nats-Msg-Id"].startswith("nightly@manual-")
    assert msgs[0].headers["Nats-Msg-Id"] in await page.get_by_role("status").inner_text()
    writes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("api.write")]
    assert writes == [
        f"api.write who=admin@127.0.0.1 action={action} id=nightly outcome={outcome}"
        for action, outcome in (
            ("pause", "paused"),
            ("resume", "resumed"),
            ("trigger", "triggered"),
        )
    ]


async def test_delayed_task_found_and_cancelled_is_never_delivered(console: Console) -> None:
    """A task found by its subject and id and cancelled from its page (after a confirmation)
    is never delivered, while its neighbour due at the same time is (and is then listed as
    fired); another is rescheduled."""
    await console.api.start()
    # The cancel must come before the due time: the browser's steps up to it took more than
    # 8 s with four test workers on two cores (the answer was then "already firing or done")
    due = datetime.now(UTC) + timedelta(seconds=20)
    keep, drop = envelope(due, org_id="org-7"), envelope(due, org_id="org-7")
    later = envelope(due + timedelta(minutes=30), org_id="org-7")
    for doc in (keep, drop, later):
        await console.api.publish(TARGET, doc)
    page = await console.signed_in()
    await page.goto(console.url + "delayed")
    await page.get_by_label("Target subject").fill("mq.tasks.>")
    await page.get_by_label("Org id").fill("org-7")
    await page.get_by_label("Status").select_option("pending")
    await page.get_by_role("button", name="Search").click()
    rows = page.get_by_role("row")
    await expect(rows.filter(has_text=drop["id"])).to_have_count(1)
    await expect(rows.filter(has_text="pending")).to_have_count(3)

    await page.get_by_label("Task id").fill(drop["id"])
    await page.get_by_role("button", name="Search").click()
    await expect(page.get_by_role("heading", name=f"Task {drop['id']}")).to_be_visible()
    await page.get_by_role("link", name="Cancel task").click()
    await page.get_by_role("button", name="Cancel the task").click()
    await expect(page.get_by_role("status")).to_contain_text("it will not be delivered")
    await expect(page.locator("dl.facts")).to_contain_text("cancelled")

    await page.goto(console.url + f"delayed/{later['id']}")
    await page.get_by_label("or from now").fill("2h")
    await page.get_by_role("button", name="Reschedule").click()
    await expect(page.get_by_role("status")).to_contain_text("Rescheduled")
    moved = (await console.api.call("GET", f"/v1/delayed/{later['id']}")).body
    assert datetime.fromisoformat(moved["due_at"]) > due + timedelta(minutes=100)

    async def delivered() -> list[Any]:
        return await console.api.read_stream("TASKS", quiet=0.3)

    msgs = await poll(delivered, lambda m: len(m) >= 1, within=30)
    await asyncio.sleep(1.0)  # the cancelled task was due with it: give it every chance to leak
    ids = [m.headers["Nats-Msg-Id"] for m in await delivered()]
    assert ids == [keep["id"]], ids
    assert msgs[0].headers["Nats-Msg-Id"] == keep["id"]
    status = (await console.api.call("GET", f"/v1/delayed/{drop['id']}")).body["status"]
    assert status == "cancelled"

    async def keep_status() -> str:
        got: str = (await console.api.call("GET", f"/v1/delayed/{keep['id']}")).body["status"]
        return got

    await poll(keep_status, lambda s: s == "fired")  # its row deleted: listed from its tombstone
    await page.goto(console.url + "delayed")
    await page.get_by_label("Target subject").fill("mq.tasks.>")
    await page.get_by_label("Status").select_option("fired")
    await page.get_by_role("button", name="Search").click()
    await expect(
        page.get_by_role("heading", name="1 task, in the order they fired")
    ).to_be_visible()
    fired_row = rows.filter(has_text=keep["id"])
    await expect(fired_row).to_contain_text("fired")
    await expect(fired_row.locator("td[data-label=Priority]")).to_have_text("—")  # not kept
    await expect(rows.filter(has_text=drop["id"])).to_have_count(0)


async def test_dead_letters_replayed_one_and_by_filter_are_each_delivered_once(
    console: Console,
) -> None:
    """A dead letter replayed from its page (after a confirmation) is delivered once; the
    matching ones replayed as a batch after confirming their count are delivered once each;
    bad input is resolved from its page."""
    await console.api.start(max_attempts=1)
    docs = [envelope(None) for _ in range(3)]
    for i, doc in enumerate(docs):
        await console.api.publish(f"mq.nowhere.n{i}", doc)
    await console.api.js.publish("mq.delay.tasks.work", b"{broken", headers={"Nats-Msg-Id": "b1"})

    async def dead() -> list[Any]:
        reply = await console.api.call("GET", "/v1/dead-letters", token=READ)
        got: list[Any] = reply.body["items"]
        return got

    await poll(dead, lambda items: len(items) == 4, within=15)
    await console.api.js.add_stream(name="NOWHERE", subjects=["mq.nowhere.>"])
    page = await console.signed_in()
    await page.goto(console.url + "dead-letters")
    await page.get_by_label("Reason").fill("publish_failed")
    await page.get_by_role("button", name="Filter").click()
    rows = page.get_by_role("row").filter(has_text="publish_failed")
    await expect(rows).to_have_count(3)
    await page.get_by_role("link", name=f"of task {docs[0]['id']}").click()
    await expect(page.get_by_test_id("payload")).to_contain_text(docs[0]["id"])
    await page.get_by_role("link", name="Replay").click()
    await page.get_by_role("button", name="Replay it").click()
    await expect(page.get_by_role("status")).to_contain_text(f"Replayed task {docs[0]['id']}")

    await page.goto(console.url + "dead-letters?reason=publish_failed&subject=mq.nowhere.%3E")
    await page.get_by_role("link", name="Replay all matching").click()
    await expect(page.get_by_test_id("matched")).to_have_text("2")
    await page.get_by_role("button", name="Replay 2 dead letters").click()
    await expect(page.get_by_role("status")).to_have_text("Replayed 2 of 2.")

    msgs = await console.api.read_stream("NOWHERE", quiet=1.5)
    assert sorted(m.headers["Nats-Msg-Id"] for m in msgs) == sorted(d["id"] for d in docs)

    await page.goto(console.url + "dead-letters?reason=unparseable")
    await page.get_by_role("row").filter(has_text="unparseable").get_by_role("link").click()
    await page.get_by_role("button", name="Resolve").click()
    await expect(page.get_by_role("status")).to_have_text("Resolved.")
    [bad] = [d for d in await dead() if d["reason"] == "unparseable"]
    assert bad["resolved"] and bad["resolved_by"].startswith("admin@")


async def test_script_in_payloads_and_inputs_renders_as_text(console: Console) -> None:
    """`<script>` and an `onerror` image in a task's envelope, a dead letter's message, a job's
    description and a search field show as text; none of them runs."""
    await console.api.start(max_attempts=1)
    task = envelope(datetime.now(UTC) + timedelta(hours=1), data={"note": XSS})
    dead = envelope(None, data={"note": XSS})
    await console.api.publish(TARGET, task)
    await console.api.publish("mq.nowhere.x", dead)

    async def dead_letters() -> list[Any]:
        reply = await console.api.call("GET", "/v1/dead-letters", token=READ)
        got: list[Any] = reply.body["items"]
        return got

    [letter] = await poll(dead_letters, lambda items: len(items) == 1, within=15)
    page = await console.signed_in()
    await page.goto(console.url + f"delayed/{task['id']}")
    await expect(page.get_by_test_id("envelope")).to_contain_text(XSS.replace('"', '\\"'))
    await no_script_ran(page)
    await page.goto(console.url + f"dead-letters/{letter['id']}")
    await expect(page.get_by_test_id("payload")).to_contain_text("<script>window.__xss")
    await no_script_ran(page)
    await page.goto(console.url + "schedules")
    await expect(page.get_by_text("<script>window.__xss = 'description'</script>")).to_be_visible()
    await no_script_ran(page)
    await page.goto(console.url + "delayed?org_id=" + "%3Cscript%3Ewindow.__xss%3D1%3C%2Fscript%3E")
    await expect(page.get_by_label("Org id")).to_have_value("<script>window.__xss=1</script>")
    await no_script_ran(page)
    assert await page.locator("script").count() == 1  # console.js, and nothing else


async def test_a_trigger_form_sent_twice_fires_once(console: Console) -> None:
    """The trigger confirmation's form carries its own Idempotency-Key: the same form sent
    twice (a double click, a resent POST) publishes once, and both answers say `Triggered`
    with the same message id."""
    await console.api.start()
    page = await console.signed_in()
    await page.goto(console.url + "schedules/nightly/trigger")
    form = page.locator("form", has=page.get_by_role("button", name="Trigger nightly now"))
    fields = {}
    for hidden in await form.locator("input[type=hidden]").all():
        fields[str(await hidden.get_attribute("name"))] = str(await hidden.get_attribute("value"))
    sent = []
    for _ in range(2):
        sent.append(await post_form(page, "/ui/schedules/nightly/trigger", fields))
        await page.goto(console.url + "schedules/nightly")
        sent[-1]["flash"] = await page.get_by_role("status").inner_text()
    assert [s["status"] for s in sent] == [0, 0], sent  # opaque redirects: 303 both times
    assert "Triggered nightly" in sent[0]["flash"] and sent[0]["flash"] == sent[1]["flash"]
    msgs = await console.api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.nightly")
    assert len(msgs) == 1, [m.headers["Nats-Msg-Id"] for m in msgs]
