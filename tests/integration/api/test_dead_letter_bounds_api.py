"""A dead letter stored cut to SCHEDULER_DEAD_LETTER_PAYLOAD_CAP through the API and console
(issue 25, item 7): what it shows, and a replay refused precisely."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from tests.integration.api.harness import READ, ApiHarness, envelope, poll

CAP = 1024


async def test_a_cut_refusal_shows_its_size_and_refuses_replay(api: ApiHarness) -> None:
    """A 20 KiB refusal kept to its first 1 KiB shows `raw_size`, `raw_truncated` and the kept
    bytes, no payload document; its replay answers 409 `payload_truncated` naming the DLQ
    subject that holds the whole message; a refusal under the cap replays as before."""
    await api.start(dead_letter_payload_cap=CAP)
    due = datetime.now(UTC) + timedelta(hours=1)
    big = envelope(due, org_id="globex", data={"pad": "x" * 20_000})
    await api.publish("mq.org.acme.jobs", json.dumps(big).encode())  # org_mismatch
    await api.js.publish("mq.delay.tasks.work", b"{not json")

    async def listed() -> list[dict[str, Any]]:
        r = await api.call("GET", "/v1/dead-letters", token=READ)
        return list(r.body["items"])

    items = await poll(listed, lambda items: len(items) >= 2, within=10)
    cut = next(i for i in items if i["reason"] == "org_mismatch")
    whole = next(i for i in items if i["reason"] == "unparseable")
    raw = json.dumps(big).encode()
    assert cut["raw_truncated"] and cut["raw_size"] == len(raw)
    assert not whole["raw_truncated"] and whole["raw_size"] == len(b"{not json")

    shown = (await api.call("GET", f"/v1/dead-letters/{cut['id']}", token=READ)).body
    assert shown["payload"] is None and base64.b64decode(shown["raw_base64"]) == raw[:CAP]
    r = await api.call("POST", f"/v1/dead-letters/{cut['id']}/replay")
    assert r.status == 409 and r.body["code"] == "payload_truncated", r
    assert f"first {CAP} of the message's {len(raw)} bytes" in r.body["detail"]
    assert "subject mq.dlq.org.acme.jobs" in r.body["detail"]

    shown = (await api.call("GET", f"/v1/dead-letters/{whole['id']}", token=READ)).body
    assert shown["payload"] == {"_raw_base64": base64.b64encode(b"{not json").decode()}
    r = await api.call("POST", f"/v1/dead-letters/{whole['id']}/replay")
    assert r.status == 409 and r.body["code"] == "still_invalid", r


async def test_stats_count_reads_one_row(api: ApiHarness, database_url: str) -> None:
    """`/v1/stats` answers the unresolved count from `dead_letter_counts` (one row kept by
    triggers), and PostgreSQL's plan for the housekeeping's prune reads `dead_letters_age`."""
    await api.start()
    await api.js.publish("mq.delay.tasks.work", b"{not json")

    async def unresolved() -> int:
        r = await api.call("GET", "/v1/stats", token=READ)
        return int(r.body["dead_letters_unresolved"])

    assert await poll(unresolved, lambda n: n == 1, within=10) == 1
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("UPDATE dead_letter_counts SET unresolved = 41")  # not a count(*)
        assert await poll(unresolved, lambda n: n == 41) == 41
        await conn.execute("SET enable_seqscan = off")  # the plan a big table gets
        plan = await conn.fetchval(
            "EXPLAIN (FORMAT JSON) SELECT id FROM dead_letters WHERE last_failed < now() "
            "ORDER BY last_failed, id LIMIT 5000 FOR UPDATE SKIP LOCKED"
        )
    finally:
        await conn.close()
    assert '"Index Name": "dead_letters_age"' in plan
