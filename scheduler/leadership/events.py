"""What leadership reports as it happens; `scheduler.metrics.Metrics` listens (metrics are fed
from events: no module of leadership updates an instrument)."""

from __future__ import annotations

from typing import Protocol


class LeadershipEvents(Protocol):
    def took_office(self, epoch: int) -> None:
        """A term began with fencing epoch `epoch`."""
        ...

    def left_office(self) -> None:
        """The term ended, for whatever reason."""
        ...
