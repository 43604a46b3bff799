"""What both adapters of the `Broker` port share: the fence, the messages awaiting their PubAck.

A publish goes out as a core message whose reply subject is a token under one inbox of the
publisher's; the PubAck comes back there. `InFlight` keeps each token's outcome callback and
deadline (`_pending`), a limit on how many are unacknowledged (`Slots`), a sweep that fails the
overdue ones as in doubt, and the fence every send is checked against (`refusal`). The wire
adapter (`scheduler.bus.nats.publisher`) and the plain nats-py one (`scheduler.bus.nats.plain`)
differ only in how a message is framed and handed to the connection, and how an ack is read off
it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from nats.aio.client import Client

from scheduler.records import Done, Outcome, PubAck, PublishError

log = logging.getLogger(__name__)

MAX_INFLIGHT = 1000

# the common PubAck, read without a JSON parse: {"stream":"S","seq":N}
_PLAIN_ACK = re.compile(rb'\{"stream":"([^"\\]*)","seq":(\d+)\}')


class Slots:
    """A counting limit on unacknowledged messages: asyncio.Semaphore's job, but with the
    count in the open so the firing path takes a free slot without a coroutine per message."""

    __slots__ = ("_waiters", "free")

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        return self.free <= 0

    async def acquire(self) -> None:
        while self.free <= 0:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken for a slot it will not take: pass it on
                raise
        self.free -= 1

    def release(self) -> None:
        self.free += 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def settle(fut: asyncio.Future[PubAck], outcome: Outcome) -> None:
    """Resolve `fut` with a PubAck or fail it with a PublishError (once)."""
    if fut.done():
        return
    if isinstance(outcome, PubAck):
        fut.set_result(outcome)
    else:
        fut.set_exception(outcome)


class InFlight:
    """The fence and the unacknowledged messages of one term's publisher (see the module)."""

    def __init__(
        self,
        nc: Client,
        timeout: float = 5.0,
        max_inflight: int = MAX_INFLIGHT,
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self.nc = nc
        self.timeout = timeout
        self.fence = fence
        self._held = False
        self._closed = False
        self._validated = self._reconnects()
        self._slots = Slots(max_inflight)
        # token -> (outcome callback, subject, deadline on the loop's clock)
        self._pending: dict[str, tuple[Done, str, float]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._prefix = ""
        self._next = 0
        self._sub: Any = None

    @property
    def max_payload(self) -> int:
        """The server's largest message, control line and headers included."""
        return self.nc.max_payload

    def _start_reaper(self) -> None:
        self._reaper = asyncio.create_task(self._reap(), name="publisher-timeouts")

    async def _reap(self) -> None:
        """Fail publishes whose ack is overdue (one sweep a tick beats a timer per message)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(0.25, self.timeout / 4))
            now = loop.time()
            for token in [t for t, (_, _, deadline) in self._pending.items() if deadline <= now]:
                self._fail(token, "no acknowledgement in time", in_doubt=True)

    # -- the fence ----------------------------------------------------------------------------
    def _reconnects(self) -> int:
        stats = getattr(self.nc, "stats", None)
        return int(stats.get("reconnects", 0)) if isinstance(stats, dict) else 0

    def refusal(self) -> str | None:
        """Why nothing may be sent now, or None: out of office, or a reconnect (or a dropped
        link) since the owner last called `release()`, or closed."""
        if self.fence is not None and not self.fence():
            return "this instance is not in office"
        if self._held or self._reconnects() != self._validated:
            return "the connection was lost; the epoch is not revalidated yet"
        if self._closed:
            return "publisher closed"
        return None

    def may_send(self) -> bool:
        return self.refusal() is None

    def hold(self) -> None:
        """Send nothing until `release()` (the link dropped)."""
        self._held = True

    def release(self) -> None:
        """The owner revalidated its epoch on the current connection: sending may resume."""
        self._held = False
        self._validated = self._reconnects()

    # -- outcomes -----------------------------------------------------------------------------
    def _refuse(self, tokens: Sequence[str], why: str) -> None:
        for token in tokens:
            self._fail(token, f"not sent: {why}")

    def _fail(
        self, token: str, message: str, reason: str | None = None, in_doubt: bool = False
    ) -> None:
        entry = self._pending.pop(token, None)
        if entry is None:
            return
        done, subject, _ = entry
        self._slots.release()
        error = PublishError(subject, message, in_doubt=in_doubt)
        if reason is not None:
            error = PublishError(subject, message, permanent=True, reason=reason)
        try:
            done(error)
        except Exception:  # never let a callback break the client's read loop
            log.exception("publisher.callback_failed subject=%s", subject)

    def _too_large(self, token: str, subject: str, size: int) -> None:
        """Fail a message the server would refuse (and close the connection for): not sent."""
        limit = self.nc.max_payload
        message = f"{size} bytes to {subject} cannot fit the server's max_payload of {limit}"
        self._fail(token, message, reason="too_large")

    async def _stop_reaper(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None

    async def _stop_listening(self) -> None:
        """Unsubscribe from the acks and fail what is still unacknowledged, in doubt."""
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # connection already closed: nothing left to unsubscribe
                pass
            self._sub = None
        for token in list(self._pending):  # sent; their acks can no longer be matched
            self._fail(token, "publisher closed before the acknowledgement", in_doubt=True)


def parse_block(block: bytes) -> dict[str, str]:
    """The headers of a `NATS/1.0` header block, for the nats-py fallback."""
    lines = block.decode().split("\r\n")[1:]
    return dict(line.split(": ", 1) for line in lines if line)


def parse_ack(data: bytes, headers: bytes | None, subject: str) -> PubAck | PublishError:
    """The outcome a reply to a publish on `subject` says (`headers`: its raw header block)."""
    if headers:  # a status reply: "NATS/1.0 503" (no stream listens) or another error
        first = headers.split(b"\r\n", 1)[0].decode(errors="replace")
        parts = first.split(" ", 2)
        status = parts[1] if len(parts) > 1 else ""
        if status == "503":
            return PublishError(subject, f"no stream captures {subject}")
        if status:
            return PublishError(subject, f"status {status} {parts[2] if len(parts) > 2 else ''}")
    plain = _PLAIN_ACK.fullmatch(data)
    if plain is not None:
        return PubAck(plain[1].decode(), int(plain[2]), False)
    try:
        doc = json.loads(data)
    except ValueError:
        return PublishError(subject, f"unreadable PubAck {data[:80]!r}")
    if "error" in doc:
        err = doc["error"]
        return PublishError(
            subject, f"JetStream error {err.get('err_code')}: {err.get('description')}"
        )
    return PubAck(
        stream=str(doc.get("stream", "")),
        seq=int(doc.get("seq", 0)),
        duplicate=bool(doc.get("duplicate", False)),
    )
