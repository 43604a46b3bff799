"""`/v1/stats/history` through the management API, in-process on the twins
(tests/support/edge_twins.py): the fire log charted per bucket with lateness, the causes of
abnormal fires, one cron job's window, and the refusals. Fire-log rows go where the engine
writes them, the engine twin's log (`EdgeOnTwins.tasks.fire_log`; a cron job's in
`EdgeOnTwins.schedules.fire_log`); the health report (NATS, the lease, PostgreSQL's round trip)
and the plans of the history statements stay on real servers
(tests/integration/api/test_history_api.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.clock import to_rfc3339_us
from scheduler.operations.history import bucket_start
from tests.integration.api.harness import envelope, poll
from tests.support.edge_twins import READ, EdgeOnTwins


def log_fire(
    api: EdgeOnTwins,
    key: str,
    due: datetime,
    late_ms: float,
    epoch: int,
    instance: str,
    attempt: int = 1,
    kind: str = "delayed",
    manual: bool = False,
) -> None:
    fired = due + timedelta(milliseconds=late_ms)
    row = {"kind": kind, "key": key, "subject": "mq.tasks.work", "scheduled_for": due}
    row |= {"fired_at": fired, "attempt": attempt, "epoch": epoch, "instance": instance}
    row |= {"stream": None, "stream_seq": None, "manual": manual}
    (api.tasks.fire_log if kind == "delayed" else api.schedules.fire_log).append(row)


async def dead_letter(api: EdgeOnTwins, target: str, doc: dict[str, Any]) -> None:
    """`doc` published for a target no task may have, dead-lettered as the intake does."""
    raw = json.dumps(doc).encode()
    row = {"original_id": doc["id"], "key": f"DELAY:{doc['id']}", "subject": f"mq.delay.{target}"}
    row |= {"error": f"target {target!r} is not allowed", "reason": "target_refused"}
    row |= {"target": target, "raw": raw, "raw_size": len(raw), "headers": {}}
    await api.tasks.record_bad_intake([row])


async def history(api: EdgeOnTwins, **params: Any) -> dict[str, Any]:
    reply = await api.call("GET", "/v1/stats/history", token=READ, params=params)
    assert reply.status == 200, reply
    return dict(reply.body)


async def test_history_buckets_lateness_and_names_the_cause_of_abnormal_fires(
    api: EdgeOnTwins,
) -> None:
    """An hour's history has 60 one-minute buckets; a 7,341 ms fire delivered by a new epoch
    after the old one's last delivery is marked abnormal with a leader-change cause, a third
    attempt with a retry cause; a manual fire is left out; dead letters count in their bucket."""
    now = datetime.now(UTC)
    due = bucket_start(now - timedelta(minutes=30), timedelta(minutes=1))
    log_fire(api, "t-old", due - timedelta(minutes=10), 4, 900, "old-leader")
    log_fire(api, "t-gap", due, 7341, 901, "new-leader")
    log_fire(api, "t-retry", due + timedelta(minutes=5), 2500, 901, "new-leader", 3)
    log_fire(api, "t-hand", due, 60_000, 901, "new-leader", manual=True)
    log_fire(api, "t-day", now - timedelta(hours=3), 2, 900, "old-leader")
    await dead_letter(api, "mq.nowhere.x", envelope(None))  # a dead letter, now

    async def dead() -> int:
        unresolved: int = (await api.call("GET", "/v1/stats", token=READ)).body[
            "dead_letters_unresolved"
        ]
        return unresolved

    await poll(dead, lambda n: n == 1)  # before the first read: an answer is kept for 10 s
    h = await history(api)
    assert len(h["buckets"]) == 60 and h["bucket_seconds"] == 60
    assert h["buckets"][-1]["dead_letters"] == 1
    late = {f["key"]: f for f in h["late"]}
    assert set(late) == {"t-gap", "t-retry"}, "a manual fire or an on-time one was listed"
    assert late["t-gap"]["lateness_ms"] == 7341
    assert (
        "leader change" in late["t-gap"]["cause"]
        and "epoch 900 (old-leader)" in (late["t-gap"]["cause"])
    )
    assert late["t-retry"]["cause"].startswith("retried: delivered at attempt 3")
    gap = next(b for b in h["buckets"] if b["start"] == to_rfc3339_us(due))
    assert gap["abnormal"] and gap["max_ms"] == 7341 and gap["deliveries"] == 1
    assert {e["epoch"] for e in h["epochs"]} >= {900, 901}
    day = await history(api, window="1d")
    assert len(day["buckets"]) == 24 and day["bucket_seconds"] == 3600
    assert day["deliveries"] >= h["deliveries"] + 1, "the 3-hour-old fire is in the day only"


async def test_history_of_one_job_reads_only_its_fires(api: EdgeOnTwins) -> None:
    """With `job`, only that cron job's deliveries count, and dead letters are not charted."""
    due = datetime.now(UTC) - timedelta(minutes=20)
    log_fire(api, "nightly", due, 1500, 900, "old-leader", kind="cron")
    log_fire(api, "t-other", due, 9000, 900, "old-leader")
    h = await history(api, job="nightly")
    assert h["job"] == "nightly" and h["deliveries"] == 1
    assert [f["key"] for f in h["late"]] == ["nightly"]
    assert all(b["dead_letters"] is None for b in h["buckets"])


async def test_history_refuses_an_unknown_window_or_a_bad_job_name(api: EdgeOnTwins) -> None:
    """A window other than 1h or 1d, or a job name outside the pattern, is refused 422."""
    for params in ({"window": "2h"}, {"job": "Not A Job"}, {"job": "x" * 101}):
        reply = await api.call("GET", "/v1/stats/history", token=READ, params=params)
        assert reply.status == 422, (params, reply)
    assert (await api.call("GET", "/v1/stats/history", token=None)).status == 401
