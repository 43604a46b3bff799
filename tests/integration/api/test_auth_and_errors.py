"""The management API's probes and its answers before NATS is connected, against a running
daemon. Tokens, problem details and paging run on the twins
(tests/unit/test_tokens_and_paging_api.py), and so do the refusals that need no stored state
(tests/unit/test_api_refusals.py)."""

from __future__ import annotations

import asyncio

import aiohttp

from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from tests.integration.api.harness import READ, ApiHarness
from tests.support.helpers import wait_until

PROBLEM = "application/problem+json"
READS = ["/v1/schedules", "/v1/schedules/nightly", "/v1/delayed", "/v1/dead-letters", "/v1/stats"]
WRITES = [
    ("POST", "/v1/schedules/nightly/pause"),
    ("POST", "/v1/schedules/nightly/resume"),
    ("POST", "/v1/schedules/nightly/trigger"),
    ("DELETE", "/v1/delayed/some-task"),
    ("POST", "/v1/dead-letters/replay"),
    ("POST", f"/v1/dead-letters/{'0' * 8}-0000-0000-0000-{'0' * 12}/replay"),
]


async def test_probes_metrics_and_the_document_need_no_token(api: ApiHarness) -> None:
    """Health, readiness, leader, /openapi.json, /docs and /metrics answer without a token."""
    daemon = await api.start()
    for path in ("/healthz", "/readyz", "/v1/leader", "/openapi.json", "/docs"):
        assert (await api.call("GET", path, token=None)).status == 200, path
    assert daemon.endpoints.metrics is not None
    async with api.http.get(daemon.endpoints.metrics.url + "/metrics") as resp:
        assert resp.status == 200
        assert "mq_scheduler_api_requests_total" in await resp.text()


async def test_management_calls_answer_503_until_the_daemon_is_connected(
    settings: Settings,
) -> None:
    """While NATS is unreachable the API is up: /healthz is 200, /readyz and every management
    call answer 503 problems, so a load balancer or script retries elsewhere."""
    daemon = Daemon(settings.with_overrides(nats_url="nats://127.0.0.1:1", read_token=READ))
    task = asyncio.create_task(daemon.run())
    try:
        await wait_until(lambda: daemon.endpoints.api is not None, within=10)
        assert daemon.endpoints.api is not None
        url = daemon.endpoints.api.url
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as resp:
                assert resp.status == 200
            async with http.get(url + "/readyz") as resp:
                assert resp.status == 503 and (await resp.json())["nats"] == "disconnected"
            auth = {"Authorization": f"Bearer {READ}"}
            async with http.get(url + "/v1/stats", headers=auth) as resp:
                assert resp.status == 503
                assert resp.headers["Content-Type"] == PROBLEM
                assert (await resp.json(content_type=None))["code"] == "unavailable"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_open_reads_off_loopback_are_a_readiness_warning(api: ApiHarness) -> None:
    """Bound beyond loopback with no token at all, the daemon warns in /readyz and the log."""
    await api.start(http_host="0.0.0.0", admin_token=None, read_token=None)
    ready = await api.call("GET", "/readyz", token=None)
    assert ready.status == 200
    assert any("no SCHEDULER_READ_TOKEN" in w for w in ready.body["warnings"])
