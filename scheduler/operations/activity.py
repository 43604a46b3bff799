"""The activity log for operators: what was done through the management API, by whom, when,
to what, and with which answer (`scheduler.api.activity` records; this module bounds, lists
and prunes).

Every text is bounded before it is stored: `who`, `target` and the Idempotency-Key to 200
characters, and the `detail` to `DETAIL_KEYS` scalar fields of at most `DETAIL_TEXT`
characters each (nested values are left out: a task's `data` is a payload, never logged), so
a row stays under ~10 KB whatever a request carried.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from scheduler.clock import Clock
from scheduler.operations.activity_records import ActivityEntry
from scheduler.operations.paging import SEQ, TIME, Page, decode, from_us, page, us
from scheduler.operations.stores import Activity, ActivityFilter, ActivityLog

CURSOR = "activity"
TEXT = 200
DETAIL_KEYS = 16
DETAIL_TEXT = 500
# Fields of a request body never copied into the log: payloads and headers are the
# producer's data, not the operator's action.
HIDDEN = frozenset({"data", "payload", "headers", "envelope", "payload_base64", "raw"})
PRUNE_BATCH = 5000
PRUNE_BATCHES = 200


def clip(text: str, longest: int = TEXT) -> str:
    """`text` cut to `longest` characters (an ellipsis marks the cut)."""
    return text if len(text) <= longest else text[: longest - 1] + "…"


def scalar(value: Any) -> Any:
    """A JSON scalar for the log (texts bounded, instants as RFC 3339), or None to leave out."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        return clip(value.replace("\x00", ""), DETAIL_TEXT)
    return None


def bounded(*sources: dict[str, Any]) -> dict[str, Any]:
    """The scalar fields of `sources` (later ones win), at most DETAIL_KEYS, each bounded;
    hidden and nested fields left out, names clipped to 64 characters."""
    out: dict[str, Any] = {}
    for source in sources:
        for name, value in source.items():
            if name in HIDDEN or isinstance(value, dict | list | tuple | bytes):
                continue
            kept = scalar(value)
            if kept is None and value is not None:
                continue
            key = clip(str(name), 64)
            if key in out or len(out) < DETAIL_KEYS:
                out[key] = kept
    return out


class ActivityOperations:
    def __init__(self, store: ActivityLog, clock: Clock, max_rows: int | None = None) -> None:
        self.store = store
        self.clock = clock
        self.max_rows = max_rows  # SCHEDULER_ACTIVITY_MAX_ROWS; None: bounded by age only

    async def record(self, row: Activity) -> None:
        await self.store.record(row)

    async def list(
        self, where: ActivityFilter, cursor: str | None, limit: int
    ) -> Page[ActivityEntry]:
        """Rows matching `where`, newest first; `cursor` continues a previous page."""
        key = decode(CURSOR, cursor, (TIME, SEQ))
        after = (from_us(key[0]), key[1]) if key else None
        rows = await self.store.list(where, after, limit + 1)
        entries = [ActivityEntry.model_validate(row) for row in rows]
        return page(entries, limit, lambda e: (us(e.at), e.id), CURSOR)

    async def prune(self, retention: timedelta, batch: int = PRUNE_BATCH) -> int:
        """Delete the rows older than `retention` (by this clock), then the oldest past
        `max_rows`, `batch` at a time, at most PRUNE_BATCHES batches each a pass; how many
        went."""
        before = self.clock.now() - retention
        total = 0
        for _ in range(PRUNE_BATCHES):
            deleted = await self.store.prune(before, batch)
            total += deleted
            if deleted < batch:
                break
        return total + await self._prune_over(batch)

    async def _prune_over(self, batch: int) -> int:
        """Delete the oldest rows past `max_rows`, `batch` at a time; how many."""
        if self.max_rows is None:
            return 0
        total = 0
        for _ in range(PRUNE_BATCHES):
            deleted = await self.store.prune_over(self.max_rows, batch)
            total += deleted
            if deleted < batch:
                break
        return total
