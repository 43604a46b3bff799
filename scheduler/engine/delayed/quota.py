"""Per-organisation quotas: how many unfinished tasks each organisation has, kept by the leader.

`SCHEDULER_ORG_MAX_PENDING` (0: off) bounds the tasks an organisation may have pending (pending,
in doubt or claimed). A new task of an organisation already at its quota is refused at intake
with dead-letter reason `quota_exceeded`; the rest of its batch goes on.

The count is an in-memory counter per organisation, so judging a batch costs one dictionary
look-up per task and no SQL. The leader sets it from one `GROUP BY org_id` over the partial
index of unfinished tasks (migration 0009) when it takes office and again every `COUNT_EVERY`
seconds (`LeaderEngine._loader`), adds what intake stores, and subtracts what firing records
as fired, expired or dead. A cancel through the API (possibly on another instance) is not seen
until the next count, so the counter may over-count by the tasks cancelled since: an
organisation is refused early rather than late, for at most `COUNT_EVERY` seconds. A count that
overlaps an intake commit may be off by that batch until the next count.

Tasks without an `org_id` count as one organisation (the unnamed one, `""`).

Metrics have bounded cardinality (`OrgLabels`): the organisations named in `org_shares` and the
first `org_metric_labels` others seen get their own label; every other organisation is `other`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from scheduler.engine.delayed.events import DelayedEvents
from scheduler.records import NewTask
from scheduler.settings import Settings

log = logging.getLogger(__name__)

UNNAMED = ""
OTHER = "other"


def quota_error(org: str, limit: int) -> str:
    """The dead letter's error text: the field, the organisation and the limit."""
    return (
        f"org_id: organisation {org!r} already has {limit} pending tasks, its quota "
        "(SCHEDULER_ORG_MAX_PENDING); retry once some have fired"
    )


class OrgLabels:
    """A bounded set of metric label values for organisations."""

    def __init__(self, named: Iterable[str], limit: int) -> None:
        self._labels: set[str] = set(named)
        self.limit = len(self._labels) + limit

    def __call__(self, org: str) -> str:
        if org in self._labels:
            return org
        if len(self._labels) < self.limit and org != OTHER:
            self._labels.add(org)
            return org
        return OTHER


class OrgLedger:
    """Unfinished tasks per organisation, and the quota they are judged against."""

    def __init__(self, max_pending: int, events: DelayedEvents, labels: OrgLabels) -> None:
        self.max_pending = max_pending
        self._events = events
        self.labels = labels
        self.counts: dict[str, int] = {}

    @classmethod
    def of(cls, settings: Settings, events: DelayedEvents) -> OrgLedger | None:
        """The ledger the settings ask for, or None when quotas are off."""
        if settings.org_max_pending <= 0:
            return None
        labels = OrgLabels(settings.org_shares, settings.org_metric_labels)
        return cls(settings.org_max_pending, events, labels)

    def reset(self, counts: Mapping[str | None, int]) -> None:
        """Replace the counts with a fresh count from the store."""
        fresh: dict[str, int] = {}
        for org, n in counts.items():
            fresh[org or UNNAMED] = fresh.get(org or UNNAMED, 0) + n
        self.counts = fresh
        per_label: dict[str, int] = {}
        for org, n in fresh.items():
            label = self.labels(org)
            per_label[label] = per_label.get(label, 0) + n
        self._events.org_pending_counted(per_label)

    def admit(self, tasks: list[NewTask]) -> tuple[list[NewTask], list[NewTask]]:
        """Split `tasks` into those within their organisation's quota (counted from now on)
        and those over it, in order."""
        counts, limit = self.counts, self.max_pending
        admitted: list[NewTask] = []
        refused: list[NewTask] = []
        for t in tasks:
            org = t.org_id or UNNAMED
            n = counts.get(org, 0)
            if n >= limit:
                refused.append(t)
                continue
            counts[org] = n + 1
            admitted.append(t)
        if refused:
            self._events.quota_refusals(self.labels(t.org_id or UNNAMED) for t in refused)
        self._show({t.org_id or UNNAMED for t in admitted})
        return admitted, refused

    def finished(self, tasks: Iterable[NewTask]) -> None:
        """Tasks admitted but not stored (a resend, a refused row), or fired, expired, dead."""
        counts = self.counts
        touched = set()
        for t in tasks:
            org = t.org_id or UNNAMED
            n = counts.get(org, 0) - 1
            if n > 0:
                counts[org] = n
            else:
                counts.pop(org, None)
            touched.add(org)
        self._show(touched)

    def _show(self, orgs: set[str]) -> None:
        """Update the pending gauge of orgs that have their own label (`other` is updated
        only by the periodic count: summing it per change would cost a pass over all orgs)."""
        counts = self.counts
        shown = {org: counts.get(org, 0) for org in orgs if self.labels(org) != OTHER}
        if shown:
            self._events.org_pending_changed(shown)
