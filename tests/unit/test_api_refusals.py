"""Requests the management API refuses before an operation runs, in-process on the twins
(tests/support/edge_twins.py): writes without an admin token configured (and with no token at
all, reads open), bad bodies and queries
naming the field, malformed JSON, wrong methods, and `POST /v1/delayed` refusals that publish
nothing, instants out of range naming the field. Tokens and paging over stored tasks:
tests/unit/test_tokens_and_paging_api.py; probes on the daemon's ports stay on real servers
(tests/integration/api/test_auth_and_errors.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from scheduler.api.gate import QueryGate
from tests.integration.api.harness import TARGET, envelope
from tests.integration.api.test_auth_and_errors import PROBLEM, WRITES
from tests.support.edge_twins import READ, EdgeOnTwins, edge_on_twins


async def test_without_an_admin_token_every_write_is_refused_naming_the_variable(
    tmp_path: Path,
) -> None:
    """With only a read token configured, writes answer 403 naming SCHEDULER_ADMIN_TOKEN."""
    async with edge_on_twins(tmp_path, admin_token=None) as api:
        await _refused_without_admin(api)


async def _refused_without_admin(api: EdgeOnTwins) -> None:
    for method, path in WRITES:
        for token in (READ, None, "anything"):
            r = await api.call(method, path, token=token, json_body={})
            assert r.status == 403, (method, path, r)
            assert r.body["code"] == "writes_disabled"
            assert "set SCHEDULER_ADMIN_TOKEN" in r.body["detail"]
    assert (await api.call("GET", "/v1/schedules", token=READ)).status == 200


async def test_with_no_token_configured_reads_are_open(tmp_path: Path) -> None:
    """No token configured at all: reads need none (loopback default); writes stay refused."""
    async with edge_on_twins(tmp_path, admin_token=None, read_token=None) as api:
        await _reads_open(api)


async def _reads_open(api: EdgeOnTwins) -> None:
    assert (await api.call("GET", "/v1/schedules", token=None)).status == 200
    assert (await api.call("GET", "/v1/stats", token="whatever")).status == 200
    r = await api.call("POST", "/v1/schedules/nightly/pause", token=None)
    assert r.status == 403 and r.body["code"] == "writes_disabled"


@pytest.mark.parametrize(
    ("body", "status", "field", "words"),
    [
        ({"delay_until": "2030-01-01T00:00:00"}, 422, "body.delay_until", "timezone"),
        ({"delay_until": "tomorrow"}, 422, "body.delay_until", "RFC 3339"),
        ({"delay_until": 1700000000}, 422, "body.delay_until", "RFC 3339"),
        ({}, 422, "body.delay_until", "Field required"),
        ({"delay_until": "2030-01-01T00:00:00Z", "x": 1}, 422, "body.x", "Extra inputs"),
        ({"delay_until": "2999-01-01T00:00:00Z"}, 422, "delay_until", "SCHEDULER_MAX_DELAY"),
    ],
)
async def test_bad_bodies_name_the_field(
    api: EdgeOnTwins, body: dict[str, Any], status: int, field: str, words: str
) -> None:
    """A bad reschedule body answers 422 with the field and the problem in `errors`."""
    r = await api.call("PATCH", "/v1/delayed/any-task", json_body=body)
    assert r.status == status, r
    assert r.headers["Content-Type"] == PROBLEM
    assert any(e["field"] == field and words in e["message"] for e in r.body["errors"]), r.body
    assert field.split(".")[-1] in r.body["detail"]


async def test_malformed_json_and_bad_queries(api: EdgeOnTwins) -> None:
    """Unparseable JSON is 400 `bad_json`; bad query values are 422 naming the parameter."""
    r = await api.call("PATCH", "/v1/delayed/any-task", data=b'{"delay_until": ')
    assert r.status == 400 and r.body["code"] == "bad_json"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"limit": 0}, "query.limit"),
        ({"limit": 501}, "query.limit"),
        ({"due_before": "2030-01-01T00:00:00"}, "query.due_before"),
        ({"status": "Pending!"}, "query.status"),
    ]
    for params, field in cases:
        r = await api.call("GET", "/v1/delayed", params=params)
        assert r.status == 422, (params, r)
        assert [e["field"] for e in r.body["errors"]] == [field]
    r = await api.call("GET", "/v1/delayed", params={"due_after": "0.5"})
    assert r.status == 422 and "RFC 3339" in r.body["detail"]
    assert (await api.call("GET", "/v1/dead-letters/not-a-uuid")).status == 404
    r = await api.call("PATCH", "/v1/dead-letters/replay", json_body={"resolved": True})
    assert r.status == 405 and r.headers["Allow"] == "POST"
    r = await api.call("PUT", "/v1/delayed/some-task")
    assert r.status == 405 and r.headers["Allow"] == "DELETE, GET, PATCH"
    r = await api.call("GET", "/v1/schedules/Not_Kebab")
    assert r.status == 422 and r.body["errors"][0]["field"] == "path.name"


async def test_invalid_requests_are_refused_naming_the_field(api: EdgeOnTwins) -> None:
    """Each bad request is refused before anything is published, with a code and the field:
    no due time, both, a refused target, another organisation's target, data over the size
    limit, an envelope without its target, and a body that is no object."""
    big = "x" * (api.writer.max_payload - 2000)  # under the body limit, over the envelope limit
    cases = [
        ({"subject": TARGET}, None, 422, "validation", "body"),
        (
            {"subject": TARGET, "in": "1s", "at": "2030-01-01T00:00:00Z"},
            None,
            422,
            "validation",
            "body",
        ),
        ({"subject": TARGET, "in": "1 s"}, None, 422, "validation", "body.in"),
        ({"subject": "mq.delay.tasks.x", "in": "1s"}, None, 422, "target_refused", "subject"),
        (
            {"subject": "mq.org.a.jobs", "in": "1s", "org_id": "b"},
            None,
            422,
            "org_mismatch",
            "org_id",
        ),
        ({"subject": TARGET, "in": "1s", "data": {"b": big}}, None, 422, "too_large", "payload"),
        ({"subject": TARGET, "in": "1s", "colour": 1}, None, 422, "validation", "body.colour"),
        (envelope(None), None, 422, "validation", "query.subject"),
        ({"subject": TARGET, "in": "1s"}, "mq.tasks.other", 422, "validation", "query.subject"),
        ({"subject": TARGET, "in": "500d"}, None, 422, "too_far", "delay_until"),
        ([1, 2], None, 422, "validation", "body"),
    ]
    for body, subject, status, code, field in cases:
        params = {"subject": subject} if subject else None
        r = await api.call("POST", "/v1/delayed", json_body=body, params=params)
        assert (r.status, r.body["code"]) == (status, code), (body, r)
        assert r.body["errors"][0]["field"] == field, (body, r.body)
    bad = await api.call("POST", "/v1/delayed", data=b"{nope")
    assert (bad.status, bad.body["code"]) == (400, "bad_json")
    read = await api.call("POST", "/v1/delayed", token=READ, json_body={"subject": TARGET})
    assert read.status == 403
    assert await api.read_stream("MQ_DELAY") == []


OUT_OF_RANGE = "0001-01-01T00:00:00+00:01"  # astimezone(UTC) overflows: OverflowError before


async def test_instants_outside_the_envelope_range_answer_422_naming_the_field(
    api: EdgeOnTwins,
) -> None:
    """Year-1 and year-9999 instants in a filter, the short form's `at`, a reschedule, a
    backfill's `from` or the activity log's `since` answer 422 naming the field, never 500."""
    for param in ("due_after", "due_before"):
        for value in (OUT_OF_RANGE, "9999-12-31T23:59:59-01:00"):
            r = await api.call("GET", "/v1/delayed", token=READ, params={param: value})
            assert r.status == 422 and param in r.body["detail"], (param, value, r)
    r = await api.call("GET", "/v1/activity", token=READ, params={"since": OUT_OF_RANGE})
    assert r.status == 422 and "since" in r.body["detail"], r
    short = {"subject": TARGET, "at": OUT_OF_RANGE, "data": {}}
    r = await api.call("POST", "/v1/delayed", json_body=short)
    assert r.status == 422 and "at" in r.body["errors"][0]["field"], r
    r = await api.call(
        "PATCH",
        "/v1/delayed/t_x",
        json_body={"delay_until": OUT_OF_RANGE},
        params={"target": TARGET},
    )
    assert r.status == 422 and "delay_until" in r.body["detail"], r
    now = datetime.now(UTC).isoformat()
    r = await api.call(
        "POST", "/v1/schedules/nightly/backfill", json_body={"from": OUT_OF_RANGE, "to": now}
    )
    assert r.status == 422 and "from" in r.body["detail"], r


async def test_refusals_are_answered_before_routing(api: EdgeOnTwins) -> None:
    """A read without a token, and a read while every admission slot is taken, are answered
    (401 with its challenge, 503 with Retry-After) by the edge before any route runs: they
    are counted under no route (`unmatched`); `/v1/leader` needs neither token nor slot."""
    registry = api.metrics.registry
    r = await api.call("GET", "/v1/delayed", token=None)
    assert r.status == 401 and "SCHEDULER_READ_TOKEN" in r.body["detail"], r
    assert r.headers["WWW-Authenticate"].startswith("Bearer"), r.headers
    app: Any = api.app
    gate: QueryGate = app.state.query_gate
    gate.admitted = gate.limit  # as if every slot were held by a running request
    try:
        r = await api.call("GET", "/v1/delayed", token=READ)
        assert r.status == 503 and r.body["code"] == "overloaded", r
        assert r.headers["Retry-After"] == "1"
        assert (await api.call("GET", "/v1/leader", token=None)).status == 200
    finally:
        gate.admitted = 0
    for status in ("401", "503"):
        labels = {"route": "unmatched", "method": "GET", "status": status}
        assert registry.get_sample_value("mq_scheduler_api_requests_total", labels) == 1, status
