"""What the NATS connection reports as it happens; `scheduler.metrics.Metrics` listens (metrics
are fed from events: no module of bus/ updates an instrument)."""

from __future__ import annotations

from typing import Protocol


class BusEvents(Protocol):
    def nats_link(self, up: bool) -> None:
        """The connection is up (connected or reconnected) or down."""
        ...

    def nats_disconnected(self) -> None:
        """The connection dropped unexpectedly (not our own close or drain)."""
        ...

    def nats_stale_link(self) -> None:
        """The link stopped answering and was closed to reconnect to another node (link.py)."""
        ...

    def nats_reconnected(self) -> None:
        """The client reconnected after a drop."""
        ...
