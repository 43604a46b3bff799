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
from scheduler.engine.delayed import trace
from scheduler.engine.delayed.armed import Armed
from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.delayed.fairness import Throttles
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.ports import TaskRepository
from scheduler.errors import FencedError
from scheduler.records import Claimed, ClaimedTask, Entry, TaskRef, firing_order, from_ms, to_ms
from scheduler.settings import Settings

log = logging.getLogger(__name__)

# Claims run in steps: each claims every task due within LOOKAHEAD_MS, the next one follows
# CLAIM_STEP_MS later, or sooner when a task would otherwise be claimed less than CLAIM_LEAD_MS
# before it is due (a claim round trip under load takes 15-30 ms here). A steady stream of
# tasks so costs 40 claim statements a second instead of one per due millisecond.
LOOKAHEAD_MS = 80
CLAIM_LEAD_MS = 40
CLAIM_STEP_MS = 25
CLAIMS_IN_FLIGHT = 4


class Claimer:
    """Claims for one term of office: the claim step (`claim_due`), then `arm_or_park`, which
    hands the tasks ready to publish to `arm`, in order; the state between steps (claims in
    flight, byte reservations) and the detail: parked payloads and orphans (`refill`). A claim
    fenced by a newer leader's epoch calls `on_fenced(epoch)`."""

    def __init__(
        self,
        *,
        settings: Settings,
        horizon: Horizon,
        tasks: TaskRepository,
        armed: Armed,
        clock: Clock,
        events: DelayedEvents,
        arm: Callable[[Sequence[ClaimedTask]], None],
        on_fenced: Callable[[int], None],
    ) -> None:
        self.settings = settings
        self.horizon = horizon
        self.tasks = tasks
        self.armed = armed
        self.clock = clock
        self._events = events
        self._arm = arm
        self._on_fenced = on_fenced
        # claimed by this leader but taken without payloads (over the byte budget), in order
        self._parked: list[ClaimedTask] = []
        self._claiming = 0  # tasks in claims still in flight
        self._reserved = 0  # payload bytes promised to claims in flight
        self._claims: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(CLAIMS_IN_FLIGHT)
        self._taken = asyncio.Event()  # set once the latest claim's result is taken
        self._taken.set()
        self._orphans_left = False  # a reclaim of orphans is under way, page by page
        self._refilling = False  # a refill's statement is in flight (`refill`)
        # after the term gave partitions back: the partitions orphans are reclaimed in (the
        # stores' office still names the others until the office narrows it); None: the office
        self.reclaim_in: list[int] | None = None
        # tasks claimed at this term's number and dropped as their partition was given back:
        # their next owner takes them over as orphans; not orphans for this term's number
        self.left_claimed: set[str] = set()
        self._orphan_stale: timedelta | None = None
        self._last_claim_ms = 0
        # the fair limits while two or more orgs compete, else the FIFO ones (`fairness`)
        self.throttles = Throttles(settings, horizon.heap, armed)

    @property
    def backlog(self) -> bool:
        """True while parked tasks or orphans wait to be taken (before any new claim)."""
        return bool(self._parked) or self._orphans_left

    async def settle(self) -> None:
        """Wait for the claims in flight (stopping, or a term giving partitions back). A
        wait cancelled (a shrink that gave up) leaves them running: a claim committed in
        PostgreSQL is still armed."""
        if self._claims:
            await asyncio.wait(set(self._claims))

    @property
    def refilling(self) -> bool:
        """True while a refill (parked payloads, a page of orphans) is in flight."""
        return self._refilling

    def forget(self) -> None:
        """Office lost: parked tasks stay claimed in PostgreSQL for the next leader."""
        self._parked.clear()
        self._orphans_left = False

    def forget_unowned(self) -> None:
        """The term gave partitions back: their parked tasks stay claimed in PostgreSQL at
        this term's number, for their next owner to take over as orphans (never published
        here). Claims still in flight drop theirs the same way (`arm_or_park`)."""
        owns = self.horizon.owns
        if owns is not None:
            self.left_claimed.update(t.id for t in self._parked if not owns(t.id))
            self._parked = [t for t in self._parked if owns(t.id)]

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

    async def claim_due(self, epoch: int) -> bool:
        """Claim what falls due within the lookahead; return whether there was any.

        Up to `CLAIMS_IN_FLIGHT` claims run at once, so one slow round trip does not hold up
        the next window (a burst of tasks due at one instant drains at the database's pace)."""
        now = to_ms(self.clock.now())
        throttles = self.throttles
        throttles.update(now)
        nxt = self.horizon.next_due()
        behind = nxt is not None and nxt <= now  # a backlog drains: claims queue up
        until = now + (throttles.busy_lookahead(LOOKAHEAD_MS) if behind else LOOKAHEAD_MS)
        backlog_limit = None
        split_by = self.horizon.split_by  # while a backlog is split off: its `armed` cap
        if split_by is not None:
            backlog_limit = self._backlog_room(split_by.armed)
        entries = self.horizon.take_due(
            until, min(throttles.claim_limit, self.room()), backlog_limit
        )
        self._events.horizon_sized(len(self.horizon))
        if not entries:
            return False
        self._last_claim_ms = now
        await self._slots.acquire()
        owns = self.horizon.narrowed
        if owns is not None:
            # (taken before the term gave partitions back: theirs stay pending for their
            # next owner, unclaimed; a claim of them could reach PostgreSQL after its take)
            entries = [e for e in entries if owns(e[3])]
            if not entries:
                self._slots.release()
                return True
        self._claiming += len(entries)
        # each claim in flight may take a share of the byte room: one taking all that is left
        # would leave the next ones' payloads parked (claimed, fetched again later, in order)
        room = self.armed.byte_room()
        budget = max(min(room // CLAIMS_IN_FLIGHT, room - self._reserved), 1)
        self._reserved += budget
        before, self._taken = self._taken, asyncio.Event()
        running = asyncio.create_task(
            self._claim(epoch, entries, until, budget, before, self._taken), name="claim"
        )
        self._claims.add(running)
        running.add_done_callback(self._claims.discard)
        return True

    async def _claim(
        self,
        epoch: int,
        entries: list[Entry],
        until: int,
        budget: int,
        before: asyncio.Event,
        taken: asyncio.Event,
    ) -> None:
        """One claim of up to `budget` payload bytes. Claims run concurrently, but their
        results are taken in the order they were started (`before` is the previous one's),
        so a burst due at one instant still goes out in firing order."""
        try:
            ids = [e[3] for e in entries]
            sent = trace.now_ms()
            claimed = await self.tasks.claim_within(epoch, ids, from_ms(until), budget)
            if trace.on():
                trace.step("claimed", (t.id for t in (*claimed.ready, *claimed.parked)), sent=sent)
            await before.wait()
            self.arm_or_park(claimed)
        except FencedError:
            self._on_fenced(epoch)
        except Exception as exc:  # PostgreSQL away: put the batch back and let the loop retry
            log.warning("claim.failed count=%d error=%r", len(entries), exc)
            self.horizon.put_back(TaskRef(i, due, p, seq) for due, p, seq, i in entries)
            await self.clock.sleep(0.5)
        finally:
            taken.set()
            self._claiming -= len(entries)
            self._reserved -= budget
            self._slots.release()

    def arm_or_park(self, claimed: Claimed) -> None:
        """Arm what came with payloads, park the rest; nothing armed may come after a parked
        task in firing order (it would go out first), so such tasks are parked too, their
        payloads dropped until they are fetched again in order."""
        ready, parked = claimed.ready, claimed.parked
        owns = self.horizon.narrowed
        if owns is not None:
            # the term gave partitions back while this claim (or page of orphans) was in
            # flight: their tasks stay claimed for their next owner (`forget_unowned`)
            self.left_claimed.update(t.id for t in (*ready, *parked) if not owns(t.id))
            ready = [t for t in ready if owns(t.id)]
            parked = [t for t in parked if owns(t.id)]
        if parked or self._parked:
            first = firing_order(min((*parked, *self._parked), key=firing_order))
            due_ms, priority, seq = to_ms(first[0]), first[1], first[2]
            later = self.armed.take_after(due_ms, priority, seq)
            later += [t for t in ready if firing_order(t) > first]
            ready = [t for t in ready if firing_order(t) <= first]
            for task in later:
                task.payload = b""
            self._parked = sorted([*self._parked, *parked, *later], key=firing_order)
        self._arm(ready)

    async def refill(self, epoch: int) -> None:
        """Fetch parked payloads, or take over a page of orphans, within the room there is."""
        room, budget = self.room(), max(self.armed.byte_room() - self._reserved, 1)
        self._refilling = True
        try:
            if self._parked:  # they stay parked while fetched: claims finishing meanwhile
                chunk = [t.id for t in self._parked[:room]]  # must still see them
                got = await self.tasks.load_claimed(epoch, chunk, budget)
                # fetched, or no longer claimed by this leader: off the parked list
                done = set(chunk) - {t.id for t in got.parked}
                self._parked = [t for t in self._parked if t.id not in done]
                self.arm_or_park(Claimed(got.ready, []))
                return
            limit = min(self.settings.batch, room)
            got = await self.tasks.reclaim_orphans(
                epoch, self._orphan_stale, limit, budget, partitions=self.reclaim_in
            )
        except FencedError:
            self._on_fenced(epoch)
            return
        except Exception as exc:  # PostgreSQL away: try again shortly
            log.warning("reclaim.failed error=%r", exc)
            await self.clock.sleep(0.5)
            return
        finally:
            self._refilling = False
        if got.ready or got.parked:
            log.info("engine.reclaimed count=%d", len(got.ready) + len(got.parked))
        if len(got.ready) + len(got.parked) < limit:
            self._orphans_left = False  # that was the last page
        self.arm_or_park(got)

    def backlog_capped(self) -> bool:
        """True while a split backlog has tasks due but its armed share is used (armed or
        being claimed): nothing of it may be claimed until the dispatcher publishes some."""
        split_by, backlog = self.horizon.split_by, self.horizon.backlog
        if split_by is None or backlog is None:
            return False
        first = backlog.next_due_ms()
        if first is None or first > to_ms(self.clock.now()) + LOOKAHEAD_MS:
            return False
        return self._backlog_room(split_by.armed) <= 0

    def _backlog_room(self, cap: int) -> int:
        """How many more of a split backlog may be claimed under its armed `cap`: what is
        armed or being claimed counts against it (`claim_due`'s limit, `backlog_capped`)."""
        return cap - len(self.armed) - self._claiming

    def idle_seconds(self, present_only: bool = False) -> float:
        """Until the next claim: when the next task enters the lookahead, but not sooner than
        a step after the last claim, unless it would then be claimed too close to its time
        (with `present_only`: of the tasks not split off as a backlog)."""
        nxt = self.horizon.heap.next_due_ms() if present_only else self.horizon.next_due()
        if nxt is None:
            return 1.0
        at = min(max(nxt - LOOKAHEAD_MS, self._last_claim_ms + CLAIM_STEP_MS), nxt - CLAIM_LEAD_MS)
        return min(1.0, max(0.0, (at - to_ms(self.clock.now())) / 1000))
