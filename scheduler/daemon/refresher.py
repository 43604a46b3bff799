"""The engine's refresher: the leader's gauges only PostgreSQL can answer, and operator pauses.

`Refresher` runs in every engine; while it leads it refreshes, every
`SCHEDULER_FORECAST_INTERVAL`, the forecast `mq_scheduler_due_tasks{subject, within}` (one range
read of the pending index, the top `SCHEDULER_FORECAST_TOP` subjects plus `other`, so the label
count stays bounded), `mq_scheduler_dead_letters_unresolved` and `mq_scheduler_intake_backlog`;
a standby exports none of them, so summing across instances counts once. When one round of
queries takes long (a huge window of due tasks) the next waits ten times as long, keeping
PostgreSQL's share small. It also applies operator pauses: when the set of paused jobs in
PostgreSQL differs from the one the cron engine applied, the engine reloads (at once on a NATS
notice, else within an interval). It lived in `scheduler.operations.stats` while one process
ran both halves; the operator half now imports nothing of the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from scheduler.aio import first_of
from scheduler.clock import Clock
from scheduler.engine.cron.firing import CronEngine
from scheduler.operations.cron_jobs import CHANGED_SUBJECT
from scheduler.operations.events import OperationsEvents
from scheduler.operations.shared import SLOW_FACTOR
from scheduler.operations.stats import OTHER
from scheduler.operations.stores import WINDOWS
from scheduler.settings import Settings
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.dead_letters import DeadLetterStore
from scheduler.store.postgres.overview import OverviewStore

log = logging.getLogger(__name__)


def top_subjects(forecast: dict[str, list[int]], top: int) -> dict[str, list[int]]:
    """The `top` subjects with most tasks due in the widest window, the rest summed as `other`.

    Ties go by name, so the chosen set is stable between refreshes. `other` is present (zeros
    included) whenever any subject was folded into it."""
    ranked = sorted(forecast.items(), key=lambda item: (-item[1][-1], item[0]))
    shown = dict(ranked[:top])
    rest = ranked[top:]
    if rest:
        shown[OTHER] = [sum(counts[i] for _, counts in rest) for i in range(len(WINDOWS))]
    return shown


class Refresher:
    """The leader's periodic gauges and the application of operator pauses (see module doc)."""

    def __init__(
        self,
        settings: Settings,
        overview: OverviewStore,
        dead_letters: DeadLetterStore,
        schedules: ScheduleStore,
        events: OperationsEvents,
        clock: Clock,
        leads: Callable[[], bool],
        backlog: Callable[[], Awaitable[int | None]],
        cron: CronEngine | None = None,
    ) -> None:
        self.settings = settings
        self.overview = overview
        self.dead_letters = dead_letters
        self.schedules = schedules
        self._events = events
        self.clock = clock
        self.leads = leads
        self.backlog = backlog
        self.cron = cron
        self.poke = asyncio.Event()
        self._exported = False

    async def run(self, nc: Client, stop: asyncio.Event) -> None:
        """Refresh until `stop`; a schedules notice over NATS triggers a round at once."""
        sub = await nc.subscribe(CHANGED_SUBJECT, cb=self._on_notice)
        try:
            while not stop.is_set():
                started = self.clock.monotonic()
                try:
                    await self.refresh()
                except Exception as exc:  # PostgreSQL or NATS away: keep the last values, retry
                    log.warning("stats.refresh_failed error=%r", exc)
                took = self.clock.monotonic() - started
                wait = max(self.settings.forecast_interval.total_seconds(), SLOW_FACTOR * took)
                self.poke.clear()
                await first_of(self.poke.wait(), stop.wait(), asyncio.sleep(wait))
        finally:
            if not nc.is_closed:  # closed for good (see Daemon.is_alive): nothing to undo
                await sub.unsubscribe()

    async def _on_notice(self, _: Msg) -> None:
        self.poke.set()

    async def refresh(self) -> None:
        """One round: the gauges and operator pauses while leading; clear them otherwise."""
        if not self.leads():
            self.clear()
            return
        forecast = top_subjects(
            await self.overview.forecast(self.clock.now()), self.settings.forecast_top
        )
        unresolved = await self.dead_letters.unresolved()
        backlog = await self.backlog()
        due = {
            (subject, label): count
            for subject, counts in forecast.items()
            for (label, _), count in zip(WINDOWS, counts, strict=True)
        }
        self._events.leader_gauges_refreshed(due, unresolved, backlog)
        self._exported = True
        await self.apply_pauses()

    async def apply_pauses(self) -> None:
        if self.cron is None:
            return
        paused = await self.schedules.operator_paused()
        failed = await self.schedules.failed()  # an operator's resume clears a failed mark
        if paused != self.cron.paused_by_operator or failed != self.cron.failed:
            log.info(
                "cron.operator_pauses_changed paused=%s failed=%s",
                ",".join(sorted(paused)) or "-",
                ",".join(sorted(failed)) or "-",
            )
            self.cron.request_reload()

    def clear(self) -> None:
        if self._exported:
            self._events.leader_gauges_cleared()
            self._exported = False
