"""`api_idempotency`: the first outcome of each API write sent with an `Idempotency-Key`.

A request *claims* its key in one statement: it inserts the row (`running`, owned by a fresh
uuid), or takes over a row that expired, or one whose first request stopped without an answer
(`locked_until` passed; same fingerprint only, keeping `first_at`). Otherwise it gets the row as
it stands, and the caller decides: another request (422), still running (409) or done (replay).
Two claims of one key are serialised by the row lock of `ON CONFLICT DO UPDATE`, whose `WHERE`
is evaluated again on the newest row version, so exactly one of them owns the key.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from scheduler.operations.stores import Claim, KeyUse, Recorded
from scheduler.store.postgres.connect import PostgresStore

_CLAIM = """
INSERT INTO api_idempotency AS t (scope, key, route, target, fingerprint, state, owner,
                                  first_at, locked_until, expires_at)
VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8, $9)
ON CONFLICT (scope, key) DO UPDATE SET
    route = EXCLUDED.route, target = EXCLUDED.target, fingerprint = EXCLUDED.fingerprint,
    state = 'running', owner = EXCLUDED.owner, locked_until = EXCLUDED.locked_until,
    first_at = CASE WHEN t.expires_at <= $7 THEN EXCLUDED.first_at ELSE t.first_at END,
    expires_at = CASE WHEN t.expires_at <= $7 THEN EXCLUDED.expires_at ELSE t.expires_at END,
    status = NULL, media_type = NULL, body = NULL
WHERE t.expires_at <= $7
   OR (t.state = 'running' AND t.locked_until <= $7 AND t.fingerprint = EXCLUDED.fingerprint)
RETURNING t.first_at
"""


class IdempotencyStore:
    def __init__(self, db: PostgresStore, max_keys: int | None = None) -> None:
        self.db = db
        self.max_keys = max_keys  # SCHEDULER_IDEMPOTENCY_MAX_KEYS; None: bounded by age only

    async def claim(
        self, use: KeyUse, now: datetime, lock: timedelta, keep: timedelta
    ) -> Claim | Recorded:
        """Own `use.key` (a Claim), or the row another request left (Recorded)."""
        owner = uuid.uuid4()
        async with self.db.timed("idempotency_claim") as conn:
            for _ in range(3):  # a row pruned between the two statements: claim again
                first_at = await conn.fetchval(
                    _CLAIM,
                    use.scope,
                    use.key,
                    use.route,
                    use.target,
                    use.fingerprint,
                    owner,
                    now,
                    now + lock,
                    now + keep,
                )
                if first_at is not None:
                    return Claim(use, owner, first_at)
                row = await conn.fetchrow(
                    "SELECT route, target, fingerprint, state, locked_until, status, media_type, "
                    "body FROM api_idempotency WHERE scope = $1 AND key = $2",
                    use.scope,
                    use.key,
                )
                if row is not None:
                    return Recorded(**dict(row))
        raise RuntimeError(f"idempotency key {use.key!r} could be neither claimed nor read")

    async def finish(self, claim: Claim, status: int, media_type: str, body: bytes) -> None:
        """Store the answer of the claim's request (nothing if another request took it over)."""
        async with self.db.timed("idempotency_finish") as conn:
            await conn.execute(
                "UPDATE api_idempotency SET state = 'done', status = $4, media_type = $5, "
                "body = $6 WHERE scope = $1 AND key = $2 AND owner = $3",
                claim.use.scope,
                claim.use.key,
                claim.owner,
                status,
                media_type,
                body,
            )

    async def release(self, claim: Claim, now: datetime) -> None:
        """The request ended without an answer to keep: a retry may run it at once."""
        async with self.db.timed("idempotency_release") as conn:
            await conn.execute(
                "UPDATE api_idempotency SET locked_until = $4 "
                "WHERE scope = $1 AND key = $2 AND owner = $3 AND state = 'running'",
                claim.use.scope,
                claim.use.key,
                claim.owner,
                now,
            )

    async def prune(self, now: datetime) -> int:
        """Delete the rows past their expiry, then the oldest (soonest to expire) past
        `max_keys` (never one whose request still runs); how many. A retry whose answer went
        this way runs again, as after its 24 h."""
        async with self.db.timed("idempotency_prune") as conn:
            done = await conn.execute("DELETE FROM api_idempotency WHERE expires_at <= $1", now)
            over = "DELETE 0"
            if self.max_keys is not None:
                over = await conn.execute(
                    "DELETE FROM api_idempotency WHERE state <> 'running' AND "
                    "(expires_at, scope, key) <= (SELECT expires_at, scope, key FROM "
                    "api_idempotency ORDER BY expires_at DESC, scope DESC, key DESC "
                    "OFFSET $1 LIMIT 1)",
                    self.max_keys,
                )
        return int(done.split()[-1]) + int(over.split()[-1])
