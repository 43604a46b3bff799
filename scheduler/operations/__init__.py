"""What operators and producers can do to the scheduler's state, shared by every front end.

The NATS micro service (`scheduler.api.nats_service`), the HTTP management API (`scheduler.api`)
and so
the operator CLI call these same functions, so they give the same answers with the same race
guarantees. Each change is one PostgreSQL statement or transaction (it works on any instance,
leader or standby); the leader learns of it from PostgreSQL and, to act at once, from a notice
over NATS. Outcomes are plain statuses (`cancelled`, `too_late`, `not_found`, ...): whatever
status the store answers flows through to the caller unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Statuses that mean "done as asked" (an HTTP 200); `not_found` is a 404, anything else a 409.
SUCCESS = frozenset(
    {
        "cancelled",
        "rescheduled",
        "paused",
        "resumed",
        "triggered",
        "replayed",
        "resolved",
        "found",
        "scheduled",
        "backfilled",
        "planned",
    }
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to one operation: a status, the id it is about, and details for the caller."""

    status: str
    id: str
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in SUCCESS

    def as_reply(self) -> dict[str, Any]:
        """The NATS service's reply body: `{"status", "id", ...data}`."""
        reply: dict[str, Any] = {"status": self.status, "id": self.id, **self.data}
        if self.detail:
            reply["detail"] = self.detail
        return reply
