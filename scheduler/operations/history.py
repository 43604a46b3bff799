"""History and health for operators: `GET /v1/stats/history` and `GET /v1/stats/health`.

History: lateness p50/p99/max, deliveries per minute and dead letters per bucket over the last
hour (60 one-minute buckets) or day (24 one-hour buckets), for all deliveries or one cron job,
from the fire log (`scheduler.store.postgres.history`: bounded reads on the API's pool). Each
answer is
read once and shared by every caller for `MAX_AGE` seconds (at most `KEPT` windows kept), so
many open consoles cost one read per window every few seconds.

A delivery at least `ABNORMAL_MS` late is *abnormal*: its bucket is marked and the worst are
listed with their cause when the fire log tells it (`cause`): a retry (attempt > 1), or a
change of leader (the epoch that delivered it took office, or first delivered, after it was
due, while an earlier epoch had delivered in the window).

Health: the answering instance's NATS connection, whether PostgreSQL answers on the API's pool
(with the round trip), this host's clock against PostgreSQL's, and the lease holder with the
age of its tenure.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.clock import Clock
from scheduler.operations.records import (
    EpochSeen,
    History,
    HistoryBucket,
    HistoryLateness,
    LateFire,
    LeaseAge,
    PartsHealth,
    PostgresHealth,
)
from scheduler.operations.shared import SharedRead
from scheduler.operations.stores import DatabaseTime, FireHistory, Statistics, Window

# window -> (span, bucket)
WINDOWS = {
    "1h": (timedelta(hours=1), timedelta(minutes=1)),
    "1d": (timedelta(days=1), timedelta(hours=1)),
}
CAP = 100_000  # deliveries (and dead letters) read at most per answer
ABNORMAL_MS = 1000.0
MAX_AGE = 10.0
KEPT = 64
PING_TIMEOUT = 2.0
PING_MAX_AGE = 2.0


def bucket_start(now: datetime, bucket: timedelta) -> datetime:
    """The start of the bucket holding `now` (buckets aligned to whole minutes or hours)."""
    step = int(bucket.total_seconds())
    seconds = int(now.timestamp()) // step * step
    return datetime.fromtimestamp(seconds, UTC)


def window_of(name: str, now: datetime, job: str | None = None) -> Window:
    """The window `name` ending with the bucket holding `now`."""
    span, bucket = WINDOWS[name]
    since = bucket_start(now, bucket) + bucket - span
    return Window(since, now, bucket, CAP, ABNORMAL_MS, job)


def cause(fire: dict[str, Any], epochs: list[dict[str, Any]], office: dict[str, Any]) -> str | None:
    """Why a delivery was late, when the fire log tells it; None when it does not."""
    due = _at(fire["scheduled_for"])
    if fire["attempt"] > 1:
        return f"retried: delivered at attempt {fire['attempt']} (earlier publishes failed)"
    took = _at(office.get("since")) if office.get("epoch") == fire["epoch"] else None
    if took is not None and took > due:
        return (
            f"leader change: epoch {fire['epoch']} ({fire['instance']}) took office at "
            f"{_shown(took)}, after this was due"
        )
    mine = next((e for e in epochs if e["epoch"] == fire["epoch"]), None)
    before = [e for e in epochs if e["epoch"] < fire["epoch"]]
    if mine is not None and before and _at(mine["first_at"]) >= due:
        last = max(before, key=lambda e: e["epoch"])
        return (
            f"leader change: epoch {last['epoch']} ({last['instance']}) delivered last at "
            f"{_shown(_at(last['last_at']))}, epoch {fire['epoch']} ({fire['instance']}) "
            f"first at {_shown(_at(mine['first_at']))}"
        )
    return None


def _shown(at: datetime) -> str:
    """`2026-11-26 14:08:00.003 UTC`: an instant as an operator reads it in a sentence."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _at(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


Doc = dict[str, Any]


def shape(name: str, window: Window, read: Doc, office: Doc, at: datetime) -> History:
    """The answer of `/v1/stats/history` from one read at `at`: every bucket (empty ones too)."""
    count = int(WINDOWS[name][0] / window.bucket)
    truncated = read["deliveries"] >= window.cap
    covered = read["oldest"] if truncated else window.since
    return History(
        at=at,
        window=name,  # one of WINDOWS: window_of accepted it
        job=window.job,
        since=window.since,
        until=window.until,
        bucket_seconds=int(window.bucket.total_seconds()),
        deliveries=read["deliveries"],
        truncated=truncated,
        covered_since=covered,
        abnormal_ms=window.abnormal_ms,
        lateness_ms=HistoryLateness(p50=read["p50"], p99=read["p99"], max=read["max"]),
        buckets=_buckets(window, count, read, covered),
        late=[_late(f, read["epochs"], office) for f in read["worst"]],
        epochs=[_epoch(e) for e in read["epochs"]],
    )


def _epoch(e: Doc) -> EpochSeen:
    return EpochSeen(
        epoch=e["epoch"],
        instance=e["instance"],
        first_fired_at=e["first_at"],
        last_fired_at=e["last_at"],
    )


def _buckets(
    window: Window, count: int, read: Doc, covered: datetime | None
) -> list[HistoryBucket]:
    found = {b["i"]: b for b in read["buckets"]}
    dead = read["dead"]
    minutes = window.bucket.total_seconds() / 60
    shown = []
    for i in range(count):
        start = window.since + i * window.bucket
        b = found.get(i)
        q = (b or {}).get("q") or [None, None]
        known = covered is None or start + window.bucket > covered
        n = b["n"] if b else (0 if known else None)
        shown.append(HistoryBucket(
            start=start,
            deliveries=n,
            per_minute=None if n is None else round(n / minutes, 3),
            p50_ms=q[0],
            p99_ms=q[1],
            max_ms=b["mx"] if b else None,
            abnormal=bool(b and b["mx"] >= window.abnormal_ms),
            dead_letters=None if dead is None else dead.get(i, 0),
        ))  # fmt: skip
    return shown


def _late(fire: Doc, epochs: list[Doc], office: Doc) -> LateFire:
    return LateFire(
        kind=fire["kind"],
        key=fire["key"],
        subject=fire["subject"],
        scheduled_for=fire["scheduled_for"],
        fired_at=fire["fired_at"],
        lateness_ms=fire["late_ms"],
        attempt=fire["attempt"],
        epoch=fire["epoch"],
        instance=fire["instance"],
        cause=cause(fire, epochs, office),
    )


class HistoryReads:
    """History answers, each window read once per `MAX_AGE` seconds for every caller."""

    def __init__(self, store: FireHistory, overview: Statistics, clock: Clock) -> None:
        self.store = store
        self.overview = overview
        self.clock = clock
        self._kept: OrderedDict[tuple[str, str | None], SharedRead[History]] = OrderedDict()

    async def read(self, name: str, job: str | None = None) -> History:
        key = (name, job)
        shared = self._kept.pop(key, None) or SharedRead(self.clock, MAX_AGE)
        self._kept[key] = shared  # most recently used last; the oldest leaves beyond KEPT
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)

        async def fresh() -> History:
            now = self.clock.now()
            window = window_of(name, now, job)
            read = await self.store.read(window)
            office = await self.overview.leadership()
            return shape(name, window, read, office, now)

        return await shared.get(fresh)


@dataclass(frozen=True, slots=True)
class Ping:
    """PostgreSQL's answer to the API's pool: round trip and this host's clock minus its."""

    reachable: bool
    round_trip_ms: float | None = None
    skew_ms: float | None = None


class HealthCheck:
    """Asks PostgreSQL for its clock on the API's pool, at most once per `PING_MAX_AGE`."""

    def __init__(self, database_time: DatabaseTime, clock: Clock) -> None:
        self.database_time = database_time
        self.clock = clock
        self.shared: SharedRead[Ping] = SharedRead(clock, PING_MAX_AGE)

    async def ping(self) -> Ping:
        return await self.shared.get(self._ping)

    async def _ping(self) -> Ping:
        try:
            async with asyncio.timeout(PING_TIMEOUT):
                sent, theirs, back = await self.database_time()
        except (OSError, TimeoutError):  # unreachable is the answer here, not an error
            return Ping(False)
        trip = (back - sent).total_seconds()
        skew = (sent - theirs).total_seconds() + trip / 2
        return Ping(True, round(trip * 1000, 3), round(skew * 1000, 3))


def health(
    ready: dict[str, Any], leader: dict[str, Any], ping: Ping, bound_ms: float, now: datetime
) -> PartsHealth:
    """The answer of `/v1/stats/health` from what the instance and PostgreSQL said."""
    since = leader.get("since")
    age = (now - _at(since)).total_seconds() if since else None
    skew_ok = None if ping.skew_ms is None or bound_ms <= 0 else abs(ping.skew_ms) <= bound_ms
    return PartsHealth(
        at=now,
        instance=ready.get("instance"),
        role=ready.get("role"),
        nats=ready.get("nats", "disconnected"),
        postgres=PostgresHealth(
            reachable=ping.reachable,
            round_trip_ms=ping.round_trip_ms,
            migrated=ready.get("postgres") == "migrated",
        ),
        clock_skew_ms=ping.skew_ms,
        clock_skew_bound_ms=bound_ms,
        clock_skew_ok=skew_ok,
        lease=LeaseAge(
            instance=leader.get("instance"),
            epoch=leader.get("epoch"),
            since=since,
            age_seconds=None if age is None else round(age, 3),
        ),
    )
