"""Browser tests of the console: Debian's headless Chromium, driven by Playwright for Python,
against a daemon on real NATS and PostgreSQL (the suite's session servers).

Chromium is installed by `tests.support.tools` (scripts/test runs it); Playwright drives
`/usr/bin/chromium` through `executable_path` and never downloads a browser. One browser serves
the whole session; each test gets fresh contexts (no cookies carried over). Every page a test
visits can be photographed at 1,280 and 390 px wide into `tests/browser/screenshots/`
(git-ignored) for a person to look at.

These tests run on the current servers only (`[current]`, tests/conftest.py's COMPAT_RUN): the
console is a client of the management API; nothing the browser sees depends on the NATS or
PostgreSQL version, and each browser test costs seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.async_api import Browser, BrowserContext, ConsoleMessage, Page, async_playwright

from scheduler.settings import Settings
from tests.integration.api.harness import ADMIN, ApiHarness, running_api
from tests.support import tools

SHOTS = Path(__file__).with_name("screenshots")
WIDTHS = (1280, 390)
HEIGHT = {1280: 900, 390: 844}
# As the machine notes say: headless as root needs --no-sandbox; the rest keep Chromium off a
# network it cannot reach (background updates, sync, QUIC probes).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
TIMEOUT_MS = 10_000
JOBS = """
scheduled_jobs:
  - name: every-second
    subject: mq.scheduled.tick
    cron: "* * * * * *"
    description: ticks every second
    data: {kind: tick}
  - name: nightly
    subject: mq.scheduled.nightly
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    description: "the nightly run <script>window.__xss = 'description'</script>"
    data: {kind: night}
  - name: frozen
    subject: mq.scheduled.frozen
    cron: "0 * * * *"
    paused: true
    data: {}
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "browser" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
async def chromium() -> AsyncIterator[Browser]:
    executable = tools.chromium()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(executable), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class Console:
    """A daemon with tokens and cron jobs, its console's URL, and browser pages onto it."""

    api: ApiHarness
    browser: Browser
    contexts: list[BrowserContext] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.api.url + "/ui/"

    async def page(self, width: int = 1280) -> Page:
        """A new browser (no cookies) at `width` px; script errors and CSP refusals are kept
        (the fixture fails the test on any)."""
        context = await self.browser.new_context(
            viewport={"width": width, "height": HEIGHT.get(width, 900)}
        )
        context.set_default_timeout(TIMEOUT_MS)
        self.contexts.append(context)
        page = await context.new_page()
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        return page

    def _console(self, message: ConsoleMessage) -> None:
        # A refused request (a 4xx the test provoked) is logged too; CSP refusals and script
        # errors are what must never happen.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.errors.append(f"console: {message.text}")

    async def signed_in(self, token: str = ADMIN, width: int = 1280) -> Page:
        page = await self.page(width)
        await page.goto(self.url)
        await sign_in(page, token)
        return page

    async def close(self) -> None:
        for context in self.contexts:
            await context.close()


async def sign_in(page: Page, token: str) -> None:
    """Fill the sign-in form the console redirected to and submit it."""
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_load_state()


async def shot(page: Page, name: str) -> Path:
    """A full-page screenshot named after the page and the viewport width."""
    SHOTS.mkdir(exist_ok=True)
    width = page.viewport_size["width"] if page.viewport_size else 0
    path = SHOTS / f"{name}-{width}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
async def console(settings: Settings, chromium: Browser) -> AsyncIterator[Console]:
    """Not started: `await console.api.start(**overrides)` (admin and read tokens set)."""
    async with running_api(settings, JOBS) as harness:
        console = Console(harness, chromium)
        try:
            yield console
        finally:
            await console.close()
    assert not console.errors, console.errors


async def tab_to(page: Page, name: str, presses: int = 60) -> None:
    """Move the focus with Tab until the control named `name` has it (keyboard use)."""
    for _ in range(presses):
        await page.keyboard.press("Tab")
        focused = await page.evaluate(
            "() => (document.activeElement && document.activeElement.innerText) || ''"
        )
        if " ".join(focused.split()) == name:
            return
    raise AssertionError(f"{page.url}: Tab never reached {name!r}")
