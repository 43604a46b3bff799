"""`api_idempotency` on PostgreSQL: one owner per key, takeover of a key whose first request
died, expiry and pruning."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.metrics import Metrics
from scheduler.operations.stores import Claim, KeyUse, Recorded
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.idempotency import IdempotencyStore

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
LOCK, KEEP = timedelta(seconds=60), timedelta(hours=24)
USE = KeyUse("admin", "k-1", "POST /v1/schedules/{name}/trigger", "nightly", "f1")


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[IdempotencyStore]:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        yield IdempotencyStore(PostgresStore(pool, Metrics()))
    finally:
        await pool.close()


async def test_one_owner_then_takeover_after_the_lock_keeping_the_first_instant(
    store: IdempotencyStore,
) -> None:
    """While the first request holds the key a second finds it running; past the lock a retry
    of the same request takes it over (same first instant), another request never does, and
    the first owner's late answer is not stored over the new owner's."""
    first = await store.claim(USE, T0, LOCK, KEEP)
    assert isinstance(first, Claim) and first.first_at == T0
    busy = await store.claim(USE, T0 + timedelta(seconds=59), LOCK, KEEP)
    assert isinstance(busy, Recorded) and busy.state == "running"
    other = KeyUse(USE.scope, USE.key, USE.route, "every-second", "f2")
    refused = await store.claim(other, T0 + timedelta(seconds=61), LOCK, KEEP)
    assert isinstance(refused, Recorded) and refused.target == "nightly"
    taken = await store.claim(USE, T0 + timedelta(seconds=61), LOCK, KEEP)
    assert isinstance(taken, Claim) and taken.first_at == T0 and taken.owner != first.owner
    await store.finish(first, 200, "application/json", b'{"late": true}')
    await store.finish(taken, 200, "application/json", b'{"ok": true}')
    done = await store.claim(USE, T0 + timedelta(seconds=62), LOCK, KEEP)
    assert isinstance(done, Recorded) and (done.state, done.body) == ("done", b'{"ok": true}')


async def test_release_frees_the_key_and_expired_keys_are_pruned(store: IdempotencyStore) -> None:
    """A released key is taken at once by a retry; rows live 24 h, then the upkeep's prune
    deletes them and the key starts afresh."""
    first = await store.claim(USE, T0, LOCK, KEEP)
    assert isinstance(first, Claim)
    await store.release(first, T0 + timedelta(seconds=1))
    again = await store.claim(USE, T0 + timedelta(seconds=1), LOCK, KEEP)
    assert isinstance(again, Claim) and again.first_at == T0
    await store.finish(again, 404, "application/problem+json", b"{}")
    assert await store.prune(T0 + KEEP - timedelta(seconds=1)) == 0
    assert await store.prune(T0 + KEEP) == 1
    fresh = await store.claim(USE, T0 + KEEP, LOCK, KEEP)
    assert isinstance(fresh, Claim) and fresh.first_at == T0 + KEEP
