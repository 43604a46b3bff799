"""Tokens, problem details and paging of the management API, against a running daemon. The
refusals that need no stored state run on the twins: tests/unit/test_api_refusals.py."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta

import aiohttp

from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from tests.integration.api.harness import ADMIN, READ, TARGET, ApiHarness, envelope, poll
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


async def test_reads_need_a_known_token_and_writes_the_admin_one(api: ApiHarness) -> None:
    """No token or an unknown one: 401 with a challenge; the read token reads but gets 403 on
    every write; the admin token does both."""
    await api.start()
    for path in READS:
        for token in (None, "wrong-token"):
            r = await api.call("GET", path, token=token)
            assert r.status == 401, (path, token, r)
            assert r.headers["Content-Type"] == PROBLEM
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert r.body["code"] == "unauthorized"
            assert "SCHEDULER_READ_TOKEN" in r.body["detail"]
        assert (await api.call("GET", path, token=READ)).status == 200, path
        assert (await api.call("GET", path, token=ADMIN)).status == 200, path
    for method, path in WRITES:
        r = await api.call(method, path, token=READ, json_body={} if "replay" in path else None)
        assert r.status == 403, (method, path, r)
        assert r.body["code"] == "forbidden"
        assert "SCHEDULER_ADMIN_TOKEN" in r.body["detail"]
        r = await api.call(method, path, token=None)
        assert r.status == 401, (method, path, r)
        assert "SCHEDULER_ADMIN_TOKEN" in r.body["detail"]


async def test_probes_metrics_and_the_document_need_no_token(api: ApiHarness) -> None:
    """Health, readiness, leader, /openapi.json, /docs and /metrics answer without a token."""
    daemon = await api.start()
    for path in ("/healthz", "/readyz", "/v1/leader", "/openapi.json", "/docs"):
        assert (await api.call("GET", path, token=None)).status == 200, path
    assert daemon.endpoints.metrics is not None
    async with api.http.get(daemon.endpoints.metrics.url + "/metrics") as resp:
        assert resp.status == 200
        assert "mq_scheduler_api_requests_total" in await resp.text()


async def test_unknown_names_are_404_problems(api: ApiHarness) -> None:
    """Unknown jobs, tasks and dead letters answer 404 problem details naming what is missing."""
    await api.start()
    missing = "00000000-0000-0000-0000-000000000001"
    for method, path in [
        ("GET", "/v1/schedules/no-such-job"),
        ("POST", "/v1/schedules/no-such-job/pause"),
        ("POST", "/v1/schedules/no-such-job/resume"),
        ("POST", "/v1/schedules/no-such-job/trigger"),
        ("GET", "/v1/delayed/no-such-task"),
        ("DELETE", "/v1/delayed/no-such-task"),
        ("GET", f"/v1/dead-letters/{missing}"),
        ("POST", f"/v1/dead-letters/{missing}/replay"),
        ("GET", "/v1/nothing-here"),
    ]:
        r = await api.call(method, path)
        assert r.status == 404, (method, path, r)
        assert r.headers["Content-Type"] == PROBLEM
        assert r.body["status"] == 404 and r.body["code"] == "not_found"
    r = await api.call("PATCH", "/v1/delayed/no-such-task", json_body={"delay_until": _soon()})
    assert r.status == 404 and "no-such-task" in r.body["detail"]
    r = await api.call("PATCH", f"/v1/dead-letters/{missing}", json_body={"resolved": True})
    assert r.status == 404 and missing in r.body["detail"]


def _soon() -> str:
    return (datetime.now(UTC) + timedelta(minutes=5)).isoformat()


async def test_paging_bounds_and_opaque_cursors(api: ApiHarness) -> None:
    """Pages of `limit` chain through every task exactly once in firing order; a cursor of
    another list or an edited one is refused with 400 naming `cursor`."""
    await api.start()
    due = datetime.now(UTC) + timedelta(hours=1)
    docs = [envelope(due + timedelta(seconds=i)) for i in range(7)]
    for doc in docs:
        await api.publish(TARGET, doc)

    async def stored() -> int:
        r = await api.call("GET", "/v1/delayed", params={"status": "pending", "limit": 500})
        return len(r.body["items"])

    await poll(stored, lambda n: n == 7)
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 3, "status": "pending", **({"cursor": cursor} if cursor else {})}
        r = await api.call("GET", "/v1/delayed", params=params)
        assert r.status == 200 and len(r.body["items"]) <= 3
        seen += [t["id"] for t in r.body["items"]]
        pages += 1
        cursor = r.body["next_cursor"]
        if cursor is None:
            break
    assert seen == [d["id"] for d in docs] and pages == 3
    first = await api.call("GET", "/v1/delayed", params={"limit": 1})
    foreign = first.body["next_cursor"]
    r = await api.call("GET", "/v1/dead-letters", params={"cursor": foreign})
    assert r.status == 400 and r.body["code"] == "bad_cursor" and "cursor" in r.body["detail"]
    edited = base64.urlsafe_b64encode(json.dumps(["delayed", "x", 1, 2]).encode()).decode()
    r = await api.call("GET", "/v1/delayed", params={"cursor": edited.rstrip("=")})
    assert r.status == 400 and r.body["code"] == "bad_cursor"


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
