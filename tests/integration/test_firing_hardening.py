"""The firing engine under duress, on real PostgreSQL and nats-server: re-armed duplicates,
acks that never come, a full armed set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from scheduler.settings import Settings
from tests.integration.engine_parts import Parts, early, ids_of, make_parts, run_for, soon


@pytest.fixture
async def parts(settings: Settings) -> AsyncIterator[Parts]:
    async for p in make_parts(settings):
        yield p


async def test_rearmed_claims_go_out_once_and_never_early(parts: Parts) -> None:
    """Claimed tasks armed again by a reclaim (same rows) and by a second claim (the first
    one's reply lost, so a higher attempt) among later ones: all arrive once, none early."""
    dues = [soon(600 + (i * 7) % 300) for i in range(300)]
    rows = await parts.insert(dues)
    due = {t.id: t.due_at for t in rows}
    ids = [t.id for t in rows]
    firing = parts.firing()
    firing.arm(await parts.tasks.claim(parts.epoch, ids, soon(5000)))
    firing.arm((await parts.tasks.reclaim_orphans(parts.epoch, timedelta(0))).ready)
    await parts.pool.execute(
        "UPDATE delayed_messages SET status = 'pending' WHERE id = ANY($1)", ids[::5]
    )
    firing.arm(await parts.tasks.claim(parts.epoch, ids[::5], soon(5000)))
    await run_for(firing, parts.epoch, parts.until_stored(len(rows)))
    msgs = await parts.stored(count=len(rows))
    assert ids_of(msgs) == dict.fromkeys(ids, 1)
    assert early(msgs, due) == []
