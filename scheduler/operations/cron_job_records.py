"""What the operator half answers about cron jobs, as records (`scheduler.operations.cron_jobs`;
the HTTP API serves them as they are)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from scheduler.operations.records import Instant, Record


class ScheduleSummary(Record):
    name: str
    subject: str
    cron: str
    timezone: str
    description: str
    active: bool = Field(description="false once the job was removed from YAML")
    paused: bool = Field(description="paused in YAML or by an operator")
    paused_in_yaml: bool
    paused_at: Instant | None = Field(description="when an operator paused it")
    paused_by: str | None = Field(description="who paused it: token kind and address")
    pause_note: str | None = Field(default=None, description="why, as the operator wrote it")
    failed: bool = Field(
        description="stopped by a permanent publish error (failed_error says why); fires again "
        "once its definition changes or an operator resumes it"
    )
    failed_at: Instant | None = Field(description="when the leader stopped it")
    failed_reason: str | None = Field(description="the error's code, e.g. too_large")
    failed_error: str | None = Field(description="the error, naming the YAML field at fault")
    file: str | None
    line: int | None
    last_scheduled_for: Instant | None = Field(description="the occurrence last handled")
    last_fired_at: Instant | None
    skipped: int


class Occurrence(Record):
    scheduled_for: Instant
    fire_at: Instant = Field(description="the occurrence plus its fixed jitter")


class Fire(Record):
    scheduled_for: Instant
    fired_at: Instant
    lateness_ms: float
    attempt: int
    epoch: int
    instance: str
    stream: str | None
    stream_seq: int | None
    manual: bool


class ScheduleDetail(ScheduleSummary):
    definition: dict[str, Any] = Field(description="the job as synced from YAML")
    next: list[Occurrence] = Field(description="the next 10 occurrences")
    fires: list[Fire] = Field(description="the last 20 deliveries, newest first")


class ScheduleProblem(Record):
    file: str
    line: int | None
    job: str | None = Field(description="the job the problem is in, when known")
    message: str


class SchedulePage(Record):
    items: list[ScheduleSummary]
    next_cursor: str | None
    problems: list[ScheduleProblem] = Field(
        description="errors in the schedules YAML as this instance reads it now; the jobs they "
        "name are not loaded (a job that was valid before stops firing)"
    )
