"""What the management API reports as it happens; `scheduler.metrics.Metrics` listens (the
daemon's `scheduler.daemon.events.DaemonEvents` includes these)."""

from __future__ import annotations

from typing import Protocol


class ApiEvents(Protocol):
    def request_served(self, route: str, method: str, status: int) -> None:
        """A request was answered: `route` is the route's template (or `unmatched`), `method`
        one of the API's methods (or `other`), so the label count stays bounded."""
        ...

    def action_unrecorded(self) -> None:
        """An operator action was done and answered but the activity log could not record it."""
        ...
