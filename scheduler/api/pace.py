"""The pace of the HTTP edge: how many socket reads its listeners handle per second.

Every other bound of the edge caps one kind of request (a body, a head's time, a listing's rows,
the admission slots); none caps how fast requests come. A client looping on anything cheap (a
cached `/metrics`, a 401, a 503 it does not wait out) made the edge parse 5,000-10,000 requests
a second, about 0.9 of a core, and firing on a 2-core host waited for a core behind it (p99 2x
quiet). Here every read of a connection's socket takes a token from one bucket per process,
shared by the API's and the metrics' listeners (`SCHEDULER_API_MAX_READS_PER_SECOND`, refilled
at that rate and holding a tenth of a second of it, so a console page's burst of requests goes
through at once). A read that finds the bucket empty waits its turn: its bytes are held, the
connection stops reading (what the client sends next stays in the kernel's buffers, then its
own), and they are handed to the HTTP parser when the bucket has paid for them. Nothing is
refused and nothing is parsed early, so a flood costs the edge a bounded share of a core and a
client that waits costs nothing; the head's deadline keeps running while a connection waits,
so a crowd of connections cannot be parked for ever. 0 turns the pace off.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Pace:
    """A token bucket of reads: `reserve()` takes one and says how long to wait before the
    read may be handled (0 when the bucket held a token). The bucket may go into debt: each
    waiting read has its place in line, so reads are handled at the rate, in arrival order."""

    def __init__(
        self, per_second: int, clock: Callable[[], float] = time.monotonic, burst: float = 0.1
    ) -> None:
        """`burst`: the seconds of the rate the bucket holds (what goes through at once)."""
        self.per_second = per_second
        self.capacity = max(1.0, per_second * burst)
        self.tokens = self.capacity
        self.clock = clock
        self.at = clock()

    def reserve(self) -> float:
        if self.per_second <= 0:
            return 0.0
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.per_second

    def take(self) -> bool:
        """Take a token if the bucket holds one now; False (and nothing taken, no place in
        line) otherwise: for callers that drop what is past the pace instead of waiting."""
        if self.reserve() == 0.0:
            return True
        self.tokens += 1
        return False


_PACES: dict[tuple[str, int], Pace] = {}


def shared_pace(per_second: int, of: str = "reads", burst: float = 0.1) -> Pace:
    """The process's one pace `of` reads (or connections) at `per_second` (both listeners of
    an edge share it)."""
    pace = _PACES.get((of, per_second))
    if pace is None:
        pace = _PACES[(of, per_second)] = Pace(per_second, burst=burst)
    return pace
