"""What delayed delivery reports as it happens; `scheduler.metrics.Metrics` listens (metrics are
fed from events: no module of `engine.delayed` nor `engine.leader_loop` updates an instrument).

The firing path reports once per batch (a claim step, a hand-over to the publisher, a flush of
the books), never once per task. Organisation labels arrive already bounded
(`engine.delayed.quota.OrgLabels`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from scheduler.records import Fired


class DelayedEvents(Protocol):
    # -- intake ---------------------------------------------------------------------------------

    def intake_committed(self, accepted: int, duplicates: int, cancelled: int) -> None:
        """An intake batch was committed: `accepted` new tasks stored, `duplicates` exact
        resends of stored tasks, `cancelled` stored cancelled (a cancel came first)."""
        ...

    def intake_refused(self, reasons: Iterable[str]) -> None:
        """Lane messages refused and dead-lettered, one reason each (`unparseable`,
        `quota_exceeded`, `duplicate_id`, ...)."""
        ...

    def dead_letter_unstored(self, org: str, reason: str) -> None:
        """An intake refusal kept out of `dead_letters`: its organisation's (or subject's)
        budget was spent (`org`: a bounded label, `""` for none)."""
        ...

    def dead_letter_copy_failed(self, reason: str) -> None:
        """A dead-letter copy the DLQ stream did not take: dropped for want of room, or never
        acknowledged (the table row is kept)."""
        ...

    # -- quotas ---------------------------------------------------------------------------------

    def quota_refusals(self, orgs: Iterable[str]) -> None:
        """New tasks refused at their organisation's quota, one bounded label each."""
        ...

    def org_pending_counted(self, counts: Mapping[str, int]) -> None:
        """A fresh count of unfinished tasks per bounded organisation label, replacing all."""
        ...

    def org_pending_changed(self, counts: Mapping[str, int]) -> None:
        """The unfinished tasks of some organisations that have their own label, now."""
        ...

    # -- the horizon and the loader -------------------------------------------------------------

    def horizon_sized(self, tasks: int) -> None:
        """The horizon's heap holds `tasks` tasks (0: the term ended)."""
        ...

    def pending_counted(self, tasks: int) -> None:
        """The store holds `tasks` delayed tasks waiting to fire."""
        ...

    def duplicate_window_checked(self, stream: str, short: bool) -> None:
        """A target stream's duplicate window was checked: `short` of the failover span or not."""
        ...

    # -- dispatch and books ---------------------------------------------------------------------

    def tasks_dispatched(self, now_ms: int, due: Mapping[int, int]) -> None:
        """Armed tasks were taken at `now_ms` to be published (or expired, or refused their
        target): how many were due at each millisecond."""
        ...

    def tasks_fired(self, fired: Sequence[Fired]) -> None:
        """Deliveries JetStream acknowledged, recorded as fired."""
        ...

    def tasks_expired(self, count: int) -> None:
        """Tasks that expired undelivered."""
        ...

    def publishes_retried(self, count: int, in_doubt: int) -> None:
        """Failed publishes to be retried later, `in_doubt` of them sent but unacknowledged."""
        ...

    def tasks_dead(self, reasons: Iterable[str]) -> None:
        """Tasks dead-lettered after their last attempt, one reason each."""
        ...
