"""Tokens, problem details and paging of the management API, in-process on the twins
(tests/support/edge_twins.py): who may read and write, unknown names as 404 problems, and pages
chained by opaque cursors over stored tasks (stored as the intake stores them). Probes on the
daemon's ports and the API before NATS is connected stay on real servers
(tests/integration/api/test_auth_and_errors.py)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

from tests.integration.api.harness import TARGET, envelope, poll
from tests.integration.api.test_auth_and_errors import PROBLEM, READS, WRITES
from tests.support.edge_twins import ADMIN, READ, EdgeOnTwins


async def test_reads_need_a_known_token_and_writes_the_admin_one(api: EdgeOnTwins) -> None:
    """No token or an unknown one: 401 with a challenge; the read token reads but gets 403 on
    every write; the admin token does both."""
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


async def test_unknown_names_are_404_problems(api: EdgeOnTwins) -> None:
    """Unknown jobs, tasks and dead letters answer 404 problem details naming what is missing."""
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


async def test_paging_bounds_and_opaque_cursors(api: EdgeOnTwins) -> None:
    """Pages of `limit` chain through every task exactly once in firing order; a cursor of
    another list or an edited one is refused with 400 naming `cursor`."""
    due = datetime.now(UTC) + timedelta(hours=1)
    docs = [envelope(due + timedelta(seconds=i)) for i in range(7)]
    for doc in docs:
        await api.store_task(TARGET, doc)

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
