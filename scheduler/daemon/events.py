"""What the daemon reports as it happens, with the events of its store, its API and its
operations; `scheduler.metrics.Metrics` listens (metrics are fed from events: the daemon's
modules update no instrument)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from scheduler.api.events import ApiEvents
from scheduler.operations.events import OperationsEvents
from scheduler.store.postgres.events import StoreEvents


class DaemonEvents(StoreEvents, ApiEvents, OperationsEvents, Protocol):
    def daemon_started(self, version: str, instance: str) -> None:
        """A daemon of `version` started as `instance`."""
        ...

    def standing_by(self) -> None:
        """The daemon is ready to campaign and does not lead (yet)."""
        ...

    def term_partitions(self, held: int, gained: int) -> None:
        """A term over `held` partitions began (P > 1), `gained` of them not in this engine's
        previous term."""
        ...

    def partition_map_read(self, owners: Mapping[str, Sequence[int]], unowned: int) -> None:
        """The edge read the lease bucket: each owner's partitions, and how many nobody holds."""
        ...

    def postgres_connected(self) -> None:
        """The PostgreSQL pool is open."""
        ...

    def dead_letters_deleted(self, count: int) -> None:
        """The housekeeping deleted `count` dead letters past SCHEDULER_DLQ_MAX_AGE."""
        ...

    def activity_deleted(self, count: int) -> None:
        """The housekeeping deleted `count` activity-log rows past their retention."""
        ...

    def loop_lag_measured(self, seconds: float) -> None:
        """The event loop ran a timer `seconds` late."""
        ...
