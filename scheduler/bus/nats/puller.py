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
requests (404, 408, 409 "Leadership Change", any 4xx), and after `MISSED_HEARTBEATS` heartbeats
of silence; a request nobody answers (503: the consumer is electing a leader, no server takes
it) is sent again `NO_LEADER_PAUSE` later. A lost leader therefore costs about two heartbeats,
not a request's whole `expires`. Requests can also stay alive but unserved: on a 3-node cluster,
after the consumer's leader was frozen and thawed, requests sent into the freeze got idle
heartbeats and no message until they expired while the lane filled (4.2 s of tasks late). So
each consumer check (below) that finds messages undelivered, the consumer below its ack limit
and nothing delivered here for `RECHECK_AFTER` asks again and checks once more (`UNSERVED_TRIES`
at most). A request that cannot be sent while disconnected is back-pressure: nothing is counted
as requested and the next `take()` tries again.

Deliveries can be lost on the way too: the consumer's leader hands a message to the inbox's
interest, and when that interest is a node that froze (or died) the message goes with it; the
consumer counts it as delivered and sends it again only after the ack wait (10 s). Measured on
a 3-node cluster with a frozen node: 1-2 s of tasks 8.5 s late. So the puller notices what it
missed, from the sequences every delivery's ack subject carries: a jump in the consumer's
sequence between two deliveries (the stream sequences between them were delivered elsewhere),
and, after a reconnect, a silence or a leadership change (`RECHECK_AFTER` later) and when it
starts, the consumer's own count (`CONSUMER.INFO`: delivered beyond the last delivery seen, or,
for a new puller, everything unacknowledged above the ack floor: a previous holder's). What it
missed it reads back from the stream by sequence (`STREAM.MSG.GET`, `RECOVER_MAX` at most) and
hands over as `RecoveredMsg`s, ahead of the rest: intake stores them at once, and the lost
delivery, sent again after the ack wait, finds them stored (an exact resend) and is acked.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, ConnectionReconnectingError, OutboundBufferLimitError

from scheduler.bus.nats.wire import (
    RecoveredMsg,
    forget_raw,
    message_of,
    raw_subscribe,
    status_of,
)

log = logging.getLogger(__name__)

_DONE_STATUSES = {"404", "408", "409"}  # no messages, request expired, request ended
NO_RESPONDERS = "503"  # nobody took the request: the consumer has no leader right now
HEARTBEAT = 0.5  # s between the server's idle heartbeats (nats.go's floor; <= expires / 2)
MISSED_HEARTBEATS = 2  # heartbeats of silence after which the requests are taken as lost
NO_LEADER_PAUSE = 0.1  # s before asking again after a 503
RECHECK_AFTER = 0.5  # s after a reconnect, silence or leader change before asking the consumer
FRESH_CHECK = 0.1  # s after a puller starts (or is asked to `reread`) before its read-back
# Consumer checks without an answer (the consumer elects a leader: 4-9 s) before the gaps are
# left to the ack wait, RECHECK_PAUSE apart: about the ack wait itself.
RECHECK_TRIES = 40
RECHECK_PAUSE = 0.25
# Checks in a row that may find requests unserved (see `_recover`) before the requests' own
# expiry is left to end them.
UNSERVED_TRIES = 20
# s after an incident (a reconnect, a silence, a check nobody answered) during which requests
# that are outstanding while nothing is delivered keep being looked at, RECHECK_AFTER apart,
# even when a check finds the lane empty: a lane whose own leader was still being elected
# then fills while the requests, alive but unserved, wait for their expiry (tasks ~5 s late
# in the cluster suite's frozen-node test, on a loaded host). About two requests' expiry.
INCIDENT_WATCH = 10.0
RECOVER_MAX = 4  # batches: a larger gap is left to the ack wait (a backlog, not a loss)...
# ...unless few of it are unacknowledged (most of the range acknowledged and gone: the walk
# costs a read per message still stored, see `_read_back`) and it spans at most this many
# batches: a new term's read-back spans every delivery since the oldest unacknowledged one,
# 6,000 sequences 3 s after a kill at 2,000 tasks/s, and skipping it left the dead engine's
# batch in flight to the ack wait (8 s late in bench/partitions.py).
RECOVER_SPAN = 64
RECOVER_AT_ONCE = 64  # STREAM.MSG.GET requests in flight together (segments walked at once)
RECOVER_TIMEOUT = 1.0  # s for each request of a recovery
# Messages a shared puller (P > 1) asks for while the lane flows steadily: what a dead engine
# was handed and had not stored waits for the survivors' read-back, a lease TTL later (46 such
# tasks, 1.3 % of the others', in a kill run of bench/partitions.py on a loaded host, when each
# engine asked for a whole batch). The window doubles while takes come back full (a backlog)
# up to the batch, and falls back as they shrink.
SHARED_WINDOW = 32
CLOSE_FLUSH = 1.0  # s for the round trip that brings in what was sent before the unsubscribe
# s for the consumer check: take() waits for it, so a check sent to a consumer leader that does
# not answer (frozen, electing) must not hold intake for a whole second; it is asked again
# RECHECK_PAUSE later, and at once when the consumer is heard from again.
CHECK_TIMEOUT = 0.25


class Puller:
    """Pulls from a durable consumer into a buffer; `take()` returns what has arrived."""

    def __init__(
        self,
        nc: Client,
        stream: str,
        consumer: str,
        batch: int,
        expires: float = 5.0,
        shared: bool = False,
    ):
        self.nc = nc
        # `shared`: other pullers take from the same consumer (under P > 1 every engine runs
        # intake): a jump in its sequences, or deliveries beyond this puller's, are theirs, not
        # lost, so they are not read back (a lost one comes back after the ack wait); read
        # back, every engine re-read and re-stored the others' tasks: 32,000-80,000 reads in
        # a 40,000-task kill run of bench/partitions.py, the lane 18,000 behind. A new
        # puller still reads back what was unacknowledged when it started, once: a killed
        # engine's batch in flight is among it (else it waits for the ack wait, 10 s).
        self.shared = shared
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.batch = batch
        self.window = min(batch, SHARED_WINDOW) if shared else batch  # most asked for at once
        self.expires = expires
        self._buffer: list[Msg] = []
        self._arrived = asyncio.Event()
        self._requested = 0
        self._inbox = ""
        self._sub = None
        self._reconnects = 0
        self._heard = 0.0  # monotonic time of the last delivery or status
        self._delivered_at = 0.0  # monotonic time of the last delivery
        self._unserved = 0  # checks in a row that found the requests unserved
        self._watch_until = 0.0  # monotonic time an incident's watch ends (INCIDENT_WATCH)
        self._interrupted = False  # `interrupt()` called: the waiting `take()` returns
        self._retry_at = 0.0  # monotonic time before which no request is sent (after a 503)
        self.heartbeat = min(HEARTBEAT, expires / 2)
        self._first_at = 0.0  # monotonic time the oldest buffered message arrived
        # What was delivered to this puller (from each delivery's ack subject), to find what was
        # lost on the way (see the module's docstring).
        self.stream, self.consumer = stream, consumer
        self._cseq = 0  # the highest consumer sequence delivered here (0: none yet)
        self._sseq = 0  # the highest stream sequence delivered here
        self._gaps: list[tuple[int, int]] = []  # stream sequences (lo, hi], delivered elsewhere
        self._check_at: float | None = None  # monotonic time to ask the consumer; None: no need
        self._recover_failed = False  # said once in the log
        self._check_failures = 0  # consumer checks without an answer in a row
        self._fresh = False  # started, the first consumer check not made yet
        self._since_start: set[int] = set()  # stream sequences delivered here until then
        self.recovered = 0  # messages read back from the stream, in all

    async def start(self) -> Puller:
        # What a previous holder was handed and did not acknowledge is read back FRESH_CHECK
        # from now, leaving out what this puller was handed meanwhile. Whatever is still on its
        # way (a term that just ended acknowledging its last batch; under P > 1 the other
        # engines' deliveries in flight) is read and stored twice, harmlessly (intake skips a
        # stored id, the target's duplicate window a second send), so it looks soon: what a
        # dead leader or engine was handed is a lease TTL late already. It looked after
        # RECHECK_AFTER (0.5 s) under P = 1: tasks 0.4 s later than the broker's outage in the
        # cluster suite's frozen-node test, where the new term began as the broker came back.
        self._fresh = True
        self._recheck(FRESH_CHECK)
        self._watch()  # a new term: often right after an outage of the broker too
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
            if status != "100":
                log.debug("puller.status code=%s requested=%d", status, self._requested)
            if status in _DONE_STATUSES or status.startswith("4"):
                self._requested = 0  # our requests are over; take() asks again
                self._arrived.set()
            elif status == NO_RESPONDERS:
                self._requested = 0  # nobody took it: ask again shortly
                self._retry_at = now + NO_LEADER_PAUSE
            return  # 100 = idle heartbeat
        # never below 0: after a re-pull the old requests may still deliver (counted against
        # the new ones, so the buffer stays within about a batch)
        self._requested = max(0, self._requested - 1)
        self._delivered_at = now
        self._note_sequences(reply)
        if self._check_failures and self._check_at is not None and self._check_at > now:
            # The consumer answers again after checks that went unanswered: ask it now, not a
            # pause later (what it handed a frozen node is read back that much sooner).
            self._check_at = now
            self._arrived.set()
        if not self._buffer:
            self._first_at = now
            self._arrived.set()  # once per gathering: later arrivals find it set anyway
        self._buffer.append(message_of(self.nc, subject, reply, data, hdr))

    def _note_sequences(self, reply: bytes) -> None:
        """Follow the consumer and stream sequences of the deliveries; a consumer sequence that
        jumps while the stream sequence moves on too means deliveries were lost between."""
        tokens = reply.split(b".")
        if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<n>.<sseq>.<cseq>.<ts>.<pending>
            sseq_t, cseq_t = tokens[5], tokens[6]
        elif len(tokens) >= 11:  # with domain and account hash: two more tokens first
            sseq_t, cseq_t = tokens[7], tokens[8]
        else:
            return
        try:
            sseq, cseq = int(sseq_t), int(cseq_t)
        except ValueError:
            return
        if self._fresh:
            self._since_start.add(sseq)
        if self._cseq and cseq > self._cseq + 1 and sseq > self._sseq + 1 and not self.shared:
            self._gaps.append((self._sseq, sseq - 1))
            self._check_at = time.monotonic()
        self._cseq = max(self._cseq, cseq)
        self._sseq = max(self._sseq, sseq)

    def interrupt(self) -> None:
        """Make a waiting `take()` return now (the daemon is stopping)."""
        self._interrupted = True
        self._arrived.set()

    def reread(self) -> None:
        """Read back what the consumer handed out and nobody acknowledged, as at `start` (a
        term that grew took a dead engine's partitions: its batch in flight is among it, else
        it waits for the ack wait)."""
        self._fresh, self._since_start = True, set()
        self._recheck(FRESH_CHECK)

    async def close(self) -> None:
        """Stop pulling; messages buffered but not taken are nak'ed so they come back at once
        (to whoever pulls next), those that arrive while the unsubscribe travels too: what the
        server handed this puller's requests before it took the unsubscribe is still on the
        wire, and a round trip after it (`flush`) brings it in (the raw handler still takes
        it) to be nak'ed, instead of leaving it to the ack wait. Under P > 1 nobody else reads
        it back (a shared puller does not), so an engine leaving on SIGTERM left tasks up to
        the ack wait late (bench/partitions.py's rolling restart, 8 s)."""
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
                await asyncio.wait_for(self.nc.flush(), CLOSE_FLUSH)
            except Exception:  # connection already closed, or no answer: the ack wait, then
                pass
            forget_raw(self.nc, self._sub)
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
        """Count outstanding requests as gone after a reconnect or a long silence (and look
        for lost deliveries a little later)."""
        reconnects = self.nc.stats["reconnects"]
        if reconnects != self._reconnects:
            self._reconnects = reconnects
            if self._requested:
                log.info("puller.repull reason=reconnect requested=%d", self._requested)
            self._requested = 0
            self._recheck()
            self._watch()
        elif self._requested and self._silent_for() > self.heartbeat * MISSED_HEARTBEATS:
            log.info("puller.repull reason=silence requested=%d", self._requested)
            self._requested = 0
            self._heard = time.monotonic()
            self._recheck()
            self._watch()

    def _watch(self) -> None:
        """An incident: look for unserved requests for INCIDENT_WATCH s from now."""
        self._watch_until = time.monotonic() + INCIDENT_WATCH

    def _recheck(self, after: float = RECHECK_AFTER) -> None:
        """Ask the consumer what it delivered `after` s from now (unless asked sooner)."""
        at = time.monotonic() + after
        self._check_at = at if self._check_at is None else min(self._check_at, at)

    async def _recover(self) -> list[Msg]:
        """The deliveries lost on the way, read back from the stream (see the module's
        docstring); nothing when there are none, too many, or the server will not say."""
        self._check_at = None
        gaps, self._gaps = self._gaps, []
        try:
            reply = await self.nc.request(
                f"$JS.API.CONSUMER.INFO.{self.stream}.{self.consumer}", b"", CHECK_TIMEOUT
            )
            info = json.loads(reply.data)
            delivered, floor = info["delivered"], info.get("ack_floor") or {}
            delivered_c = int(delivered.get("consumer_seq", 0))
            delivered_s = int(delivered.get("stream_seq", 0))
            floor_s = int(floor.get("stream_seq", 0))
            pending = int(info.get("num_ack_pending", 0))
            undelivered = int(info.get("num_pending", 0))
            ack_limit = int((info.get("config") or {}).get("max_ack_pending", 0))
        except Exception as exc:  # no answer now: asked again, a few times (then the ack wait)
            self._check_failures += 1
            self._watch()
            if self._check_failures < RECHECK_TRIES:
                self._gaps = gaps + self._gaps
                self._check_at = time.monotonic() + RECHECK_PAUSE
            else:
                self._check_failures, self._fresh, self._since_start = 0, False, set()
            log.debug("puller.recover_check_failed error=%r", exc)
            return []
        was_unanswered, self._check_failures = self._check_failures > 0, 0
        saturated = 0 < ack_limit <= pending  # serves no request until acks come
        self._look_for_unserved(0 if saturated else undelivered, was_unanswered)
        mine: set[int] = set()
        if self._fresh:  # a new puller: what a previous holder left unacknowledged (shared:
            # the others' in flight too, read once per term, but also a dead engine's batch)
            self._fresh, mine, self._since_start = False, self._since_start, set()
            if pending:
                gaps.append((floor_s, delivered_s))
        elif delivered_c > self._cseq and delivered_s > self._sseq and not self.shared:
            gaps.append((self._sseq, delivered_s))  # delivered since the last one seen here
        if not self.shared:  # all the consumer delivered so far is read back (below) or was
            # delivered here: a later check (an incident's watch) reads back only what is
            # delivered after this one, not the same range again
            self._cseq, self._sseq = max(self._cseq, delivered_c), max(self._sseq, delivered_s)
        wanted = sorted({s for lo, hi in gaps for s in range(lo + 1, hi + 1)} - mine)
        if not wanted:
            return []
        most = RECOVER_MAX * self.batch
        if len(wanted) > most and (pending > most or len(wanted) > RECOVER_SPAN * self.batch):
            log.info(
                "puller.recover_skipped missing=%d unacknowledged=%d (left to the ack wait)",
                len(wanted), pending,
            )  # fmt: skip
            return []
        out = await self._read_back(wanted)
        self.recovered += len(out)
        log.info(
            "puller.recovered count=%d of=%d from=%d to=%d", len(out), len(wanted), wanted[0],
            wanted[-1],
        )  # fmt: skip
        return out

    def _look_for_unserved(self, undelivered: int, was_unanswered: bool) -> None:
        """Requests the consumer keeps alive (its idle heartbeats come) but does not serve:
        seen on a 3-node cluster after the consumer's leader was frozen and thawed, requests
        sent into the freeze got heartbeats and no message until they expired (5 s) while the
        lane filled. A consumer that answers its check, holds messages it has not delivered and
        has delivered none here for RECHECK_AFTER has lost our requests: they are asked again,
        and checked once more RECHECK_AFTER later (after unanswered checks, always once more:
        the consumer's leader may just have changed), UNSERVED_TRIES times at most. For
        INCIDENT_WATCH s after an incident, a check that finds nothing undelivered while
        nothing comes here is made again too: the lane may still be electing its own leader,
        and fill once it has one while the requests wait out their expiry."""
        idle = time.monotonic() - self._delivered_at >= RECHECK_AFTER
        if undelivered > 0 and idle and self._requested > 0:
            self._unserved += 1
            if self._unserved > UNSERVED_TRIES:
                return  # not lost requests, then (or not ours to mend): their expiry ends them
            log.info(
                "puller.repull reason=unserved requested=%d undelivered=%d",
                self._requested, undelivered,
            )  # fmt: skip
            self._requested = 0
            self._recheck()
        else:
            self._unserved = 0
            watching = idle and self._requested > 0 and time.monotonic() < self._watch_until
            if was_unanswered or watching:  # the lane may fill while the requests wait unserved
                self._recheck()

    async def _read_back(self, wanted: list[int]) -> list[Msg]:
        """The messages of `wanted` (sorted stream sequences) still in the lane, in order.

        The lane is a work queue: an acknowledged message is gone, so most of a range between
        the ack floor and the last delivery is usually gone too (a new shared puller's range
        spans every engine's deliveries since the oldest unacknowledged one: 1,762 sequences
        for 28 messages after a kill, 1.2 s of one-by-one reads). So the range is walked by
        what is stored (`next_by_subj`: the first message at or after a sequence): a read per
        message found, not per sequence, in `RECOVER_AT_ONCE` segments walked side by side."""
        runs: list[tuple[int, int]] = []  # contiguous runs of `wanted`, split into segments
        step = max(1, -(-len(wanted) // RECOVER_AT_ONCE))
        for seq in wanted:
            if runs and seq == runs[-1][1] + 1 and seq - runs[-1][0] < step:
                runs[-1] = (runs[-1][0], seq)
            else:
                runs.append((seq, seq))
        keep = set(wanted)
        out: list[Msg] = []
        for i in range(0, len(runs), RECOVER_AT_ONCE):
            walks = await asyncio.gather(
                *(self._walk(a, b) for a, b in runs[i : i + RECOVER_AT_ONCE])
            )
            out += [m for found in walks for m in found if m.metadata.sequence.stream in keep]
        return out

    async def _walk(self, first: int, last: int) -> list[Msg]:
        """The messages stored with sequences in [first, last], one read each (and one to find
        the end); stops early on a read that fails (the ack wait still brings the rest)."""
        found: list[Msg] = []
        seq = first
        while seq <= last:
            msg = await self._read(seq, after=True)
            if msg is None or msg.metadata.sequence.stream > last:
                break
            found.append(msg)
            seq = msg.metadata.sequence.stream + 1
        return found

    async def _read(self, seq: int, after: bool = False) -> Msg | None:
        """The lane's message `seq` (with `after`: the first stored at or after it) as a
        RecoveredMsg; None when there is none (acknowledged: the lane is a work queue) or it
        cannot be read now (it comes back after the ack wait)."""
        ask: dict[str, object] = {"seq": seq, "next_by_subj": ">"} if after else {"seq": seq}
        try:
            reply = await self.nc.request(
                f"$JS.API.STREAM.MSG.GET.{self.stream}", json.dumps(ask).encode(), RECOVER_TIMEOUT
            )
            doc = json.loads(reply.data)
        except Exception as exc:  # a refused grant, a timeout: the ack wait still brings it
            if not self._recover_failed:
                self._recover_failed = True
                log.warning("puller.recover_failed seq=%d error=%r", seq, exc)
            return None
        found = doc.get("message") if isinstance(doc, dict) else None
        if not isinstance(found, dict):
            return None  # 404: acknowledged and removed since
        try:
            seq = int(found.get("seq", seq))
            subject = str(found["subject"]).encode()
            data = base64.b64decode(found.get("data") or b"")
            hdr = base64.b64decode(found["hdrs"]) if found.get("hdrs") else None
            stamp = _nanos(str(found["time"]))
        except (KeyError, ValueError):
            return None
        base = message_of(self.nc, subject, b"", data, hdr)
        msg = RecoveredMsg(
            _client=self.nc,
            subject=base.subject,
            reply="",
            data=data,
            headers=base.headers,
            defect=base.defect,
            stored=Msg.Metadata(
                sequence=Msg.Metadata.SequencePair(consumer=0, stream=seq),
                num_pending=0,
                num_delivered=1,
                timestamp=datetime.fromtimestamp(stamp / 1_000_000_000.0, UTC),
                stream=self.stream,
                consumer=self.consumer,
            ),
        )
        return msg

    def _silent_for(self) -> float:
        return time.monotonic() - self._heard

    def _next_check(self, timeout: float) -> float:
        """How long `take()` may wait before the requests need looking at again: a missed
        heartbeat's deadline, or the end of a pause after a 503."""
        now = time.monotonic()
        if self._check_at is not None:
            timeout = min(timeout, max(0.0, self._check_at - now))  # the consumer to be asked
        if self._requested:
            silence_at = self._heard + self.heartbeat * MISSED_HEARTBEATS
            return max(0.0, min(timeout, silence_at - now + 0.01))
        if not self.nc.is_connected:
            return timeout  # a reconnect brings nothing before nats-py is back
        return max(0.01, min(timeout, self._retry_at - now))  # never a busy loop

    async def _top_up(self) -> None:
        self._forget_lost_requests()
        want = self.window - self._requested
        if want < self.window // 2 or not self.nc.is_connected:
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
        log.debug("puller.pull want=%d requested=%d", want, self._requested)
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
        hands them over without lingering again. A check of the consumer or a request sent
        again while it waits does not end the wait: with nothing come, it returns after
        `timeout`, not sooner (or at once after `interrupt()`)."""
        most = self.batch if limit is None else min(limit, self.batch)
        deadline = time.monotonic() + timeout
        while True:
            if self._check_at is not None and time.monotonic() >= self._check_at:
                found = await self._recover()
                if found:
                    if not self._buffer:
                        self._first_at = time.monotonic() - linger  # handed over at once
                    self._buffer[:0] = found
            left = deadline - time.monotonic()
            if self._buffer or self._interrupted or left <= 0:
                break
            self._arrived.clear()
            try:  # woken early for a missed heartbeat, a pause's end or a check that is due
                await asyncio.wait_for(self._arrived.wait(), self._next_check(left))
            except TimeoutError:
                pass
            if self._buffer or self._interrupted or time.monotonic() >= deadline:
                break
            await self._top_up()  # asked again where the requests were lost; wait on
        self._interrupted = False
        if self._buffer and len(self._buffer) < most and linger > 0:
            wait = self._first_at + linger - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        out, self._buffer = self._buffer[:most], self._buffer[most:]
        if self.shared:  # ask for about twice what came in since the last take, within bounds
            came = len(out) + len(self._buffer)
            self.window = min(self.batch, max(SHARED_WINDOW, 2 * came))
        await self._top_up()
        return out


def _nanos(text: str) -> int:
    """Nanoseconds since the epoch of the server's RFC 3339 UTC time (up to 9 decimals), as
    the ack subject's timestamp token gives them."""
    head, _, frac = text.rstrip("Z").partition(".")
    whole = int(datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp())
    digits = (frac + "000000000")[:9] if frac else "0"
    return whole * 1_000_000_000 + int(digits)
