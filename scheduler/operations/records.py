"""What the operator half answers, as records (the read models of `scheduler.operations`).

The operations return these, not dicts: a route, a NATS verb or a test reads fields a type
checker knows, and the HTTP API serves them as they are (its OpenAPI document is generated
from them as from the request bodies in `scheduler.api.models`). This module holds the
overview's (stats, history, health, instances, audit runs) and their base `Record`; tasks,
dead letters, cron jobs and the activity log have a `*_records` module each."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema

from scheduler.clock import to_rfc3339_us

# An instant in an answer: RFC 3339 UTC with six fraction digits and a Z in JSON (HTTP and the
# NATS verbs alike), so every answer's instants have one width and sort as text as in time.
Instant = Annotated[
    datetime,
    PlainSerializer(to_rfc3339_us, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]


class Record(BaseModel):
    """A read model of the operator half: immutable once built (a route, a verb or the
    console's page reads it; none changes it)."""

    model_config = ConfigDict(frozen=True)


class SubjectCount(Record):
    subject: str
    pending: int


class Lateness(Record):
    window_seconds: int
    samples: int
    p50: float | None
    p99: float | None


class LeaseHolder(Record):
    instance: str | None
    epoch: int | None
    since: str | None


class Stats(Record):
    at: Instant
    pending: int
    pending_by_subject: list[SubjectCount]
    due: dict[str, int] = Field(description="pending tasks due within 1m, 5m, 15m, 1h")
    lateness_ms: Lateness
    dead_letters_unresolved: int
    leader: LeaseHolder
    epoch: int
    epoch_taken_by: str | None
    epoch_taken_at: Instant | None
    instance: dict[str, Any] = Field(description="how the answering instance sees itself")


class HistoryLateness(Record):
    p50: float | None
    p99: float | None
    max: float | None


class HistoryBucket(Record):
    start: Instant
    deliveries: int | None = Field(description="null: before `covered_since` (not read)")
    per_minute: float | None
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    abnormal: bool = Field(description="a delivery in it was at least `abnormal_ms` late")
    dead_letters: int | None = Field(description="dead letters that last failed in it (all jobs)")


class LateFire(Record):
    kind: Literal["cron", "delayed"]
    key: str = Field(description="the cron job's name or the delayed task's id")
    subject: str
    scheduled_for: Instant
    fired_at: Instant
    lateness_ms: float
    attempt: int
    epoch: int
    instance: str
    cause: str | None = Field(description="why it was late, when the fire log tells it")


class EpochSeen(Record):
    epoch: int
    instance: str
    first_fired_at: Instant
    last_fired_at: Instant


class History(Record):
    at: Instant = Field(description="when these figures were read (shared for a few seconds)")
    window: Literal["1h", "1d"]
    job: str | None
    since: Instant
    until: Instant
    bucket_seconds: int
    deliveries: int
    truncated: bool = Field(description="more deliveries than one read takes: see covered_since")
    covered_since: Instant | None
    abnormal_ms: float
    lateness_ms: HistoryLateness
    buckets: list[HistoryBucket]
    late: list[LateFire] = Field(
        description="up to 10 deliveries at least abnormal_ms late, the latest first"
    )
    epochs: list[EpochSeen] = Field(description="the epochs that delivered in the window")


class PostgresHealth(Record):
    reachable: bool
    round_trip_ms: float | None
    migrated: bool


class LeaseAge(Record):
    instance: str | None
    epoch: int | None
    since: str | None
    age_seconds: float | None


class PartsHealth(Record):
    at: Instant
    instance: str | None
    role: str | None
    nats: str = Field(description="connected, disconnected or closed")
    postgres: PostgresHealth
    clock_skew_ms: float | None = Field(description="this host's clock minus PostgreSQL's")
    clock_skew_bound_ms: float
    clock_skew_ok: bool | None
    lease: LeaseAge


class Instance(Record):
    instance: str
    role: Literal["leader", "standby"]
    epoch: int | None
    since: Instant | None = Field(description="when it took this role")
    last_seen: Instant = Field(description="its latest heartbeat (every 5 s)")
    stale: bool = Field(description="no heartbeat for 15 s: crashed, or cut off from NATS")


class InstanceList(Record):
    items: list[Instance]


# -- drift audit ---------------------------------------------------------------------------------
class AuditRun(Record):
    run: str = Field(description="the run's folder under SCHEDULER_AUDIT_DIR")
    day: str = Field(description="the day audited: the folder's name, or when it was written")
    written_at: Instant = Field(description="when its summary.json was written")
    has_report: bool


class AuditRuns(Record):
    configured: bool = Field(description="false: SCHEDULER_AUDIT_DIR is not set")
    problem: str | None = Field(description="why the folder cannot be read")
    items: list[AuditRun] = Field(description="newest first")
