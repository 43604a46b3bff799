"""The API document, in-process on the twins (tests/support/edge_twins.py): generated from the
models. The schemathesis run against it stays on a running daemon
(tests/integration/api/test_openapi.py)."""

from __future__ import annotations

from tests.support.edge_twins import EdgeOnTwins


async def test_document_is_generated_from_the_models(api: EdgeOnTwins) -> None:
    """/openapi.json names every route, the bearer scheme, problem responses and the models,
    and declares the optional Idempotency-Key header on every write."""
    doc = (await api.call("GET", "/openapi.json", token=None)).body
    assert doc["info"]["title"] == "mq-scheduler"
    assert set(doc["paths"]) >= {
        "/v1/schedules/{name}/trigger",
        "/v1/delayed/{task_id}",
        "/v1/dead-letters/replay",
        "/v1/dead-letters/{dead_id}/replay",
        "/v1/stats",
        "/v1/stats/history",
        "/v1/stats/health",
    }
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    cancel = doc["paths"]["/v1/delayed/{task_id}"]["delete"]
    assert cancel["operationId"] == "cancel_task"
    assert "application/problem+json" in cancel["responses"]["409"]["content"]
    assert set(doc["components"]["schemas"]["Problem"]["required"]) >= {"code", "detail"}
    writes = [
        (path, method)
        for path, item in doc["paths"].items()
        for method in item
        if method in ("post", "patch", "delete", "put") and path.startswith("/v1/")
    ]
    # pause, resume, trigger, backfill, schedule, cancel, reschedule, 2 replays, resolve
    assert len(writes) == 10, writes
    for path, method in writes:
        params = doc["paths"][path][method]["parameters"]
        [key] = [p for p in params if p["in"] == "header" and p["name"] == "Idempotency-Key"]
        assert key["required"] is False and key["schema"]["maxLength"] == 200, (path, key)
        assert "400" in doc["paths"][path][method]["responses"], path
    reschedule = doc["components"]["schemas"]["Reschedule"]
    assert reschedule["properties"]["delay_until"]["format"] == "date-time"
    assert reschedule["additionalProperties"] is False
