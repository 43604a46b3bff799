"""What the PostgreSQL store reports as it happens; `scheduler.metrics.Metrics` listens (the
daemon's `scheduler.daemon.events.DaemonEvents` includes these)."""

from __future__ import annotations

from typing import Protocol


class StoreEvents(Protocol):
    def statement_timed(self, op: str, seconds: float) -> None:
        """Operation `op` held a pooled connection for `seconds`, waiting for it included."""
        ...
