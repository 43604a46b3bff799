"""`POST /v1/schedules/{name}/backfill`, in-process on the twins (tests/support/edge_twins.py;
the backfill's claims are held to PostgreSQL's by tests/contracts/test_backfill_log.py): a past
window's occurrences, each fired once (also by a retry or a later backfill), bounded, refused
for a `forbid` job still holding its last run, and logged in the fire log as manual."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler.bus.memory import MemoryWriter
from scheduler.clock import FakeClock, rfc3339
from scheduler.cron.jobs import Job, load_text
from scheduler.operations.backfill import Backfiller
from scheduler.operations.backlog import WriteBacklog
from tests.support.edge_twins import READ, EdgeOnTwins, Reply, edge_on_twins

# Paused in YAML, so no regular fire joins the backfilled ones (a backfill fires paused jobs,
# as a manual trigger does).
JOBS = """
scheduled_jobs:
  - name: hourly
    subject: mq.scheduled.hourly
    cron: "0 * * * *"
    data: {kind: hourly}
    paused: true
  - name: berlin
    subject: mq.scheduled.berlin
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    data: {}
  - name: minutely
    subject: mq.scheduled.minutely
    cron: "* * * * *"
    paused: true
    data: {}
  - name: single
    subject: mq.scheduled.single
    cron: "0 * * * *"
    concurrency: forbid
    paused: true
    data: {}
  - name: nowhere
    subject: mq.nowhere.job
    cron: "0 * * * *"
    paused: true
    data: {}
  - name: quick
    subject: mq.quick.job
    cron: "0 * * * *"
    paused: true
    data: {}
"""
NAMES = 6


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[EdgeOnTwins]:
    async with edge_on_twins(tmp_path, jobs=JOBS) as harness:
        r = await harness.call("GET", "/v1/schedules", token=READ)
        assert len(r.body["items"]) == NAMES
        yield harness


def _hours_ago(hours: int) -> datetime:
    top = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    return top - timedelta(hours=hours)


async def _fill(
    api: EdgeOnTwins,
    name: str,
    start: datetime,
    end: datetime,
    headers: dict[str, str] | None = None,
    **extra: object,
) -> Reply:
    body = {"from": start.isoformat(), "to": end.isoformat(), **extra}
    path = f"/v1/schedules/{name}/backfill"
    return await api.call("POST", path, json_body=body, headers=headers)


def _manual_rows(api: EdgeOnTwins, name: str) -> list[tuple[datetime, bool, int]]:
    rows = [f for f in api.schedules.fire_log if f["key"] == name and f["manual"]]
    rows.sort(key=lambda f: f["scheduled_for"])
    return [(r["scheduled_for"], r["manual"], r["stream_seq"]) for r in rows]


async def test_each_occurrence_fires_once_with_its_id_and_a_manual_log_row(
    api: EdgeOnTwins,
) -> None:
    """Each occurrence of the window fires once as `<job>@backfill-<occurrence>` with its
    occurrence in `Mq-Scheduled-For` and a manual fire-log row at that occurrence; a retry
    with the key replays, and a second backfill fires none again."""
    start, end = _hours_ago(5), _hours_ago(1)
    key = {"Idempotency-Key": "fill-1"}
    r = await _fill(api, "hourly", start, end, headers=key)
    assert r.status == 200, r
    expected = [start + timedelta(hours=i) for i in range(4)]
    assert (r.body["status"], r.body["occurrences"], r.body["fired"]) == ("backfilled", 4, 4)
    assert [i["status"] for i in r.body["items"]] == ["fired"] * 4
    msgs = await api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.hourly")
    ids = [f"hourly@backfill-{rfc3339(at)}" for at in expected]
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == ids
    assert [m.headers["Mq-Scheduled-For"][:19] for m in msgs] == [
        at.strftime("%Y-%m-%dT%H:%M:%S") for at in expected
    ]
    assert all(m.headers["Mq-Backfill"] == "true" for m in msgs)
    rows = _manual_rows(api, "hourly")
    assert [(at, manual) for at, manual, _ in rows] == [(at, True) for at in expected]
    assert [seq for *_, seq in rows] == [m.seq for m in msgs]
    again = await _fill(api, "hourly", start, end, headers=key)
    assert again.body == r.body
    second = await _fill(api, "hourly", start - timedelta(hours=1), end)
    assert (second.body["fired"], second.body["already_fired"]) == (1, 4), second
    msgs = await api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.hourly")
    assert len(msgs) == 5 and len(_manual_rows(api, "hourly")) == 5


async def test_occurrences_follow_the_jobs_time_zone(api: EdgeOnTwins) -> None:
    """A Berlin 02:30 job backfilled over a spring-forward night fires at 03:00 local (01:00Z)
    that night and at 02:30 local the nights around it, as the daemon's cron code says."""
    start = datetime(2026, 3, 28, tzinfo=UTC)
    r = await _fill(api, "berlin", start, start + timedelta(days=3), dry_run=True)
    assert r.status == 200, r
    got = [i["scheduled_for"] for i in r.body["items"]]
    assert got == [
        "2026-03-28T01:30:00.000000Z",
        "2026-03-29T01:00:00.000000Z",
        "2026-03-30T00:30:00.000000Z",
    ]
    assert r.body["status"] == "planned" and r.body["fired"] == 0
    assert {i["status"] for i in r.body["items"]} == {"planned"}


async def test_window_is_bounded_past_and_ordered(api: EdgeOnTwins) -> None:
    """A window past 1,000 occurrences, reaching the future or empty is refused 422 naming the
    field and the bound; an unknown job is 404."""
    end = _hours_ago(0)
    big = await _fill(api, "minutely", end - timedelta(minutes=1001), end)
    assert (big.status, big.body["code"]) == (422, "too_many_occurrences"), big
    assert "1000" in big.body["detail"] and big.body["errors"][0]["field"] == "to"
    ok = await _fill(api, "minutely", end - timedelta(minutes=1000), end, dry_run=True)
    assert ok.status == 200 and ok.body["occurrences"] == 1000
    future = await _fill(api, "hourly", end, datetime.now(UTC) + timedelta(hours=2))
    assert (future.status, future.body["errors"][0]["field"]) == (422, "to"), future
    backwards = await _fill(api, "hourly", end, end - timedelta(hours=2))
    assert (backwards.status, backwards.body["errors"][0]["field"]) == (422, "from")
    missing = await _fill(api, "nope", end - timedelta(hours=2), end)
    assert missing.status == 404
    reader = await api.call(
        "POST",
        "/v1/schedules/hourly/backfill",
        token=READ,
        json_body={"from": end.isoformat(), "to": end.isoformat()},
    )
    assert reader.status == 403


async def test_forbid_job_is_refused_while_its_previous_run_is_held(api: EdgeOnTwins) -> None:
    """A `concurrency: forbid` job whose subject still holds a message answers 409
    `previous_run_held` and fires nothing; once the stream is empty it backfills."""
    await api.writer.store("mq.scheduled.single", b"{}")
    start, end = _hours_ago(3), _hours_ago(1)
    r = await _fill(api, "single", start, end)
    assert (r.status, r.body["code"]) == (409, "previous_run_held"), r
    api.streams.consume("SCHEDULED", "mq.scheduled.single")  # the stream's purge
    ok = await _fill(api, "single", start, end)
    assert (ok.status, ok.body["fired"]) == (200, 2), ok


def _quick(api: EdgeOnTwins) -> tuple[FakeClock, Job, Backfiller]:
    """A fake clock at 12:00, the `quick` job, and a backfiller on that clock whose target
    stream QUICK keeps Nats-Msg-Ids for 100 ms of it."""
    clock = FakeClock(datetime(2026, 11, 20, 12, 0, tzinfo=UTC))
    api.streams.monotonic = clock.monotonic  # the stream's duplicate window in the fake time
    api.streams.add_stream("QUICK", ["mq.quick.>"], duplicate_window=0.1)
    [job] = [j for j in load_text(JOBS).jobs if j.name == "quick"]
    writer = MemoryWriter(api.streams)
    return clock, job, Backfiller(writer, api.settings, api.backfills, clock, WriteBacklog())


async def test_a_second_backfill_an_hour_later_fires_nothing_again(api: EdgeOnTwins) -> None:
    """With the target stream's duplicate window long gone (100 ms here; an hour later in fake
    time), a second backfill of the same window publishes nothing: the backfill log remembers."""
    clock, job, filler = _quick(api)
    window = filler.window(job, datetime(2026, 11, 20, 6, tzinfo=UTC), clock.now())
    first = await filler.fire(job, window)
    assert (first.status, first.data["fired"]) == ("backfilled", 6)
    clock.advance(3600)
    later = filler.window(job, datetime(2026, 11, 20, 6, tzinfo=UTC), clock.now())
    second = await filler.fire(job, later)
    assert (second.data["fired"], second.data["already_fired"]) == (1, 6)
    msgs = await api.read_stream("QUICK", quiet=0.3)
    assert len(msgs) == 7
    assert len({m.headers["Nats-Msg-Id"] for m in msgs}) == 7


async def test_an_unconfirmed_claim_is_in_flight_then_taken_again_after_a_minute(
    api: EdgeOnTwins,
) -> None:
    """An occurrence another backfill claimed and never confirmed (its publish got no answer,
    or its instance died) is reported `in_flight` and not published; a minute later a backfill
    takes it over and publishes it under the same message id."""
    clock, job, filler = _quick(api)
    store = api.backfills
    window = filler.window(job, datetime(2026, 11, 20, 9, tzinfo=UTC), clock.now())
    stuck = window[1]
    claimed = await store.claim(
        job.name, [stuck], ["x"], "dead-instance", clock.now(), clock.now() - timedelta(hours=1)
    )
    assert claimed == {stuck}
    first = await filler.fire(job, window)
    statuses = {i["scheduled_for"]: i["status"] for i in first.data["items"]}
    assert statuses[stuck] == "in_flight" and first.data["in_flight"] == 1
    assert first.data["fired"] == 2 and first.data["already_fired"] == 0
    clock.advance(61)
    second = await filler.fire(job, window)
    assert (second.data["fired"], second.data["already_fired"]) == (1, 2)
    msgs = await api.read_stream("QUICK", quiet=0.3)
    assert [m.headers["Nats-Msg-Id"] for m in msgs][-1] == f"quick@backfill-{rfc3339(stuck)}"
    assert len(msgs) == 3


async def test_a_refused_publish_gives_the_occurrences_back(api: EdgeOnTwins) -> None:
    """A subject no stream captures answers 409 `no_stream` with nothing fired, and claims
    nothing: once a stream exists, the same backfill fires every occurrence."""
    start, end = _hours_ago(2), _hours_ago(0)
    refused = await _fill(api, "nowhere", start, end)
    assert (refused.status, refused.body["code"], refused.body["fired"]) == (409, "no_stream", 0)
    api.streams.add_stream("NOWHERE", ["mq.nowhere.>"])
    ok = await _fill(api, "nowhere", start, end)
    assert (ok.status, ok.body["fired"], ok.body["already_fired"]) == (200, 2, 0), ok
