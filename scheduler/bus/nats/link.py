"""A link to a node that stopped answering, noticed in about a second, and left for another node.

nats-py notices a silent server by its own pings: `ping_interval` 2 s and 2 outstanding, so
4-6 s into a freeze (a node SIGSTOPped, a VM paused, a half-open route). On a cluster that is
seconds of nothing fired while the other nodes take writes, and a leader whose renewals go to
the frozen node can lose its lease meanwhile. The watch here sends a PING of its own every
`PROBE_EVERY` and calls the link stale when its PONG is missing for `stale_after` seconds of
the loop's own attention: a tick of the watch that came late (the loop was busy or the host
starved it) restarts the count, and so does any message that came in meanwhile (a server that
sends is not frozen, it is slow to answer a PING behind a backlog). A stale link is closed and
the client reconnects to another node of the pool (`ServerChoice`), not the silent one.

Turned off with `SCHEDULER_NATS_STALE_AFTER=0` (nats-py's own pings then decide alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

log = logging.getLogger(__name__)

TICK = 0.05  # s between two looks of the watch
PROBE_EVERY = 0.25  # s from a PONG to the next PING
# A tick this much later than TICK means the loop itself was held up: the PONG may be waiting
# in the socket for the loop to read it, so the silence counts again from then.
LAG_LIMIT = 0.2
AVOID_FOR = 30.0  # s a node called stale is passed over by the reconnect, while others answer


@dataclass(slots=True)
class Silence:
    """How long the outstanding PING has gone unanswered, counted only while the loop was
    attentive and nothing came in. Pure: fed the loop's clock, the inbound message count and
    whether a PING waits; `look` says whether the link is stale."""

    stale_after: float
    lag_limit: float = LAG_LIMIT
    tick: float = TICK
    _last_look: float | None = None
    _since: float | None = None
    _inbound: int = -1

    def look(self, now: float, inbound: int, waiting: bool) -> bool:
        late = self._last_look is not None and now - self._last_look > self.tick + self.lag_limit
        self._last_look = now
        if not waiting:
            self._since = None
            return False
        if self._since is None or late or inbound != self._inbound:
            self._since, self._inbound = now, inbound
            return False
        return now - self._since >= self.stale_after

    def silent_for(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since


@dataclass(slots=True)
class ServerChoice:
    """nats-py's `reconnect_to_server_handler`: the next node to try. Nodes called stale in
    the last AVOID_FOR seconds and the node just lost are passed over while another is
    eligible; among the rest, the one this choice tried longest ago (never tried first), at
    random among equals: a node that just failed goes to the back. A node tried less than
    `wait` seconds ago is tried again only after the rest of `wait` (nats-py's
    `reconnect_time_wait`, which it does not apply when a handler chooses). Not nats-py's
    failure counts: they are kept for a node since its last success, however long ago."""

    wait: float = 1.0
    clock: Callable[[], float] = time.monotonic
    _avoid: dict[str, float] = field(default_factory=dict)  # netloc -> until (clock)
    _tried: dict[str, float] = field(default_factory=dict)  # netloc -> when chosen (clock)
    _lost: str | None = None

    def stale(self, netloc: str) -> None:
        self._avoid[netloc] = self.clock() + AVOID_FOR

    def lost(self, netloc: str | None) -> None:
        self._lost = netloc

    def __call__(self, servers: list[Any], info: dict[str, Any]) -> tuple[Any, float]:
        now = self.clock()
        self._avoid = {n: until for n, until in self._avoid.items() if until > now}
        fresh = [s for s in servers if s.uri.netloc not in self._avoid]
        others = [s for s in fresh if s.uri.netloc != self._lost] or fresh or servers
        self._lost = None  # passed over once: if it is the only one left, it is tried next
        never = float("-inf")
        oldest = min(self._tried.get(s.uri.netloc, never) for s in others)
        chosen = random.choice(
            [s for s in others if self._tried.get(s.uri.netloc, never) == oldest]
        )
        self._tried[chosen.uri.netloc] = now
        return chosen, max(0.0, oldest + self.wait - now)


class LinkWatch:
    """The watch on one client: a task from `start` until `stop`, for the life of the
    connection (it survives reconnects)."""

    def __init__(
        self,
        nc: Client,
        stale_after: float,
        choice: ServerChoice,
        on_stale: Callable[[str, float], None],
    ) -> None:
        self.nc = nc
        self.stale_after = stale_after
        self.choice = choice
        self.on_stale = on_stale
        self._task: asyncio.Task[None] | None = None

    def start(self) -> LinkWatch:
        self._task = asyncio.create_task(self._run(), name="nats-link-watch")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        nc = self.nc
        silence = Silence(self.stale_after)
        probe: asyncio.Future[bool] | None = None
        probe_link = -1  # the reconnect count the probe was sent on
        answered = loop.time()
        while True:
            await asyncio.sleep(TICK)
            now = loop.time()
            if not nc.is_connected or nc.is_reconnecting:
                probe = None  # its PONG died with the old link: nats-py dropped its future
                silence.look(now, 0, waiting=False)
                continue
            link = nc.stats["reconnects"]
            if probe is not None and (probe.done() or probe_link != link):
                probe = None
                answered = now
            if probe is None and now - answered >= PROBE_EVERY:
                try:
                    probe, probe_link = await _probe(nc), link
                except (AssertionError, AttributeError, OSError, RuntimeError):
                    continue  # the link went between the look and the PING: looked at again
            inbound = nc.stats["in_msgs"]
            if silence.look(now, inbound, waiting=probe is not None):
                silent = silence.silent_for(now)
                netloc = nc.connected_url.netloc if nc.connected_url else "?"
                self.choice.stale(netloc)
                self.on_stale(netloc, silent)
                probe = None
                silence.look(now, inbound, waiting=False)
                await nc.force_reconnect()


async def _probe(nc: Client) -> asyncio.Future[bool]:
    """A PING, and the future its PONG resolves. Not `flush(timeout)`: a timed-out flush
    cancels its future but leaves it in nats-py's list of PONG waiters, and the PONG that
    comes later then breaks the client's read loop (InvalidStateError). This future is never
    cancelled: it is resolved by its PONG or dropped with the link (nats-py clears the list on
    a reconnect); nothing waits on it, so nothing is left pending at a close."""
    future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    await nc._send_ping(future)  # nats-py's own PING with a waiter (wire.py pins its range)
    return future
