"""What the engine needs to know about leadership, and the single-instance stand-in.

The engine acts only while it holds office: `epoch` is its fencing token (checked by PostgreSQL
on every state change) and `may_act()` is the local self-fence (false once the lease could have
expired); `scheduler.store.postgres.epoch.take_office` starts a term.
`scheduler.leadership.election.Leadership`
implements the same protocol with a JetStream KV lease; `FixedOffice` is the stand-in for a
single instance and for engine tests.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable


class Office(Protocol):
    """The engine's view of leadership."""

    @property
    def epoch(self) -> int | None:
        """The fencing epoch while in office, else None."""
        ...

    def may_act(self) -> bool:
        """True while in office and before the local self-fence deadline."""
        ...

    async def wait_for_office(self) -> int:
        """Return the epoch once this instance takes office (at once if it holds it)."""
        ...

    @property
    def lost(self) -> asyncio.Event:
        """Set when office is lost (renew failed, deadline passed, fenced); cleared on taking it."""
        ...

    def depose(self, epoch: int | None = None) -> None:
        """End the term at once: a fenced write (or the epoch read back after a reconnect)
        showed that a newer leader exists. Afterwards `may_act()` is false, `epoch` is None and
        `lost` is set, so every loop of the term stops and nothing more is published. Calling
        it when not in office does nothing harmful; it never raises.

        `epoch` is the term whose write was fenced: when this instance holds another term by
        then (a term that ended and is still winding down while this instance took office
        again), that term is left alone, since its epoch is the newer one that fenced the
        write."""
        ...


@runtime_checkable
class Shares(Protocol):
    """An office whose terms each hold a set of partitions (P > 1,
    `scheduler.leadership.partitioned.PartitionedLeadership`): a term whose set only gains
    partitions grows in place, one whose set only loses some shrinks in place (`resized`);
    for any other change of its set it ends gracefully (`handover`) and the next term takes
    office over the new set."""

    @property
    def handover(self) -> asyncio.Event:
        """Set when the current term is to end gracefully (stop claiming, finish the batch in
        flight, as on stop), so that the next term takes office over another set."""
        ...

    def partitions_of(self, epoch: int) -> frozenset[int] | None:
        """The partitions of the term of `epoch`, as the engine starts it; None when that term
        is over already."""
        ...

    def term_ended(self, epoch: int) -> None:
        """The engine's term of `epoch` has wound down: the next one may take office."""
        ...

    async def resized(self, epoch: int) -> frozenset[int]:
        """Wait until the running term of `epoch` changes its set in place (at its own
        epoch); return the term's new set. Only a term that waits here is resized; the
        engine answers with `resize_applied`.

        A superset (a growth): the stores' office holds it already and the gained
        partitions' former owners are fenced. A subset (a shrink): the partitions left out
        are still the term's in the stores and their keys still held; the engine stops
        taking new work of them and answers once nothing of theirs is armed, in flight or
        unrecorded; only then does the office narrow the stores' office and give their
        keys back."""
        ...

    def resize_applied(self, epoch: int, ok: bool) -> None:
        """The engine's answer to the set `resized` handed the term of `epoch`. A growth:
        True once it fires the gained partitions too (their notices heard, their ready tasks
        up to the loader's cursor on the heap, their orphans to reclaim, their cron jobs
        next). A shrink: True once it fires nothing more of the partitions left out and
        everything of theirs it published is recorded (their cron jobs no longer ticked).
        False when it cannot, and the office then changes terms as before (a handover)."""
        ...


class FixedOffice:
    """Always in office with one epoch, taken from PostgreSQL at start (single instance)."""

    def __init__(self, epoch: int) -> None:
        self._epoch = epoch
        self._lost = asyncio.Event()

    @property
    def epoch(self) -> int | None:
        return None if self._lost.is_set() else self._epoch

    def may_act(self) -> bool:
        return not self._lost.is_set()

    async def wait_for_office(self) -> int:
        return self._epoch

    @property
    def lost(self) -> asyncio.Event:
        return self._lost

    def depose(self, epoch: int | None = None) -> None:
        """Mark office lost (a fenced write showed a newer leader exists), unless `epoch`
        names another term than this one."""
        if epoch is None or epoch == self._epoch:
            self._lost.set()


class TermOffice:
    """One term's view of the office: in office only while the instance holds this term's
    epoch (`LeaderEngine.run_term` hands it to the term's parts; `CronEngine` makes its own).

    A term that lost office winds down (its batch in flight, its books) while the instance may
    take office again with a newer epoch; seen through the instance's office, that old term
    would be in office again: its publisher would send, and its books would retry writes that
    the newer epoch fences, as if still leading, holding the new term back until they gave up
    (2.1 s of nothing fired after a SIGSTOP of the lease's node on a 3-node cluster)."""

    def __init__(self, office: Office, epoch: int) -> None:
        self._office = office
        self._epoch = epoch

    @property
    def epoch(self) -> int | None:
        return self._epoch if self._office.epoch == self._epoch else None

    def may_act(self) -> bool:
        return self._office.may_act() and self._office.epoch == self._epoch

    async def wait_for_office(self) -> int:
        return self._epoch

    @property
    def lost(self) -> asyncio.Event:
        return self._office.lost

    def depose(self, epoch: int | None = None) -> None:
        self._office.depose(self._epoch if epoch is None else epoch)
