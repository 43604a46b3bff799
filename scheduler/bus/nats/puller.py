"""A lean pull consumer: messages are handled as they arrive, no per-message future or timer.

nats-py's `fetch` waits on a future with a timeout for every message; at thousands of tasks a
second that is a large share of the daemon's CPU. Here one inbox subscription collects messages
in a buffer through a callback, and pull requests are topped up so about `batch` messages are
always requested: a steady stream flows in as soon as producers publish it, and an idle lane
costs one long-poll request per `expires`.

Pull requests live in the server that leads the consumer, for the connection that sent them:
after a reconnect they are gone, and when that server dies (or is frozen) no status will ever
say so. As nats.go's `Consume` does (ADR-37), every request asks for idle heartbeats
(`HEARTBEAT`), and the puller asks again at once after a reconnect, after a status that ends its
requests (404, 408, 409 "Leadership Change", any 4xx), and after `MISSED_HEARTBEATS` heartbeats of
silence; a request nobody answers (503: the consumer is electing a leader, no server takes it)
is sent again `NO_LEADER_PAUSE` later. A lost leader therefore costs about two heartbeats, not a
request's whole `expires`. A request that cannot be sent while disconnected is back-pressure:
nothing is counted as requested and the next `take()` tries again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, ConnectionReconnectingError, OutboundBufferLimitError

from scheduler.bus.nats.wire import message_of, raw_subscribe, status_of

log = logging.getLogger(__name__)

_DONE_STATUSES = {"404", "408", "409"}  # no messages, request expired, request ended
NO_RESPONDERS = "503"  # nobody took the request: the consumer has no leader right now
HEARTBEAT = 0.5  # s between the server's idle heartbeats (nats.go's floor; <= expires / 2)
MISSED_HEARTBEATS = 2  # heartbeats of silence after which the requests are taken as lost
NO_LEADER_PAUSE = 0.1  # s before asking again after a 503


class Puller:
    """Pulls from a durable consumer into a buffer; `take()` returns what has arrived."""

    def __init__(self, nc: Client, stream: str, consumer: str, batch: int, expires: float = 5.0):
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.batch = batch
        self.expires = expires
        self._buffer: list[Msg] = []
        self._arrived = asyncio.Event()
        self._requested = 0
        self._inbox = ""
        self._sub = None
        self._reconnects = 0
        self._heard = 0.0  # monotonic time of the last delivery or status
        self._retry_at = 0.0  # monotonic time before which no request is sent (after a 503)
        self.heartbeat = min(HEARTBEAT, expires / 2)
        self._first_at = 0.0  # monotonic time the oldest buffered message arrived

    async def start(self) -> Puller:
        self._inbox = self.nc.new_inbox()
        self._sub = await raw_subscribe(self.nc, self._inbox, self._on_raw)
        self._reconnects = self.nc.stats["reconnects"]
        self._heard = time.monotonic()
        await self._top_up()
        return self

    def _on_raw(self, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> None:
        """A delivery or a status, straight from the client's read loop (`raw_subscribe`).

        A status has no payload and no reply subject; a delivery always has a reply (its ack
        subject), so a producer's empty message with a status-like header is a delivery."""
        self._heard = now = time.monotonic()
        status = status_of(hdr) if not data and not reply else None
        if status is not None:
            if status in _DONE_STATUSES or status.startswith("4"):
                self._requested = 0  # our requests are over; take() asks again
                self._arrived.set()
            elif status == NO_RESPONDERS:
                self._requested = 0  # nobody took it: ask again shortly
                self._retry_at = now + NO_LEADER_PAUSE
            return  # 100 = idle heartbeat
        self._requested -= 1
        if not self._buffer:
            self._first_at = now
            self._arrived.set()  # once per gathering: later arrivals find it set anyway
        self._buffer.append(message_of(self.nc, subject, reply, data, hdr))

    def interrupt(self) -> None:
        """Make a waiting `take()` return now (the daemon is stopping)."""
        self._arrived.set()

    async def close(self) -> None:
        """Stop pulling; messages buffered but not taken are nak'ed so they come back at once
        (to whoever pulls next), those that arrive while the unsubscribe travels too."""
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception:  # connection already closed
                pass
            self._sub = None
        while self._buffer:
            buffered, self._buffer = self._buffer, []
            for msg in buffered:
                try:
                    await msg.nak()
                except Exception:  # connection gone: they come back after the ack wait instead
                    self._buffer = []
                    return

    def _forget_lost_requests(self) -> None:
        """Count outstanding requests as gone after a reconnect or a long silence."""
        reconnects = self.nc.stats["reconnects"]
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            if self._requested:
                log.info("puller.repull reason=reconnect requested=%d", self._requested)
            self._requested = 0
        elif self._requested and self._silent_for() > self.heartbeat * MISSED_HEARTBEATS:
            log.info("puller.repull reason=silence requested=%d", self._requested)
            self._requested = 0
            self._heard = time.monotonic()

    def _silent_for(self) -> float:
        return time.monotonic() - self._heard

    def _next_check(self, timeout: float) -> float:
        """How long `take()` may wait before the requests need looking at again: a missed
        heartbeat's deadline, or the end of a pause after a 503."""
        now = time.monotonic()
        if self._requested:
            silence_at = self._heard + self.heartbeat * MISSED_HEARTBEATS
            return max(0.0, min(timeout, silence_at - now + 0.01))
        if not self.nc.is_connected:
            return timeout  # a reconnect brings nothing before nats-py is back
        return max(0.01, min(timeout, self._retry_at - now))  # never a busy loop

    async def _top_up(self) -> None:
        self._forget_lost_requests()
        want = self.batch - self._requested
        if want < self.batch // 2 or not self.nc.is_connected:
            return  # enough asked for; or disconnected: ask again once connected
        if time.monotonic() < self._retry_at:
            return  # the consumer had no leader a moment ago: the pause is not over
        if not self._requested:
            self._heard = time.monotonic()  # silence counts from this request
        req = {
            "batch": want,
            "expires": int(self.expires * 1e9),
            "idle_heartbeat": int(self.heartbeat * 1e9),
        }
        try:
            await self.nc.publish(self.subject, json.dumps(req).encode(), reply=self._inbox)
        except (OutboundBufferLimitError, ConnectionClosedError, ConnectionReconnectingError):
            return  # the link dropped just now: back-pressure, the next take() asks again
        self._requested += want

    async def take(
        self, timeout: float, linger: float = 0.002, limit: int | None = None
    ) -> list[Msg]:
        """Wait up to `timeout` for messages, then until the oldest is `linger` old (or a whole
        batch, or `limit`, is in) to gather a batch; return them, at most a batch and `limit`.

        The linger counts from the oldest message's arrival, not from the call: messages that
        came while the caller handled the last batch are not sent on alone, one insert and its
        round trips for a handful, but wait with the next ones, none longer than `linger`.
        Messages left buffered past `limit` keep the oldest's arrival time: the next `take`
        hands them over without lingering again."""
        most = self.batch if limit is None else min(limit, self.batch)
        if not self._buffer:
            self._arrived.clear()
            try:  # woken early to re-pull when a heartbeat is missed: an empty batch
                await asyncio.wait_for(self._arrived.wait(), self._next_check(timeout))
            except TimeoutError:
                pass
        if self._buffer and len(self._buffer) < most and linger > 0:
            wait = self._first_at + linger - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        out, self._buffer = self._buffer[:most], self._buffer[most:]
        await self._top_up()
        return out
