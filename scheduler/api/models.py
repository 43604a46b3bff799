"""The management API's request bodies and the answers of its writes: the handlers validate
with these, and the OpenAPI document at `/openapi.json` is generated from them and from the
read models the operations return (`scheduler.operations.*records`), never written by hand."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from scheduler.messages.envelope import bounded_instant
from scheduler.operations.records import Instant as Answered  # an instant in an answer

TASK_ID = r"^[\x21-\x7e]{1,200}$"  # the envelope's id rule: printable ASCII, no spaces
JOB_NAME = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"
SUBJECT = r"^[\x21-\x7e]{1,255}$"
WORD = r"^[a-z][a-z0-9_]{0,63}$"
Stage = Literal["intake", "firing", "replay"]
# What `GET /v1/delayed?status=` accepts (a task's status in every answer is one of these).
TASK_STATUSES = ("pending", "in_doubt", "claimed", "fired", "cancelled", "expired", "dead")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _rfc3339_text(value: Any) -> Any:
    """Times are RFC 3339 text; pydantic would also take a number as a Unix time."""
    if isinstance(value, str) and _RFC3339.match(value):
        return value
    if isinstance(value, datetime):
        return value
    raise ValueError("must be an RFC 3339 date-time with an offset, e.g. 2026-11-22T06:00:00Z")


def _bounded(value: datetime) -> datetime:
    """The instant in UTC if it lies where an envelope's may (1970 to 9000,
    `scheduler.messages.envelope.bounded_instant`): a year-1 or year-9999 time is a 422 naming
    the field, never an OverflowError further on."""
    return bounded_instant(value)


# An aware instant given as RFC 3339 text (query parameters and bodies), in the envelope's range.
Instant = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text), AfterValidator(_bounded)]


class Body(BaseModel):
    """A request body: unknown fields are errors, so a typo is reported, never ignored."""

    model_config = ConfigDict(extra="forbid")


# -- health ------------------------------------------------------------------------------------
class Health(BaseModel):
    alive: bool


class Readiness(BaseModel):
    model_config = ConfigDict(extra="allow")

    ready: bool
    state: str
    role: str
    epoch: int | None
    instance: str
    nats: str
    postgres: str
    warnings: list[str]


class PartitionOwner(BaseModel):
    """One partition as its lease in the leader bucket says."""

    partition: int
    owner: str | None = Field(
        description="the instance id of the engine holding the partition's lease; null: nobody "
        "holds it; `unknown`: the lease value is not one an engine writes"
    )
    epoch: int | None = Field(
        description="the fencing epoch the holder wrote into the lease (null until its first "
        "renew in a term, and for `unknown`)"
    )
    since: str | None = Field(
        description="RFC 3339 UTC: the start of the holder's term over it, as written in the lease"
    )


class EngineShare(BaseModel):
    """One engine's share of the partitions."""

    instance: str = Field(description="the engine's instance id, or `unknown`")
    count: int
    partitions: list[int]


class LeaderView(BaseModel):
    """Who leads as the lease says (P = 1; nulls while nobody does, and always under P > 1),
    the partition map, and how this instance sees itself."""

    model_config = ConfigDict(populate_by_name=True)

    instance: str | None = Field(description="the leader's instance id (P = 1); null under P > 1")
    epoch: int | None = Field(description="the leader's fencing epoch (P = 1); null under P > 1")
    since: str | None = Field(description="the leader's term start (P = 1); null under P > 1")
    self_: dict[str, Any] = Field(alias="self", serialization_alias="self")
    partitions: int = Field(description="the deployment's partition count P")
    map: list[PartitionOwner] = Field(description="every partition, in order, with its owner")
    engines: list[EngineShare] = Field(description="each owner's partitions, by instance id")
    unowned: list[int] = Field(description="the partitions whose lease nobody holds")
    map_readable: bool = Field(
        description="false when the lease bucket could not be read: every owner then shows "
        "null, which is not known"
    )


# -- delayed tasks (the answers: scheduler.operations.task_records) ----------------------------
class Reschedule(Body):
    delay_until: Instant = Field(description="the new due time, RFC 3339 with an offset")


class TaskOutcome(BaseModel):
    id: str
    status: str = Field(description="cancelled or rescheduled")
    due_at: str | None = None


# -- cron jobs (the answers: scheduler.operations.cron_job_records) ----------------------------
NOTE_LENGTH = 500


class PauseRequest(Body):
    note: str | None = Field(
        default=None,
        max_length=NOTE_LENGTH,
        description=f"why it is paused, shown with the job until it is resumed (1..{NOTE_LENGTH} "
        "printable characters, no control characters)",
    )

    @field_validator("note")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or not value.isprintable()):
            raise ValueError("must be printable text, not blank, without control characters")
        return value


class ScheduleOutcome(BaseModel):
    name: str
    status: str = Field(description="paused or resumed")


class TriggerOutcome(BaseModel):
    name: str
    status: Literal["triggered"]
    msg_id: str = Field(
        description="the delivery's Nats-Msg-Id: <job>@manual-<instant>, or "
        "<job>@manual-key-<digest> under an Idempotency-Key"
    )
    subject: str
    stream: str
    seq: int
    fired_at: str
    fire_log: Literal["written", "pending"] = Field(
        description="the fire-log row: written, or pending (PostgreSQL was unreachable after "
        "the publish was acknowledged; the daemon writes it once PostgreSQL answers)"
    )


# -- dead letters (the answers: scheduler.operations.dead_letter_records) ----------------------
class Resolve(Body):
    resolved: StrictBool = Field(default=True, description="false opens it again")


class ReplayOutcome(BaseModel):
    id: str
    status: str = Field(description="replayed, or why not: already_replayed, target_refused, ...")
    task_id: str | None = None
    via: Literal["firing", "intake"] | None = Field(
        default=None, description="back to pending (firing) or through the delay lane (intake)"
    )
    detail: str | None = None


class ReplayBatch(Body):
    reason: str | None = Field(default=None, pattern=WORD)
    subject: str | None = Field(default=None, pattern=SUBJECT)
    stage: Stage | None = None
    limit: int = Field(default=100, ge=1, le=1000, description="at most this many")


class ReplayBatchResult(BaseModel):
    replayed: int
    refused: int
    results: list[ReplayOutcome]


# -- drift audit -------------------------------------------------------------------------------
class AuditSummary(BaseModel):
    run: str
    has_report: bool
    summary: dict[str, Any] = Field(description="the run's summary.json (docs/drift-audit.md)")


# -- authoring: a delayed task over HTTP, a backfill of a cron job ------------------------------
DURATION = r"^(?:\d{1,9}(?:\.\d{1,6})?(?:ms|s|m|h|d|w))+$"  # scheduler.durations, bounded


class DelayedShort(Body):
    """The short form of `POST /v1/delayed`: the daemon writes the `hanzo.mq.v1` envelope
    (`schema`, `id`, `type`, `source: scheduler-api`, `timestamp`, `priority`, `org_id`,
    `delay_until`, `data`). Exactly one of `at` and `in`."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)

    subject: str = Field(
        pattern=SUBJECT, description="the target subject the task is delivered to: mq.tasks.work"
    )
    at: Instant | None = Field(
        default=None, strict=False, description="due time, RFC 3339 with an offset"
    )
    in_: str | None = Field(
        default=None,
        alias="in",
        max_length=64,
        pattern=DURATION,
        description="due in this long from now: 90s, 5m, 1h30m, 2d (500ms..SCHEDULER_MAX_DELAY)",
    )
    data: dict[str, Any] = Field(
        default_factory=dict,
        description="the task's data (a JSON object); the whole envelope must fit the NATS "
        "server's max_payload minus 4 KiB",
    )
    org_id: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^[^\x00]+$")
    id: str | None = Field(
        default=None,
        pattern=TASK_ID,
        description="the envelope id (default: a new one, derived from the Idempotency-Key "
        "when one is sent, so a retry makes the same task)",
    )
    type: str | None = Field(
        default=None,
        max_length=200,
        pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$",
        description="the envelope's type (default `delayed`)",
    )
    priority: int = Field(default=5, ge=1, le=10, description="1 (highest) .. 10")

    @model_validator(mode="after")
    def _one_time(self) -> DelayedShort:
        if (self.at is None) == (self.in_ is None):
            raise ValueError("give exactly one of `at` (RFC 3339) and `in` (a duration)")
        return self


class BackfillWindow(Body):
    """`[from, to)`: its occurrences (the daemon's cron code, in the job's time zone), each
    fired once; at most 1,000 of them."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)

    from_: Instant = Field(alias="from", description="first instant (inclusive), RFC 3339")
    to: Instant = Field(description="end (exclusive), RFC 3339; not in the future")
    dry_run: StrictBool = Field(
        default=False, description="count the occurrences and fire none (the console's preview)"
    )


class BackfillItem(BaseModel):
    scheduled_for: Answered
    msg_id: str = Field(description="the delivery's Nats-Msg-Id: <job>@backfill-<occurrence>")
    status: Literal["fired", "already_fired", "in_flight", "planned"] = Field(
        description="fired now; fired by an earlier backfill; being published by another "
        "backfill (or its publish got no answer less than a minute ago); planned (dry_run)"
    )
    stream: str | None = None
    seq: int | None = None


class BackfillOutcome(BaseModel):
    name: str
    status: Literal["backfilled", "planned"] = Field(
        description="backfilled, or planned (dry_run: nothing fired)"
    )
    occurrences: int = Field(description="occurrences in the window")
    fired: int = Field(description="published by this request")
    already_fired: int = Field(description="fired by an earlier backfill: not published again")
    in_flight: int = Field(
        default=0, description="claimed by another backfill still publishing: not published"
    )
    items: list[BackfillItem]
