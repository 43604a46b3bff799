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

    def renewed(self, seconds: float) -> None:
        """The lease was renewed; the update took `seconds` from sending to its answer."""
        ...

    def clock_checked(self, skew: float, exceeded: bool) -> None:
        """This host's clock was measured against PostgreSQL's: `skew` seconds ahead of it
        (negative: behind), and whether that is beyond SCHEDULER_MAX_CLOCK_SKEW."""
        ...
