"""The daemon's role loop: terms of office one after another, a bounded stop, then the lease.

Every instance runs it; `LeaderEngine.run_term` waits for office, leads until office ends, and
returns, so a standby simply sits in it. On stop the term ends gracefully (no new claims, the
batch in flight published and recorded) within `SCHEDULER_SHUTDOWN_GRACE`; an abandoned batch
stays claimed and the next leader re-publishes it (the duplicate window drops repeats). Last,
the lease is given up so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import logging

from scheduler.aio import first_of, wait_or_stop
from scheduler.engine.leader_loop import LeaderEngine
from scheduler.leadership.election import Leadership
from scheduler.leadership.partitioned import PartitionedLeadership

log = logging.getLogger(__name__)


class TermLoop:
    """Runs `engine`'s terms while `leadership` grants them, until `stop`; `done` is set once
    the last term ended and the lease is given up."""

    def __init__(
        self,
        engine: LeaderEngine,
        leadership: Leadership | PartitionedLeadership,
        grace: float,
        stop: asyncio.Event,
        done: asyncio.Event,
    ) -> None:
        self.engine, self.leadership, self.grace = engine, leadership, grace
        self._stop, self._done = stop, done

    async def run(self) -> None:
        """Terms until stopped (an engine crash ends the daemon, after the lease is given up)."""
        terms = asyncio.create_task(self._terms(), name="terms")
        try:
            await first_of(asyncio.shield(terms), self._stop.wait())
            if not terms.done():
                done, _ = await asyncio.wait({terms}, timeout=self.grace)
                if not done:
                    log.warning("daemon.grace_expired seconds=%g: abandoning the term", self.grace)
                    terms.cancel()
                    await asyncio.gather(terms, return_exceptions=True)
            if not terms.cancelled():
                terms.result()
        finally:
            if not terms.done():
                terms.cancel()
                await asyncio.gather(terms, return_exceptions=True)
            await self.leadership.resign()
            self._done.set()

    async def _terms(self) -> None:
        """Terms of office, one after another; a term that fails (the database away at the
        start of a term, say) is retried with backoff while this instance still leads."""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                await self.engine.run_term(self._stop)
                backoff = 0.5
            except Exception as exc:
                log.warning("engine.term_failed error=%r; retrying in %gs", exc, backoff)
                await wait_or_stop(self._stop, backoff)
                backoff = min(backoff * 2, 10.0)
