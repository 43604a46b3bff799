"""The bound on management API requests that may query PostgreSQL at once.

Operator reads run on the API's own small pool (`SCHEDULER_API_POOL_SIZE` connections, each
statement cut at `SCHEDULER_API_STATEMENT_TIMEOUT`), so they never take a connection the engine
needs. In front of that pool, at most `SCHEDULER_API_MAX_CONCURRENT` requests are admitted at a
time (those beyond the pool's size wait for a connection); one more is answered 503 with
`Retry-After` at once instead of queueing, so a crowd of readers costs a bounded amount of the
daemon's event loop and memory however many clients loop.

The bound on concurrency does not bound throughput: eight requests that each take a few
milliseconds, replaced at once as they finish, still read hundreds of pages a second, and the
database and the daemon's loop serving them take the cores the firing needs. So listings also
draw from a budget of `SCHEDULER_API_READ_ROWS_PER_SECOND` rows: a token bucket that holds one
page (MAX_LIMIT rows) and refills at that rate, so pages are spread over the second instead of
arriving as a burst that holds the loop for several pages in a row. A page charges its `limit`
before it queries; when the bucket cannot pay it at once it waits (asleep, holding its
admission slot) until it can, up to a second; a page that would wait longer is answered 503
with `Retry-After` the seconds until it could. After its query a page also pays for the work
it did: the time its queries held PostgreSQL connections, at `WORK_ROWS_PER_SECOND` rows a
second, beyond the rows it paid (`settle`), so a `limit=1` page whose filter matches nothing
but scans the table for 200 ms costs what the full pages it kept from running would have.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
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

    @property
    def full(self) -> bool:
        """Whether `slot()` would refuse now (the edge asks before routing)."""
        return self.admitted >= self.limit

    @contextmanager
    def slot(self) -> Iterator[None]:
        if self.admitted >= self.limit:
            raise Overloaded(self.limit)
        self.admitted += 1
        try:
            yield
        finally:
            self.admitted -= 1


MAX_WAIT = 1.0  # seconds a listing may wait for the rows budget before it is refused
# Rows a listing's second of work is worth: at the default budget (10,000 rows/s) the listings'
# queries get an eighth of a second each second (a quarter at the former 20,000, when firing's
# p99 under a flood of empty filters was 1.7-1.8x its quiet figure, 1.22x at 10,000:
# bench/README.md, host Q). It was 10,000 (what full pages cost: a 500-row
# page of pending tasks took 43-74 ms of handler time on a busy 2-core host), which let a flood
# of `limit=1` listings whose filters match nothing keep PostgreSQL busy for more than a core:
# firing's p99 went to 10.5 ms against 2 quiet (bench/edge_attacks.py), 4.1-5 ms at 80,000. A
# page whose filter matches nothing but scans for 200 ms pays 16,000 rows.
WORK_ROWS_PER_SECOND = 80_000


class OutOfBudget(Exception):
    """The rows budget cannot pay this page now: answer 503 with Retry-After `retry_after`."""

    def __init__(self, per_second: int, retry_after: int) -> None:
        super().__init__(f"the API's budget of {per_second} rows/s is spent")
        self.per_second = per_second
        self.retry_after = retry_after


class RowBudget:
    """A token bucket refilled at `per_second` rows and holding one `page` of rows.

    `reserve(n)` takes `n` rows and says how long to wait before querying (0 when the bucket
    holds them): the bucket may go into debt by up to `MAX_WAIT` seconds of rows, so pages are
    served back to back at the rate, each one later than the last, and a lone client paging
    through a list gets the whole rate. A page that would wait longer raises OutOfBudget and
    takes nothing. 0 rows/s turns the budget off."""

    def __init__(
        self, per_second: int, page: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_second = per_second
        self.capacity = float(page)
        self.tokens = self.capacity
        self.clock = clock
        self.at = clock()

    def reserve(self, rows: int) -> float:
        if self.per_second <= 0:
            return 0.0
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        wait = max(0.0, (rows - self.tokens) / self.per_second)
        if wait > MAX_WAIT:
            raise OutOfBudget(self.per_second, max(1, math.ceil(wait)))
        self.tokens -= rows
        return wait

    def refusal(self, rows: int) -> int | None:
        """The Retry-After `reserve(rows)` would refuse with now, or None when it would pay
        (nothing is taken either way): for refusing before routing."""
        if self.per_second <= 0:
            return None
        tokens = min(self.capacity, self.tokens + (self.clock() - self.at) * self.per_second)
        wait = (rows - tokens) / self.per_second
        return max(1, math.ceil(wait)) if wait > MAX_WAIT else None

    def settle(self, paid: int, seconds: float) -> int:
        """After a page's query ran for `seconds`: charge the rows that work was worth
        (`WORK_ROWS_PER_SECOND`) beyond the `paid` ones, putting the bucket in debt that later
        pages wait for or are refused by. Returns the rows charged."""
        if self.per_second <= 0:
            return 0
        extra = max(0, math.ceil(seconds * WORK_ROWS_PER_SECOND) - paid)
        self.tokens -= extra
        return extra
