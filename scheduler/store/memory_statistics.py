"""The in-memory twin of the operator half's statistics (`scheduler.operations.stores.Statistics`).

It reads the engine's twins as `scheduler.store.postgres.overview`'s statements read their
tables: pending tasks not claimed (`MemoryTaskStore.rows`) per subject and per forecast window
(overdue ones in every window), the lateness of the deliveries in the fire logs since an
instant (manual ones left out; p50 and p99 interpolated as `percentile_cont`), and the epoch
with who took it and when. tests/contracts/test_statistics.py holds the two to the same
answers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from scheduler.operations.stores import WINDOWS
from scheduler.store.memory import MemoryTaskStore, Row

MS = timedelta(milliseconds=1)


class MemoryStatistics:
    def __init__(
        self, tasks: MemoryTaskStore, cron_logs: Sequence[list[dict[str, Any]]] = ()
    ) -> None:
        self.tasks = tasks
        self.cron_logs = cron_logs  # cron fire logs beside the tasks' (the engine's, manual rows)

    async def forecast(self, now: datetime) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for row in self._pending():
            due = row.task.due_at
            if due <= now + WINDOWS[-1][1]:
                counts = found.setdefault(row.task.target, [0] * len(WINDOWS))
                for i, (_, span) in enumerate(WINDOWS):
                    counts[i] += due <= now + span
        return found

    async def pending_by_subject(self, top: int) -> tuple[int, list[tuple[str, int]]]:
        counts = Counter(row.task.target for row in self._pending())
        ranked = sorted(counts.items(), key=lambda c: (-c[1], c[0]))
        return sum(counts.values()), ranked[:top]

    async def lateness(self, since: datetime) -> tuple[int, float | None, float | None]:
        logs = [self.tasks.fire_log, *self.cron_logs]
        late = sorted(
            max((f["fired_at"] - f["scheduled_for"]) / MS, 0.0)
            for log in logs
            for f in log
            if f["fired_at"] >= since and not f.get("manual", False)
        )
        if not late:
            return 0, None, None
        return len(late), percentile_cont(late, 0.5), percentile_cont(late, 0.99)

    async def leadership(self) -> dict[str, Any]:
        instance, since = self.tasks.office
        return {"epoch": self.tasks.epoch, "instance": instance, "since": since}

    def _pending(self) -> list[Row]:
        return [row for row in self.tasks.rows.values() if row.status == "pending"]


def percentile_cont(ordered: Sequence[float], fraction: float) -> float:
    """PostgreSQL's `percentile_cont` over `ordered` (sorted, not empty): linear between the
    two values around `fraction` of the way."""
    at = fraction * (len(ordered) - 1)
    low, high = math.floor(at), math.ceil(at)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)
