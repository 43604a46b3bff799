"""The idempotency keys' contract (`scheduler.operations.stores.IdempotencyKeys`), over the
in-memory twin and PostgreSQL alike: one owner per key, takeover of a key whose first request
died, expiry, and pruning by age and by count."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest

from scheduler.metrics import Metrics
from scheduler.operations.stores import Claim, IdempotencyKeys, KeyUse, Recorded
from scheduler.store.memory_idempotency import MemoryIdempotencyStore

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
LOCK, KEEP = timedelta(seconds=60), timedelta(hours=24)
USE = KeyUse("admin", "k-1", "POST /v1/schedules/{name}/trigger", "nightly", "f1")

Keys = Callable[[int | None], IdempotencyKeys]


@pytest.fixture
async def keys(database: str | None) -> AsyncIterator[Keys]:
    """Makes the store under test, bounded to `max_keys` (all on one database)."""
    if database is None:
        yield MemoryIdempotencyStore
        return
    from scheduler.store.postgres.connect import PostgresStore, create_pool
    from scheduler.store.postgres.idempotency import IdempotencyStore

    pool = await create_pool(database, min_size=1, max_size=2)
    try:
        yield lambda max_keys: IdempotencyStore(PostgresStore(pool, Metrics()), max_keys)
    finally:
        await pool.close()


@pytest.fixture
def store(keys: Keys) -> IdempotencyKeys:
    return keys(None)


async def test_one_owner_then_takeover_after_the_lock_keeping_the_first_instant(
    store: IdempotencyKeys,
) -> None:
    """While the first request holds the key a second finds it running; past the lock a retry
    of the same request takes it over (same first instant), another request never does, and
    the first owner's late answer is not stored over the new owner's."""
    first = await store.claim(USE, T0, LOCK, KEEP)
    assert isinstance(first, Claim) and first.first_at == T0
    busy = await store.claim(USE, T0 + timedelta(seconds=59), LOCK, KEEP)
    assert isinstance(busy, Recorded) and busy.state == "running"
    assert busy.locked_until == T0 + LOCK and (busy.status, busy.body) == (None, None)
    other = KeyUse(USE.scope, USE.key, USE.route, "every-second", "f2")
    refused = await store.claim(other, T0 + timedelta(seconds=61), LOCK, KEEP)
    assert isinstance(refused, Recorded) and refused.target == "nightly"
    assert refused.fingerprint == "f1"
    taken = await store.claim(USE, T0 + timedelta(seconds=61), LOCK, KEEP)
    assert isinstance(taken, Claim) and taken.first_at == T0 and taken.owner != first.owner
    await store.finish(first, 200, "application/json", b'{"late": true}')
    await store.finish(taken, 200, "application/json", b'{"ok": true}')
    done = await store.claim(USE, T0 + timedelta(seconds=62), LOCK, KEEP)
    assert isinstance(done, Recorded) and (done.state, done.body) == ("done", b'{"ok": true}')
    assert (done.status, done.media_type) == (200, "application/json")


async def test_a_finished_key_is_never_taken_over_until_it_expires(
    store: IdempotencyKeys,
) -> None:
    """A done key answers its record to the same request and to another alike until its
    expiry (even long past the lock); at its expiry any request claims it afresh."""
    first = await store.claim(USE, T0, LOCK, KEEP)
    assert isinstance(first, Claim)
    await store.finish(first, 201, "application/json", b"{}")
    late = T0 + KEEP - timedelta(microseconds=1)
    again = await store.claim(USE, late, LOCK, KEEP)
    assert isinstance(again, Recorded) and again.state == "done" and again.status == 201
    other = KeyUse(USE.scope, USE.key, "DELETE /v1/delayed/{id}", "t-1", "f9")
    assert isinstance(await store.claim(other, late, LOCK, KEEP), Recorded)
    fresh = await store.claim(other, T0 + KEEP, LOCK, KEEP)
    assert isinstance(fresh, Claim) and fresh.first_at == T0 + KEEP
    shown = await store.claim(USE, T0 + KEEP, LOCK, KEEP)
    assert isinstance(shown, Recorded) and (shown.route, shown.target) == (other.route, "t-1")


async def test_keys_are_per_scope(store: IdempotencyKeys) -> None:
    """The same key under two scopes (two tokens) is two keys, each with its own owner."""
    mine = await store.claim(USE, T0, LOCK, KEEP)
    ops = KeyUse("ops", USE.key, USE.route, USE.target, USE.fingerprint)
    theirs = await store.claim(ops, T0, LOCK, KEEP)
    assert isinstance(mine, Claim) and isinstance(theirs, Claim) and mine.owner != theirs.owner


async def test_release_frees_the_key_and_expired_keys_are_pruned(store: IdempotencyKeys) -> None:
    """A released key is taken at once by a retry; rows live 24 h, then the upkeep's prune
    deletes them and the key starts afresh."""
    first = await store.claim(USE, T0, LOCK, KEEP)
    assert isinstance(first, Claim)
    await store.release(first, T0 + timedelta(seconds=1))
    again = await store.claim(USE, T0 + timedelta(seconds=1), LOCK, KEEP)
    assert isinstance(again, Claim) and again.first_at == T0
    await store.release(first, T0 + timedelta(seconds=1))  # not the owner any more: no effect
    busy = await store.claim(USE, T0 + timedelta(seconds=2), LOCK, KEEP)
    assert isinstance(busy, Recorded) and busy.state == "running"
    await store.finish(again, 404, "application/problem+json", b"{}")
    await store.release(again, T0 + timedelta(seconds=3))  # done: a release changes nothing
    kept = await store.claim(USE, T0 + timedelta(seconds=3), LOCK, KEEP)
    assert isinstance(kept, Recorded) and kept.state == "done"
    assert await store.prune(T0 + KEEP - timedelta(seconds=1)) == 0
    assert await store.prune(T0 + KEEP) == 1
    fresh = await store.claim(USE, T0 + KEEP, LOCK, KEEP)
    assert isinstance(fresh, Claim) and fresh.first_at == T0 + KEEP


async def test_past_max_keys_the_soonest_to_expire_go_but_never_a_running_one(
    keys: Keys,
) -> None:
    """With `max_keys` 2, a prune keeps the two keys that expire last and deletes the finished
    ones before them, oldest first; a key whose request still runs is kept, and counts."""
    store = keys(2)
    claims = []
    for n in range(5):
        use = KeyUse("admin", f"k{n}", USE.route, f"t{n}", f"f{n}")
        got = await store.claim(use, T0 + timedelta(seconds=n), LOCK, KEEP)
        assert isinstance(got, Claim)
        claims.append(got)
    for claim in claims[1:]:
        await store.finish(claim, 200, "application/json", b"{}")
    assert await store.prune(T0) == 2  # k1, k2; k0 still runs
    left = []
    for n in range(5):
        use = KeyUse("admin", f"k{n}", USE.route, f"t{n}", f"f{n}")
        got = await store.claim(use, T0 + timedelta(seconds=10), LOCK, KEEP)
        left.append(isinstance(got, Recorded))
    assert left == [True, False, False, True, True]
    # k0 expired; k3 and k4 (done) now expire before k1 and k2, claimed again and running
    assert await store.prune(T0 + KEEP) == 3
