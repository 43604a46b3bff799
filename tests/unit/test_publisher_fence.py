"""The publisher's fence: nothing leaves once office is gone or the link is not revalidated,
and frames still in the client's buffer are taken back."""

from __future__ import annotations

import asyncio
from typing import Any

from scheduler.bus.nats.publisher import Publisher
from scheduler.bus.nats.wire import Wire
from scheduler.records import PubAck, PublishError


class BufferedClient:
    """The client internals the raw path uses: a pending buffer nobody flushes (a silent
    link), reconnect statistics, an inbox."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._pending_data_size = 0
        self._max_payload = 1 << 20
        self._flush_queue = None
        self._transport = None  # no socket to write to: frames stay in the buffer
        self.is_connected = True
        self.stats = {"reconnects": 0, "out_msgs": 0, "out_bytes": 0}

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def _flush_pending(self) -> None:  # pragma: no cover - _flush_queue is None
        return None


def publisher(nc: BufferedClient, fence: Any = None) -> Publisher:
    p = Publisher(nc, timeout=5, fence=fence)  # type: ignore[arg-type]
    p._prefix = "_INBOX.test"  # as start() would, without a subscription
    return p


def item(n: int, outcomes: list[Any]) -> tuple[str, bytes, dict[str, str], Any]:
    return (f"mq.t.{n}", b"{}", {"Nats-Msg-Id": f"t{n}"}, outcomes.append)


async def test_frames_still_buffered_are_taken_back_when_office_ends() -> None:
    """Deliveries queued behind a silent link are removed from the client's buffer (other
    commands stay) and fail as not sent, a certain failure, not a doubt."""
    nc = BufferedClient()
    nc._pending.append(b"PING\r\n")
    outcomes: list[PubAck | PublishError] = []
    p = publisher(nc)
    await p.publish_batch([item(i, outcomes) for i in range(3)])
    nc._pending.append(b"PUB other.subject 2\r\nhi\r\n")
    assert len(nc._pending) == 5 and outcomes == []
    assert p.drop_unsent("office lost") == 3
    assert nc._pending == [b"PING\r\n", b"PUB other.subject 2\r\nhi\r\n"]
    assert nc._pending_data_size == 0  # only the taken frames were counted in it
    assert [type(o) for o in outcomes] == [PublishError] * 3
    assert all(isinstance(o, PublishError) and not o.in_doubt for o in outcomes)
    assert all("not sent" in str(o) for o in outcomes)


async def test_nothing_is_sent_out_of_office_or_after_a_reconnect_until_released() -> None:
    """A batch is refused as a whole when the fence is down, and after a reconnect until the
    owner has revalidated its epoch and called `release()`."""
    nc = BufferedClient()
    in_office = [False]
    p = publisher(nc, fence=lambda: in_office[0])
    refused: list[Any] = []
    await p.publish_batch([item(1, refused)])
    assert nc._pending == [] and "not in office" in str(refused[0])
    in_office[0] = True
    nc.stats["reconnects"] = 1
    held: list[Any] = []
    await p.publish_batch([item(2, held)])
    assert nc._pending == [] and "not revalidated" in str(held[0])
    p.release()
    await p.publish_batch([item(3, [])])
    assert len(nc._pending) == 1 and nc._pending[0].startswith(b"HPUB mq.t.3 _INBOX.test.")


async def test_what_went_out_on_the_old_link_is_sent_again_once_revalidated() -> None:
    """Publishes still unanswered when the link was replaced (its node froze: the frames
    wait in that node) are sent again, the same frames, as soon as the owner releases the
    publisher on the new link; not before, not on a release without a reconnect, and not a
    frame without a Nats-Msg-Id."""
    nc = BufferedClient()
    p = publisher(nc)
    p._resender = asyncio.create_task(p._resend_loop())  # as start() would
    outcomes: list[Any] = []
    await p.publish_batch([item(i, outcomes) for i in range(3)])
    sent = list(nc._pending)
    # a KV write (no Nats-Msg-Id): a second copy could land after a newer write of its key
    await p.publish_batch([("$KV.S.cron.a", b"{}", {}, outcomes.append)])
    nc._pending.clear()  # written to the socket of the link that then froze
    p.release()  # no reconnect: nothing to resend
    await asyncio.sleep(0)
    assert nc._pending == []
    p.on_link_lost()
    nc.stats["reconnects"] = 1
    await asyncio.sleep(0)
    assert nc._pending == []  # held until revalidated
    p.release()
    async with asyncio.timeout(1):
        while len(nc._pending) < 3:  # noqa: ASYNC110
            await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert nc._pending == sent and outcomes == []  # the KV write is not among them
    await p.close()


async def test_an_unacknowledged_publish_is_in_doubt() -> None:
    """A publish that went out and timed out, or was still unacknowledged when the publisher
    closed, is reported in doubt (it may be stored); one never sent is not."""
    nc = BufferedClient()
    p = publisher(nc)
    p.timeout = 0.05
    outcomes: list[Any] = []
    await p.publish_batch([item(1, outcomes)])
    nc._pending.clear()  # "written to the socket"
    p._reaper = asyncio.create_task(p._reap())
    async with asyncio.timeout(2):
        while not outcomes:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await p.publish_batch([item(2, outcomes)])
    nc._pending.clear()
    await p.close()
    assert [(o.in_doubt, str(o)) for o in outcomes] == [
        (True, "no acknowledgement in time"),
        (True, "publisher closed before the acknowledgement"),
    ]


def test_reply_of_reads_only_publish_commands() -> None:
    """The reply subject is read from PUB and HPUB frames (with or without one), nothing else."""
    from scheduler.bus.nats.wire import _reply_of

    assert _reply_of(b"HPUB a.b _I.1 10 12\r\n...") == b"_I.1"
    assert _reply_of(b"HPUB a.b 10 12\r\n...") is None
    assert _reply_of(b"PUB a.b _I.2 3\r\nabc\r\n") == b"_I.2"
    assert _reply_of(b"PUB a.b 3\r\nabc\r\n") is None
    assert _reply_of(b"SUB a.b 1\r\n") is None
    assert Wire(BufferedClient()).take_unsent(b"_I.") == []  # type: ignore[arg-type]
