"""What the operations report as they happen; `scheduler.metrics.Metrics` listens (the daemon's
`scheduler.daemon.events.DaemonEvents` includes these)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class OperationsEvents(Protocol):
    def leader_gauges_refreshed(
        self, due: Mapping[tuple[str, str], int], unresolved: int, backlog: int | None
    ) -> None:
        """The leader counted again: tasks `due` per (subject, window), the dead letters
        `unresolved`, and the intake `backlog` (None: unknown, keep the last value). Every
        value is replaced at once (a scrape sees all or none)."""
        ...

    def leader_gauges_cleared(self) -> None:
        """This instance no longer leads: the leader's gauges are zeroed."""
        ...
