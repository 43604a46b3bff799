"""Deadlines on an HTTP connection: a request's head, and an idle keep-alive connection.

uvicorn times out only a keep-alive connection that stays silent, and any byte cancels that
timer: a client that sends a request's head one byte at a time (slowloris), or a fresh
connection that sends nothing, holds the connection for ever. Here the head of every request
must be complete within `header_timeout` of its first byte (of the connection's opening, for the
first request): past it the client gets 408 and the connection closes. Bytes trickled on an idle
keep-alive connection start a request's head, so they do not extend the idle timeout by more
than the head's deadline. The body's own deadline is the edge's (`scheduler.api.edge.BodyGuard`),
which reads it before the app runs.

Connections themselves are bounded too. Reads keep a pace (`scheduler.api.pace`), but a client
that opens a new connection for every request (an endless chunked GET was answered 400 and
closed, and the client came straight back: 570 connections a second from one client; it is
held unread now and answered after `HELD_ANSWER_WAIT`, `scheduler.api.lingering`) costs
the edge an accept, a protocol, an answer and a close each, beyond its read: new connections
keep a pace of their own (`SCHEDULER_API_MAX_CONNECTIONS_PER_SECOND`, a second's worth at
once), and one past it is accepted but not read until its turn (the head's deadline runs from
its opening, so a crowd waiting is cut at it). At most `SCHEDULER_API_MAX_CONNECTIONS` are open
at once per process (both listeners): one more is closed as soon as it is accepted, before any
byte of it is read, and logged at most once a second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import h11

from scheduler.api.lingering import DROPPED_BYTES, LingeringH11Protocol
from scheduler.api.pace import Pace, shared_pace
from scheduler.settings import Settings

log = logging.getLogger(__name__)

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # GET, HEAD, DELETE, OPTIONS take none

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Seconds a request's head may take (`SCHEDULER_API_HEADER_TIMEOUT`) and an idle
    keep-alive connection may stay open (`SCHEDULER_API_IDLE_TIMEOUT`, whole seconds: uvicorn's
    `timeout_keep_alive`)."""

    header_timeout: float = 10.0
    idle_timeout: int = 5
    reads_per_second: int = 500  # `SCHEDULER_API_MAX_READS_PER_SECOND` (scheduler.api.pace)
    connections_per_second: int = 100  # `SCHEDULER_API_MAX_CONNECTIONS_PER_SECOND`
    max_open: int = 500  # `SCHEDULER_API_MAX_CONNECTIONS`

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        idle = max(1, round(settings.api_idle_timeout.total_seconds()))
        return cls(
            settings.api_header_timeout.total_seconds(),
            idle,
            settings.api_max_reads_per_second,
            settings.api_max_connections_per_second,
            settings.api_max_connections,
        )


class OpenConnections:
    """The connections open at once in this process, against a bound."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.open = 0
        self.refused = 0  # since the last log line
        self.logged_at = 0.0

    def admit(self) -> bool:
        if self.open >= self.bound:
            self.refused += 1
            now = time.monotonic()
            if now - self.logged_at >= 1.0:
                log.warning(
                    "api.connections_full open=%d refused=%d (SCHEDULER_API_MAX_CONNECTIONS)",
                    self.open,
                    self.refused,
                )
                self.logged_at, self.refused = now, 0
            return False
        self.open += 1
        return True

    def closed(self) -> None:
        self.open -= 1


_OPEN: dict[int, OpenConnections] = {}


def shared_open(bound: int) -> OpenConnections:
    """The process's one count of open connections at `bound` (both listeners share it)."""
    count = _OPEN.get(bound)
    if count is None:
        count = _OPEN[bound] = OpenConnections(bound)
    return count


def protocol_for(limits: ConnectionLimits) -> type[HeadDeadlineProtocol]:
    """The connection protocol class uvicorn builds per connection, with these limits."""

    class Bounded(HeadDeadlineProtocol):
        header_timeout = limits.header_timeout
        pace = shared_pace(limits.reads_per_second)
        accepts = shared_pace(limits.connections_per_second, of="connections", burst=1.0)
        open_connections = shared_open(limits.max_open)

    return Bounded


class HeadDeadlineProtocol(LingeringH11Protocol):
    """uvicorn's h11 protocol (lingering on close) whose request heads have a deadline, and
    whose reads keep the edge's pace (`scheduler.api.pace`)."""

    header_timeout = 10.0
    pace = Pace(0)
    accepts = Pace(0)
    open_connections: OpenConnections | None = None  # `connections` is uvicorn's own set
    _counted = False
    _dropping = False  # the rest of this connection's bytes: a body no route reads
    _head_timer: asyncio.TimerHandle | None = None
    _held: bytearray | None = None  # a read waiting for its turn, with what came after it
    _pace_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.open_connections is not None:
            if not self.open_connections.admit():
                transport.abort()  # nothing read, nothing answered: the bound is the point
                return
            self._counted = True
        super().connection_made(transport)
        self._arm_head_timer()
        wait = self.accepts.reserve()
        if wait > 0:  # its turn among new connections: read nothing of it until then
            self._held = bytearray()
            self.transport.pause_reading()
            self._pace_timer = self.loop.call_later(wait, self._paced)

    def data_received(self, data: bytes) -> None:
        if self._held is not None:  # a read waits for its turn: keep the order, read no more
            self._held += data
            self.transport.pause_reading()
            return
        wait = self.pace.reserve()
        if wait > 0:
            if self.conn.their_state is h11.IDLE:
                self._arm_head_timer()  # a head begins, though unparsed: its deadline runs
            self._held = bytearray(data)
            self.transport.pause_reading()
            self._pace_timer = self.loop.call_later(wait, self._paced)
            return
        self._handle(data)

    def _paced(self) -> None:
        """The held read's turn: hand it to the parser and read on (unless uvicorn paused
        reading itself meanwhile, or the connection is closing)."""
        self._pace_timer = None
        data, self._held = bytes(self._held or b""), None
        if self.transport.is_closing():
            return
        if not self.flow.read_paused:
            self.transport.resume_reading()
        if data:  # nothing yet, after a new connection's turn (an empty read would end it)
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        if self._dropping:  # the body of a request whose method takes none: never parsed
            if self.linger is not None:
                self.linger.discard(len(data))
            return
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # the first byte of a head (no-op when already armed)
            end = data.find(b"\r\n\r\n")
            if 0 <= end < len(data) - 4:  # a head and what follows it: the head alone first
                head, data = data[: end + 4], data[end + 4 :]
                super().data_received(head)
                if self._body_unread():
                    return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()  # the head is in: the body has the edge's deadline

    def _body_unread(self) -> bool:
        """After a head: when its method takes no body (GET, HEAD, DELETE, OPTIONS) and a body
        follows, the edge answers without reading it (`scheduler.api.edge.BodyGuard`): what
        arrived of it with the head is dropped here, unparsed, and nothing more is read (the
        connection is held, `LingeringTransport.hold`: answered `HELD_ANSWER_WAIT` after the
        head, ended `LINGER_SECONDS` after it). An endless chunked body of one-byte chunks
        cost h11 ~0.7 of a core to parse, 200 connections a second, before the 400 that
        refused it was even sent; read and dropped up to 64 KiB a connection, it came back
        for a new one 210 times a second."""
        if self.conn.their_state is not h11.SEND_BODY or self.scope is None:
            return False
        if self.scope["method"] in BODY_METHODS:
            return False
        self._dropping = True
        if self.linger is not None:  # what came with the head is dropped; then nothing is read
            self.linger.limit = DROPPED_BYTES
            self.linger.hold()
        self._cancel_head_timer()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted and self.open_connections is not None:
            self._counted = False
            self.open_connections.closed()
        if self.transport is None:
            return  # refused at `connection_made`: nothing was set up
        self._cancel_head_timer()
        if self._pace_timer is not None:
            self._pace_timer.cancel()
            self._pace_timer = None
        self._held = None
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_too_slow)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return  # a head arrived meanwhile (pipelined): its request runs
        detail = (
            f"the request's head did not arrive within {self.header_timeout:g}s "
            "(SCHEDULER_API_HEADER_TIMEOUT)\n"
        ).encode()
        log.info("api.header_timeout client=%s", _client(self.client))
        self.transport.write(_TIMED_OUT % (len(detail), detail))
        self.transport.close()


def _client(client: Any) -> str:
    return f"{client[0]}:{client[1]}" if client else "-"
