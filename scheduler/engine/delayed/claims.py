"""Claims: pending tasks from the heap into the armed set, within its count and byte limits.

The claimer pops what falls due within `LOOKAHEAD_MS` and claims it in PostgreSQL (a cancel that
commits first wins) so the claim's round trip is never on the critical path. Up to
`CLAIMS_IN_FLIGHT` claims run at once; their results are taken in the order they started.

Memory stays bounded whatever producers sent or how many tasks fall due at once: a claim takes
at most the room the armed set has (count), and its payloads only up to the bytes left (the
rest come back *parked*: claimed, without payloads, fetched again in firing order as room
appears). Tasks an earlier leader claimed but never recorded (orphans) are taken over the same
way, page by page, before anything new is claimed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import timedelta

from scheduler.clock import Clock
from scheduler.engine.delayed import task_path
from scheduler.engine.delayed.armed import Armed
from scheduler.engine.delayed.fairness import Throttles
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.delayed.task_path import (
    CLAIM_LEAD_MS,
    CLAIM_STEP_MS,
    CLAIMS_IN_FLIGHT,
    LOOKAHEAD_MS,
)
from scheduler.engine.ports import TaskRepository
from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.records import Claimed, ClaimedTask, to_ms
from scheduler.settings import Settings

log = logging.getLogger("scheduler.firing")


class Claimer:
    """Claims for one term of office; `arm` receives the tasks ready to publish, in order.
    The claim step itself is `engine.task_path.claim_due`; this class keeps its state (claims
    in flight, byte reservations) and the detail: parked payloads and orphans (`refill`)."""

    step = task_path.claim_due
    _take = task_path.arm_or_park

    def __init__(
        self,
        settings: Settings,
        horizon: Horizon,
        tasks: TaskRepository,
        armed: Armed,
        clock: Clock,
        metrics: Metrics,
        arm: Callable[[Sequence[ClaimedTask]], None],
    ) -> None:
        self.settings = settings
        self.horizon = horizon
        self.tasks = tasks
        self.armed = armed
        self.clock = clock
        self.metrics = metrics
        self._arm = arm
        self.on_fenced: Callable[[int], None] = lambda epoch: None
        # claimed by this leader but taken without payloads (over the byte budget), in order
        self._parked: list[ClaimedTask] = []
        self._claiming = 0  # tasks in claims still in flight
        self._reserved = 0  # payload bytes promised to claims in flight
        self._claims: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(CLAIMS_IN_FLIGHT)
        self._taken = asyncio.Event()  # set once the latest claim's result is taken
        self._taken.set()
        self._orphans_left = False  # a reclaim of orphans is under way, page by page
        self._orphan_stale: timedelta | None = None
        self._last_claim_ms = 0
        # the fair limits while two or more orgs compete, else the FIFO ones (engine.fair)
        self.throttles = Throttles(settings, horizon.heap, armed)

    @property
    def backlog(self) -> bool:
        """True while parked tasks or orphans wait to be taken (before any new claim)."""
        return bool(self._parked) or self._orphans_left

    async def settle(self) -> None:
        """Wait for the claims in flight (stopping)."""
        if self._claims:
            await asyncio.gather(*self._claims, return_exceptions=True)

    def forget(self) -> None:
        """Office lost: parked tasks stay claimed in PostgreSQL for the next leader."""
        self._parked.clear()
        self._orphans_left = False

    def reclaim_orphans(self, stale: timedelta | None = None) -> None:
        """Take over, page by page as room allows, the tasks claimed by earlier leaders (and
        with `stale`, any claim older than that) before claiming anything new."""
        self._orphans_left, self._orphan_stale = True, stale

    def room(self) -> int:
        """How many more tasks may be claimed: the armed set's limits, less what is parked
        or being claimed."""
        if self.armed.byte_room() - self._reserved <= 0:
            return 0
        return self.armed.room() - self._claiming - len(self._parked)

    async def refill(self, epoch: int) -> None:
        """Fetch parked payloads, or take over a page of orphans, within the room there is."""
        room, budget = self.room(), max(self.armed.byte_room() - self._reserved, 1)
        try:
            if self._parked:  # they stay parked while fetched: claims finishing meanwhile
                chunk = [t.id for t in self._parked[:room]]  # must still see them
                got = await self.tasks.load_claimed(epoch, chunk, budget)
                # fetched, or no longer claimed by this leader: off the parked list
                done = set(chunk) - {t.id for t in got.parked}
                self._parked = [t for t in self._parked if t.id not in done]
                self._take(Claimed(got.ready, []))
                return
            limit = min(self.settings.batch, room)
            got = await self.tasks.reclaim_orphans(epoch, self._orphan_stale, limit, budget)
        except FencedError:
            self.on_fenced(epoch)
            return
        except Exception as exc:  # PostgreSQL away: try again shortly
            log.warning("reclaim.failed error=%r", exc)
            await self.clock.sleep(0.5)
            return
        if got.ready or got.parked:
            log.info("engine.reclaimed count=%d", len(got.ready) + len(got.parked))
        if len(got.ready) + len(got.parked) < limit:
            self._orphans_left = False  # that was the last page
        self._take(got)

    def idle_seconds(self) -> float:
        """Until the next claim: when the next task enters the lookahead, but not sooner than
        a step after the last claim, unless it would then be claimed too close to its time."""
        nxt = self.horizon.next_due()
        if nxt is None:
            return 1.0
        at = min(max(nxt - LOOKAHEAD_MS, self._last_claim_ms + CLAIM_STEP_MS), nxt - CLAIM_LEAD_MS)
        return min(1.0, max(0.0, (at - to_ms(self.clock.now())) / 1000))
