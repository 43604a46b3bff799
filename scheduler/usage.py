"""How long a piece of work held PostgreSQL connections: measured by the store
(`scheduler.store.postgres.connect.PostgresStore.timed`), read by whoever asked for the work
(a management API listing pays for it: `scheduler.api.gate`). A module of its own so that the
operator half reads the figure without importing the store (tests/unit/test_layers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class ConnectionUse:
    """Seconds pooled connections were held (waiting for one not counted) by the code that
    measured it and the tasks it started (`measuring_use`)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


_use: ContextVar[ConnectionUse | None] = ContextVar("postgres_connection_use", default=None)


@contextmanager
def measuring_use() -> Iterator[ConnectionUse]:
    """Within: every connection use the store reports (`held`) from this task, or from the
    tasks it starts, adds to the yielded `ConnectionUse`: what a management API listing is
    charged for, so neither its wait for a connection nor its work outside its queries
    counts."""
    used = ConnectionUse()
    token = _use.set(used)
    try:
        yield used
    finally:
        _use.reset(token)


def held(seconds: float) -> None:
    """A connection was held for `seconds` (its wait for it left out): added to the measure
    open in this context, if any."""
    used = _use.get()
    if used is not None:
        used.seconds += seconds
