"""The in-memory twin of the API's idempotency keys (`scheduler.operations.stores.IdempotencyKeys`).

It keeps the rules of `scheduler.store.postgres.idempotency`'s SQL, row for row: a claim takes
a free key, an expired one (afresh) or a `running` one whose lock passed with the same
fingerprint (keeping `first_at` and the expiry); a finish or release counts only for the
current owner; a prune deletes the expired keys, then the finished ones at or below the key
`max_keys` places from the newest by (expiry, scope, key). tests/contracts/test_idempotency_keys.py
holds the two to the same answers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from scheduler.operations.stores import Claim, KeyUse, Recorded


@dataclass(frozen=True, slots=True)
class _Row:
    use: KeyUse
    state: str
    owner: uuid.UUID
    first_at: datetime
    locked_until: datetime
    expires_at: datetime
    status: int | None = None
    media_type: str | None = None
    body: bytes | None = None

    def recorded(self) -> Recorded:
        return Recorded(
            route=self.use.route,
            target=self.use.target,
            fingerprint=self.use.fingerprint,
            state=self.state,
            locked_until=self.locked_until,
            status=self.status,
            media_type=self.media_type,
            body=self.body,
        )

    def order(self) -> tuple[datetime, str, str]:
        return (self.expires_at, self.use.scope, self.use.key)


class MemoryIdempotencyStore:
    def __init__(self, max_keys: int | None = None) -> None:
        self.max_keys = max_keys
        self.rows: dict[tuple[str, str], _Row] = {}

    async def claim(
        self, use: KeyUse, now: datetime, lock: timedelta, keep: timedelta
    ) -> Claim | Recorded:
        owner, held = uuid.uuid4(), self.rows.get((use.scope, use.key))
        if held is None or held.expires_at <= now:
            row = _Row(use, "running", owner, now, now + lock, now + keep)
        elif (
            held.state == "running"
            and held.locked_until <= now
            and held.use.fingerprint == use.fingerprint
        ):
            row = replace(held, use=use, owner=owner, locked_until=now + lock)
            row = replace(row, status=None, media_type=None, body=None)
        else:
            return held.recorded()
        self.rows[use.scope, use.key] = row
        return Claim(use, owner, row.first_at)

    async def finish(self, claim: Claim, status: int, media_type: str, body: bytes) -> None:
        row = self._owned(claim)
        if row is not None:
            done = replace(row, state="done", status=status, media_type=media_type, body=body)
            self.rows[claim.use.scope, claim.use.key] = done

    async def release(self, claim: Claim, now: datetime) -> None:
        row = self._owned(claim)
        if row is not None and row.state == "running":
            self.rows[claim.use.scope, claim.use.key] = replace(row, locked_until=now)

    async def prune(self, now: datetime) -> int:
        expired = [k for k, row in self.rows.items() if row.expires_at <= now]
        for k in expired:
            del self.rows[k]
        over: list[tuple[str, str]] = []
        if self.max_keys is not None:
            newest = sorted((row.order() for row in self.rows.values()), reverse=True)
            if len(newest) > self.max_keys:
                cut = newest[self.max_keys]
                over = [
                    k
                    for k, row in self.rows.items()
                    if row.state != "running" and row.order() <= cut
                ]
        for k in over:
            del self.rows[k]
        return len(expired) + len(over)

    def _owned(self, claim: Claim) -> _Row | None:
        row = self.rows.get((claim.use.scope, claim.use.key))
        return row if row is not None and row.owner == claim.owner else None
