"""The bound on management API requests that may query PostgreSQL at once.

Operator reads run on the API's own small pool (`SCHEDULER_API_POOL_SIZE` connections, each
statement cut at `SCHEDULER_API_STATEMENT_TIMEOUT`), so they never take a connection the engine
needs. In front of that pool, at most `SCHEDULER_API_MAX_CONCURRENT` requests are admitted at a
time (those beyond the pool's size wait for a connection); one more is answered 503 with
`Retry-After` at once instead of queueing, so a crowd of readers costs a bounded amount of the
daemon's event loop and memory however many clients loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

RETRY_AFTER_SECONDS = 1


class Overloaded(Exception):
    """Every admission slot is taken: answer 503 with Retry-After."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} API requests are already querying PostgreSQL")
        self.limit = limit


class QueryGate:
    """Counts admitted requests; `slot()` admits one or raises Overloaded, never waits."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.admitted = 0

    @contextmanager
    def slot(self) -> Iterator[None]:
        if self.admitted >= self.limit:
            raise Overloaded(self.limit)
        self.admitted += 1
        try:
            yield
        finally:
            self.admitted -= 1
