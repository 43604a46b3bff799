"""Every console page at 1,280 and 390 px: labelled controls, reachable by keyboard, no
sideways scrolling, photographed; the drift page and its sandboxed report; the YAML banner."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from playwright.async_api import Page, expect

from tests.browser.conftest import WIDTHS, Console, shot, tab_to
from tests.integration.api.harness import READ, TARGET, envelope, poll

# Problems a page may not have: a control without an accessible name, sideways scrolling, more
# or fewer than one h1, a missing document language.
AUDIT_JS = """() => {
  const problems = [];
  const named = (e) => (e.labels && e.labels.length > 0) || e.getAttribute("aria-label")
      || e.getAttribute("aria-labelledby");
  for (const e of document.querySelectorAll("input:not([type=hidden]), select, textarea")) {
    if (!named(e)) problems.push("unlabelled " + e.outerHTML.slice(0, 80));
  }
  for (const e of document.querySelectorAll("button, a[href]")) {
    const name = (e.getAttribute("aria-label") || e.textContent || "").trim();
    if (!name) problems.push("nameless " + e.outerHTML.slice(0, 80));
  }
  if (document.documentElement.scrollWidth > window.innerWidth + 1) {
    problems.push("scrolls sideways: " + document.documentElement.scrollWidth + "px");
  }
  if (document.querySelectorAll("h1").length !== 1) problems.push("not exactly one h1");
  if (!document.documentElement.lang) problems.push("no lang");
  return problems;
}"""
SUMMARY = {
    "date": "2026-11-21",
    "slo": {
        "lateness_p99_ms": 1000,
        "late_ms": 1000,
        "ok": False,
        "breaches": ["nightly"],
        "reasons": {"nightly": ["1 missed"]},
    },
    "schedules": {
        "nightly": {"expected": 1, "fired": 0, "missed": 1, "doubled": 0, "early": 0, "late": 0,
                    "lateness_ms": {"p50": None, "p99": None, "max": None}},
        "every-second": {"expected": 86400, "fired": 86400, "missed": 0, "doubled": 0, "early": 0,
                         "late": 3, "lateness_ms": {"p50": 2, "p95": 5, "p99": 9, "max": 1200}},
    },
    "subjects": {
        "mq.scheduled.tick": {"fired": 86400, "early": 0, "late": 3,
                              "lateness_ms": {"p50": 2, "p95": 5, "p99": 9, "max": 1200}},
    },
}  # fmt: skip
REPORT = (
    "<!doctype html><html><head><title>Drift audit 2026-11-21</title></head><body>"
    "<h1 id='h'>Drift audit 2026-11-21</h1>"
    "<script>document.getElementById('h').textContent = 'script ran'</script></body></html>"
)


def write_run(root: Path, name: str, summary: dict[str, Any], report: str | None) -> None:
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    if report is not None:
        (run / "report.html").write_text(report)


def audit_dir(tmp_path: Path) -> Path:
    """Two runs (the older one met its SLO) and a link that points outside the folder."""
    root = tmp_path / "audit"
    write_run(root, "2026-11-20", {**SUMMARY, "date": "2026-11-20", "slo": {"ok": True}}, None)
    write_run(root, "2026-11-21", SUMMARY, REPORT)
    write_run(tmp_path, "outside", {**SUMMARY, "date": "2099-01-01"}, "<p>secret</p>")
    os.symlink(tmp_path / "outside", root / "2099-01-01")
    return root


async def audit(page: Page) -> None:
    problems = await page.evaluate(AUDIT_JS)
    assert not problems, f"{page.url}: {problems}"


async def test_every_page_is_labelled_keyboard_usable_and_fits_both_widths(
    console: Console, tmp_path: Path
) -> None:
    """At 1,280 and at 390 px every page (with data on it) names each control, has one h1,
    never scrolls sideways, lets Tab reach its first action, and is photographed."""
    await console.api.start(max_attempts=1, audit_dir=audit_dir(tmp_path))
    task = envelope(datetime.now(UTC) + timedelta(hours=2), org_id="org-1")
    await console.api.publish(TARGET, task)
    await console.api.publish("mq.nowhere.x", envelope(None))

    async def dead() -> list[Any]:
        reply = await console.api.call("GET", "/v1/dead-letters", token=READ)
        got: list[Any] = reply.body["items"]
        return got

    [letter] = await poll(dead, lambda items: len(items) == 1, within=15)
    pages = {
        "overview": ("", "Pause auto-refresh"),
        "schedules": ("schedules", "Pause every-second"),
        "schedule": ("schedules/nightly", "Pause nightly"),
        "delayed": ("delayed?status=pending", "Search"),
        "task": (f"delayed/{task['id']}", "Cancel task…"),
        "dead-letters": ("dead-letters", "Filter"),
        "dead-letter": (f"dead-letters/{letter['id']}", "Replay…"),
        "drift": ("drift", "Show"),
    }
    for width in WIDTHS:
        page = await console.signed_in(width=width)
        for name, (path, action) in pages.items():
            await page.goto(console.url + path)
            await audit(page)
            await tab_to(page, action)
            await shot(page, name)
        await page.get_by_role("button", name="Sign out").click()
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        await audit(page)
        await shot(page, "sign-in")


async def test_drift_shows_the_latest_audit_and_its_report_in_a_sandbox(
    console: Console, tmp_path: Path
) -> None:
    """The drift page shows the latest run's verdict, breaches and tables, lists older runs;
    its report opens without running the report's script; names outside the folder (a link
    pointing out, a path with ..) are never served."""
    root = audit_dir(tmp_path)
    await console.api.start(audit_dir=root)
    page = await console.signed_in()
    await page.get_by_role("link", name="Drift").click()
    verdict = page.get_by_role("region", name="2026-11-21: SLO breached")
    await expect(verdict).to_contain_text("nightly: 1 missed")
    await expect(page.get_by_role("row").filter(has_text="every-second")).to_contain_text("86,400")
    await page.get_by_label("Audit run").select_option("2026-11-20")
    await page.get_by_role("button", name="Show").click()
    await expect(page.get_by_role("region", name="2026-11-20: SLO met")).to_be_visible()
    options = await page.get_by_label("Audit run").locator("option").all_inner_texts()
    assert options == ["2026-11-21", "2026-11-20"]  # the link pointing outside is not a run

    await page.goto(console.url + "drift")
    await page.get_by_role("link", name="Open the full report").click()
    await expect(page.get_by_role("heading", name="Drift audit 2026-11-21")).to_be_visible()
    response = await page.request.get(page.url)
    assert "sandbox" in response.headers["content-security-policy"]
    blocked = [e for e in console.errors if "Blocked script execution" in e and "sandboxed" in e]
    assert blocked, console.errors  # the browser refused the report's script, as it should
    console.errors.remove(blocked[0])
    for path in ("drift/2099-01-01/report.html", "drift/..%2Foutside/report.html"):
        response = await page.request.get(console.url + path)
        assert response.status == 404 and "secret" not in await response.text(), path
    assert (await console.api.call("GET", "/v1/audits/2099-01-01")).status == 404


async def test_yaml_error_shows_as_a_banner_with_file_line_and_job(console: Console) -> None:
    """A broken job in a schedules file shows on the schedules page and the overview as a
    banner naming the file, the line and the job."""
    broken = Path(console.api.settings.schedules_dir) / "broken.yaml"
    broken.write_text(
        "scheduled_jobs:\n"
        "  - name: report-weekly\n"
        "    subject: mq.scheduled.report\n"
        '    cron: "61 * * * *"\n'
        "    data: {}\n"
    )
    await console.api.start()
    page = await console.signed_in()
    for path in ("schedules", ""):
        await page.goto(console.url + path)
        banner = page.get_by_role("alert").filter(has_text="error in the schedules YAML")
        await expect(banner).to_contain_text(f"{broken}:4")
        await expect(banner).to_contain_text("value out of range 0-59")
        await expect(banner).to_contain_text("job report-weekly")
    await shot(page, "yaml-banner")
