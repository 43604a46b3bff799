"""A term that gives partitions back in place, on the twins (fake clock): it keeps firing the
partitions it keeps without ending, sends what it had armed of the others, records it, and only
then answers; from then on it fires, claims and records nothing of theirs, and leaves their
tasks pending, or claimed at its number for the next owner to take over (docs/leadership.md,
"A term that shrinks")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from scheduler.engine.delayed import stored
from scheduler.engine.delayed.claims import LOOKAHEAD_MS
from scheduler.records import Claimed
from scheduler.store.memory import MemoryTaskStore
from tests.unit.engine_twins import T0, Engine
from tests.unit.test_term_growth_on_twins import GrowingOffice, growing_twin, ids_in, store

KEPT = frozenset({0, 1, 2})
GIVEN = frozenset({3, 4})


class ShrinkingOffice(GrowingOffice):
    """As the office does for a shrink: the stores' office narrows only once the engine says
    it went quiet on the partitions left out."""

    def __init__(self, epoch: int, partitions: frozenset[int], store: MemoryTaskStore) -> None:
        super().__init__(epoch, partitions, store)
        self.answered = asyncio.Event()
        self.quiet_at: datetime | None = None

    async def resized(self, epoch: int) -> frozenset[int]:
        self.partitions = await self.growths.get()
        return self.partitions

    def resize_applied(self, epoch: int, ok: bool) -> None:
        super().resize_applied(epoch, ok)
        if ok:
            self.store.owned = self.partitions
        self.answered.set()


async def shrinking_twin(**settings: Any) -> tuple[Engine, ShrinkingOffice]:
    twin, grown = await growing_twin(**settings)
    office = ShrinkingOffice(grown.epoch or 0, KEPT | GIVEN, twin.store)
    twin.engine.office = twin.office = office
    return twin, office


def lateness(twin: Engine) -> dict[str, timedelta]:
    return {
        m.headers["Nats-Msg-Id"]: (
            datetime.fromisoformat(m.headers["Mq-Fired-At"])
            - datetime.fromisoformat(m.headers["Mq-Scheduled-For"])
        )
        for m in twin.delivered()
    }


async def test_a_shrink_keeps_the_term_and_leaves_the_given_partitions_to_their_next_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Giving back partitions 3 and 4 at 1 s: the term neither ends nor stops firing 0-2
    (each on time); what it had armed of 3 and 4 (due within the claim lookahead) goes out
    and is recorded before it answers; nothing of theirs due later is fired, claimed or
    written here: pending for their next owner. It stops hearing their notices."""
    twin, office = await shrinking_twin()
    kept = ids_in(KEPT, "k", 200)
    given = ids_in(GIVEN, "g", 200)
    await store(twin, kept, 500)  # from 0.5 s to 2.49 s, 10 ms apart
    await store(twin, given, 505)
    await twin.start()
    try:
        await twin.until(lambda: twin.clock.now() >= T0 + timedelta(seconds=1))
        at = twin.clock.now()
        with caplog.at_level(logging.INFO):
            office.growths.put_nowait(KEPT)
            took = await twin.until(office.answered.is_set, limit_ms=1_000)
            assert office.answers == [True]
            assert took <= LOOKAHEAD_MS + 40, f"quiet {took} ms after the shrink"
            quiet = twin.clock.now()
            sent_given = {i for i in twin.ids() if i in set(given)}
            # what went out of theirs went out before the answer, and is recorded
            assert all(twin.store.status(i) == "fired" for i in sent_given)
            due_cut = at + timedelta(milliseconds=LOOKAHEAD_MS + 40)
            due = {i: T0 + timedelta(milliseconds=505 + 10 * n) for n, i in enumerate(given)}
            assert sent_given >= {i for i in given if due[i] < at}, "all due before it went out"
            await twin.until(lambda: set(kept) <= set(twin.ids()), limit_ms=3_000)
        after = [i for i in twin.ids() if i in set(given) and i not in sent_given]
        assert after == [], "nothing of a given partition fired after the answer"
        due = {i: T0 + timedelta(milliseconds=505 + 10 * n) for n, i in enumerate(given)}
        left = [i for i in given if due[i] > due_cut]
        assert left and all(twin.store.status(i) == "pending" for i in left)
        assert max(lateness(twin)[i] for i in kept) <= timedelta(milliseconds=5)
        listening = {s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)}
        assert listening == {stored.subject(p) for p in KEPT}
        assert not office.ended and twin.runner is not None and not twin.runner.done()
        assert "engine.term_ended" not in caplog.text
        assert "engine.partitions_shrunk released=[3, 4]" in caplog.text
        assert quiet >= at
    finally:
        await twin.close()


async def test_a_claim_in_flight_during_a_shrink_arms_nothing_of_the_given_partitions() -> None:
    """A claim of 3's and 0's tasks is in flight (a 30 ms round trip) when 3 is given back:
    it comes back with both claimed, arms 0's and drops 3's, which stay claimed at this term's
    number (the next owner takes them over as orphans: published once, by it); the engine
    answers only after the claim is back. Offered those partitions back later, it refuses to
    grow in place (its claims there would be orphans for no one at its own number): the
    office then starts a new term."""
    twin, office = await shrinking_twin()
    kept = ids_in(KEPT, "k", 5)
    given = ids_in(GIVEN, "g", 5)
    for task_id in kept:
        await store(twin, [task_id], 1_030)  # all due at one millisecond: one claim
    for task_id in given:
        await store(twin, [task_id], 1_031)
    claim = twin.store.claim_within
    started = asyncio.Event()

    async def slow_claim(epoch: int, ids: Sequence[str], until: datetime, budget: int) -> Claimed:
        if set(ids) & set(given):
            started.set()
            await twin.clock.sleep(0.03)
        return await claim(epoch, ids, until, budget)

    twin.store.claim_within = slow_claim  # type: ignore[method-assign]
    await twin.start()
    try:
        await twin.until(started.is_set, limit_ms=2_000)
        office.growths.put_nowait(KEPT)
        await twin.until(office.answered.is_set, limit_ms=1_000)
        assert office.answers == [True]
        assert all(twin.store.status(i) == "claimed" for i in given)
        await twin.until(lambda: set(kept) <= set(twin.ids()), limit_ms=1_000)
        await twin.until(lambda: twin.clock.now() >= T0 + timedelta(seconds=2))
        assert not set(given) & set(twin.ids())
        assert all(twin.store.status(i) == "claimed" for i in given)
        office.growths.put_nowait(KEPT | GIVEN)
        await twin.until(lambda: len(office.answers) == 2, limit_ms=1_000)
        assert office.answers == [True, False]
    finally:
        await twin.close()
