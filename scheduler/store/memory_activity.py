"""The in-memory twin of the activity log (`scheduler.operations.stores.ActivityLog`).

It keeps the rules of `scheduler.store.postgres.activity`'s SQL: each row gets the next `id`;
a listing is newest first by (`at`, `id`) after a key, filtered by action, target, a prefix of
`who` and `[since, until)`; a prune deletes the oldest first, in batches. The detail goes
through JSON as `jsonb` does. tests/contracts/test_activity_log.py holds the two to the same
answers.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from datetime import UTC, datetime
from typing import Any

from scheduler.operations.stores import Activity, ActivityFilter

Rows = list[dict[str, Any]]  # (`list` is a method of the store below)


class MemoryActivityStore:
    def __init__(self) -> None:
        self.rows: Rows = []  # in the order recorded
        self._ids = itertools.count(1)

    async def record(self, row: Activity) -> None:
        doc = dataclasses.asdict(row)
        doc["at"] = row.at.astimezone(UTC)
        doc["detail"] = json.loads(json.dumps(row.detail, separators=(",", ":")))
        self.rows.append({"id": next(self._ids), **doc})

    async def list(
        self, where: ActivityFilter, after: tuple[datetime, int] | None, limit: int
    ) -> Rows:
        found = [r for r in self._newest() if _matches(r, where) and _after(r, after)]
        return [{**r, "detail": json.loads(json.dumps(r["detail"]))} for r in found[:limit]]

    async def prune_over(self, keep: int, batch: int) -> int:
        newest = self._newest()
        if len(newest) <= keep:
            return 0
        cut = _key(newest[keep])
        return self._delete([r for r in reversed(newest) if _key(r) <= cut][:batch])

    async def prune(self, before: datetime, batch: int) -> int:
        return self._delete([r for r in reversed(self._newest()) if r["at"] < before][:batch])

    def _newest(self) -> Rows:
        return sorted(self.rows, key=_key, reverse=True)

    def _delete(self, rows: Rows) -> int:
        gone = {r["id"] for r in rows}
        self.rows = [r for r in self.rows if r["id"] not in gone]
        return len(gone)


def _key(row: dict[str, Any]) -> tuple[datetime, int]:
    return (row["at"], row["id"])


def _matches(row: dict[str, Any], where: ActivityFilter) -> bool:
    return (
        (where.action is None or row["action"] == where.action)
        and (where.target is None or row["target"] == where.target)
        and (where.who is None or row["who"].startswith(where.who))
        and (where.since is None or row["at"] >= where.since)
        and (where.until is None or row["at"] < where.until)
    )


def _after(row: dict[str, Any], after: tuple[datetime, int] | None) -> bool:
    return after is None or _key(row) < after
