"""/docs in a real browser: Swagger UI renders the operations from the daemon's own assets, with
no request leaving the API's origin and no CSP refusal."""

from __future__ import annotations

from urllib.parse import urlsplit

from playwright.async_api import Request

from tests.browser.conftest import Console


async def test_docs_render_the_operations_offline(console: Console) -> None:
    """Every request the page makes goes to the API's own origin; the operations list shows the
    API's routes, and the page logs no script error or CSP refusal (the fixture checks)."""
    await console.api.start()
    origin = urlsplit(console.api.url).netloc
    requests: list[str] = []
    page = await console.page()

    def seen(request: Request) -> None:
        requests.append(request.url)

    page.on("request", seen)
    await page.goto(console.api.url + "/docs")
    operations = page.locator(".opblock")
    await operations.first.wait_for(state="visible")
    assert await operations.count() >= 15
    paths = await page.locator(".opblock-summary-path").all_inner_texts()
    assert any("/v1/delayed/{task_id}" in p for p in paths), paths
    foreign = [u for u in requests if urlsplit(u).scheme != "data" and urlsplit(u).netloc != origin]
    assert not foreign, foreign
    assert any(u.endswith("/openapi.json") for u in requests)
