"""What the management API reports as it happens; `scheduler.metrics.Metrics` listens (the
daemon's `scheduler.daemon.events.DaemonEvents` includes these)."""

from __future__ import annotations

from typing import Protocol


class ApiEvents(Protocol):
    def action_unrecorded(self) -> None:
        """An operator action was done and answered but the activity log could not record it."""
        ...
