"""A message built ahead of its firing time, and the same as a broker prepared it: pure values.

A cron occurrence's message is built while the leader is idle (`scheduler.engine.cron.message`),
its firing time left open; the term's broker (`scheduler.engine.ports.Broker.prepare`) makes it
ready to leave, and at the instant only the time is filled in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StampedMessage:
    """A message whose firing time is known only when it is sent (a cron occurrence built
    while idle): its payload is `head` + the time + `tail`, its headers `headers` with
    `Mq-Fired-At` = the time, the time written as `scheduler.clock.to_rfc3339` writes it."""

    subject: str
    head: bytes
    tail: bytes
    headers: Mapping[str, str]

    def at(self, fired_at: str) -> tuple[bytes, dict[str, str]]:
        """The payload and headers of the message fired at `fired_at` (RFC 3339 text)."""
        return self.head + fired_at.encode() + self.tail, {**self.headers, "Mq-Fired-At": fired_at}


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A `StampedMessage` as a broker prepared it ahead of its sending (`Broker.prepare`).
    The engine keeps it and hands it back to `Broker.publish_prepared`; what an adapter adds
    to it (a subclass) is the adapter's own business, and any broker can send any prepared
    message (one prepared by an earlier term's broker is sent as a fresh one)."""

    message: StampedMessage
