"""What the cron engine reports as it happens; `scheduler.metrics.Metrics` listens (metrics are
fed from events: no module of engine/cron updates an instrument)."""

from __future__ import annotations

from typing import Protocol


class CronEvents(Protocol):
    def cron_failed_count(self, count: int) -> None:
        """`count` jobs are stopped by a permanent publish error now (0 when the term ends:
        the next leader reports them)."""
        ...

    def cron_occurrence_skipped(self, reason: str) -> None:
        """An occurrence was not fired (`busy`: a `forbid` job's last message is unacked)."""
        ...

    def cron_occurrence_fired(self, lateness: float) -> None:
        """An occurrence was stored by its target stream `lateness` seconds after it was due."""
        ...

    def cron_publish_failed(self) -> None:
        """An occurrence's publish failed for now: its job backs off."""
        ...

    def cron_backoff_count(self, count: int) -> None:
        """`count` jobs are waiting out a backoff now."""
        ...

    def cron_job_stopped(self, reason: str) -> None:
        """A job was marked failed by a permanent publish error (`too_large`, ...)."""
        ...
