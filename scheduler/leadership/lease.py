"""The leader lease as a JetStream KV key: written only with revision checks (docs/leadership.md).

The key `leader` lives in a bucket whose TTL (`max_age`) is the lease TTL. `create` succeeds only
on an absent key, `update` and `delete` only while nobody wrote the key since the revision given:
only those writes say who holds the lease. A read (`holder`) and the watcher (`vacant`, `seen`)
serve display and a sooner campaign, never the decision. Timing (when to renew, deadlines) is
the caller's: `scheduler.leadership.election.Leadership`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nats.errors import OutboundBufferLimitError
from nats.js.errors import BadRequestError, KeyWrongLastSequenceError, NoStreamResponseError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from scheduler.clock import Clock, to_rfc3339

LEASE_KEY = "leader"
# A write nobody took (503: the bucket's stream is electing a leader, 4-10 s after its leader's
# node died) stored nothing: it is sent again after these pauses (s), doubling, until the
# caller's deadline cancels it. A write that went out on a link since replaced (its node froze:
# bus/nats/link.py) is sent again on the new link at once, one refused because the link was
# down as it went out (nothing sent) as soon as the link is back, and one with no answer after
# UNANSWERED_AFTER on the link still up, again every UNANSWERED_AFTER: when a frozen node
# resumes, the bucket's raft group can change leaders again, and a write taken in that change
# was seen answered by nobody (the lease then lapsed at its deadline, 1.2 s after the bucket
# took writes again: bench/cluster_faults.py, sigstop). Every copy carries the same revision
# check, so at most one is stored; a copy refused "wrong last sequence" after an earlier copy
# went out is looked at as `adopt` does: still ours (that copy was stored), it is taken back
# with a checked update, which decides; anyone else's, the error stands.
NO_LEADER_PAUSE = 0.05
NO_LEADER_PAUSE_MAX = 0.25
UNANSWERED_AFTER = 0.5  # s: a KV write answers in about a millisecond here
WRONG_LAST_SEQUENCE = 10071  # JetStream's err_code for a revision check that failed
# A renewal that went out on a link whose node then froze can be stored seconds later, after this
# instance left office (the thawed node forwards what it had read before it stopped): the key is
# then ours but nobody acts on it, and every `create` fails until it expires. `adopt` takes such a
# key back with a revision-checked update, as a `create` takes an absent one; the lease value's
# `run` (one per process) tells this process's writes from another's with the same instance id.


class KvLease:
    """One instance's view of the lease key: its `revision` (of the lease this instance last
    wrote, in or out of office, None when it holds none), `lock` (serialising its writes),
    `vacant` (set when the watcher sees the key deleted or purged), `seen` (the last holder
    the watcher saw, for display) and `highest_epoch` (the highest epoch written into the
    lease while this instance watched: the floor of its next epoch, so a database restored
    from an older backup cannot hand out an epoch again)."""

    def __init__(
        self,
        kv: KeyValue,
        instance: str,
        clock: Clock,
        log: logging.Logger,
        rewatch: float,
        key: str = LEASE_KEY,
    ) -> None:
        self._kv, self._clock, self._log = kv, clock, log
        self.key = key  # `leader` (P = 1), or a partition's `p.<n>` (leadership.partitioned)
        self.instance = instance
        self.run = uuid.uuid4().hex[:12]  # this process's mark in the lease value (see `adopt`)
        self._rewatch = rewatch  # seconds before watching again after the watch failed
        self.revision: int | None = None
        self.seen: str | None = None
        self.highest_epoch = 0
        self.vacant = asyncio.Event()
        self.lock = asyncio.Lock()
        self.relinked = asyncio.Event()  # set by `on_link` each time the link is back

    def on_link(self, up: bool) -> None:
        """The bus's link listener: a write in flight on a link that went is sent again."""
        if up:
            self.relinked.set()

    def value(self, epoch: int | None, since: datetime | None) -> bytes:
        """The lease's value: {instance, epoch, since, run}."""
        since_text = to_rfc3339(since) if since else None
        doc = {"instance": self.instance, "epoch": epoch, "since": since_text, "run": self.run}
        return json.dumps(doc).encode()

    async def create(self, value: bytes) -> int:
        """Write the key if it is absent; its revision. Raises otherwise (held by another, or
        any error: nats-server#5162 makes even a free key fail now and then)."""
        return await self._kv.create(self.key, value)

    async def adopt(self, value: bytes) -> int | None:
        """Take back a lease this process wrote and no longer holds (a late renewal: see the
        module's note): a revision-checked update of the key's current revision, which fails
        if anyone wrote it since, so it decides exactly as a `create` of an absent key would.
        The read only finds the revision; the update decides. None when the key is another's
        (or gone); raises when the update is refused."""
        revision = await self._own_revision()
        if revision is None:
            return None
        self.revision = await self._kv.update(self.key, value, last=revision)
        return self.revision

    async def _own_revision(self) -> int | None:
        """The key's current revision when its value is this process's write (its instance and
        `run`); None when it is another's, absent (a create will do) or unreadable."""
        try:
            entry = await self._kv.get(self.key)
        except Exception:
            return None
        doc = _lease_doc(entry.value)
        if doc.get("instance") != self.instance or doc.get("run") != self.run:
            return None
        return entry.revision

    async def update(self, value: bytes, last: int) -> int:
        """Rewrite the key if `last` is still its revision; the new one, kept as `revision`.
        While the bucket has no leader (a 503: nothing was stored) the write is sent again,
        shortly, until it is taken or the caller gives up: a bucket that moved to another node
        is no reason to lose office. A write unanswered is sent again (see `UNANSWERED_AFTER`)."""
        pause = NO_LEADER_PAUSE
        copies = False  # a copy of this write went out before: it may have been stored
        while True:
            self.relinked.clear()
            write = asyncio.ensure_future(self._kv.update(self.key, value, last=last))
            relink = asyncio.ensure_future(self.relinked.wait())
            silence = asyncio.ensure_future(self._clock.sleep(UNANSWERED_AFTER))
            try:
                await asyncio.wait({write, relink, silence}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                relink.cancel()
                silence.cancel()
                if not write.done():
                    write.cancel()
            if not write.done() or write.cancelled():
                # the link it went out on is gone (its answer cannot come on the new one), or
                # nobody answered it on this one
                why = "relinked" if relink.done() and not relink.cancelled() else "unanswered"
                self._log.info("leader.lease_write_retry reason=%s", why)
                await asyncio.gather(write, return_exceptions=True)
                copies = True
                continue
            try:
                self.revision = write.result()
                return self.revision
            except KeyWrongLastSequenceError:
                if not copies:
                    raise
                taken = await self.adopt(value)  # an earlier copy stored, or another's write
                if taken is None:
                    raise
                self._log.info("leader.lease_write_taken_back revision=%d", taken)
                return taken
            except OutboundBufferLimitError:  # the link was down: nothing went out
                self._log.info("leader.lease_write_retry reason=link_down")
                await self.relinked.wait()
                continue
            except NoStreamResponseError:
                self._log.info("leader.lease_write_retry reason=no_responders pause=%.2f", pause)
            await self._clock.sleep(pause)
            pause = min(pause * 2, NO_LEADER_PAUSE_MAX)

    async def delete(self, last: int) -> None:
        """Delete the key if `last` is still its revision. Refused, the key may still be this
        process's: a renewal stored at the server whose answer never came back (cancelled by a
        resign, or lost) moved it on. Then, as `adopt` does, the current revision is read and
        the key deleted with that one if its value is this process's (the read only finds the
        revision; the checked delete decides). Raises when the key is another's, or the second
        delete is refused too."""
        try:
            await self._kv.delete(self.key, last=last)
        except BadRequestError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            revision = await self._own_revision()
            if revision is None:  # another's, gone or unreadable: the refusal stands
                raise
            await self._kv.delete(self.key, last=revision)
            self._log.info("leader.lease_delete_taken_back revision=%d", revision)

    async def holder(self) -> dict[str, Any]:
        """The lease's current value ({instance, epoch, since}), read for display only."""
        return await read_holder(self._kv)

    async def watch(self) -> None:
        """Follow the key forever: `vacant` is set when it is deleted or purged."""
        while True:
            try:
                watcher = await self._kv.watch(self.key)
            except Exception as exc:  # periodic campaigns still run; try watching again later
                self._log.debug("leader.watch_failed error=%r", exc)
            else:
                try:
                    await self._follow(watcher)
                finally:
                    await _stop_watcher(watcher, self._log)
            await self._clock.sleep(self._rewatch)

    async def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        async for entry in watcher:
            if entry is None:
                continue  # the "caught up" marker
            if entry.operation in (KV_DEL, KV_PURGE):
                self.seen = None
                self.vacant.set()
            else:
                doc = _lease_doc(entry.value)
                holder, epoch = doc.get("instance"), doc.get("epoch")
                self.seen = str(holder) if holder else None
                if isinstance(epoch, int) and not isinstance(epoch, bool):
                    self.saw_epoch(epoch)

    def saw_epoch(self, epoch: int) -> None:
        """Note an epoch in use (written into the lease by this or another instance)."""
        self.highest_epoch = max(self.highest_epoch, epoch)


async def watch_deletes(
    kv: KeyValue,
    keys: str,
    deleted: asyncio.Event,
    clock: Clock,
    log: logging.Logger,
    rewatch: float,
) -> None:
    """Follow `keys` (a subject pattern: `p.>`) forever, headers only: `deleted` is set when
    one of them is deleted or purged (a lease given back, or an expiry marker on servers that
    send them). It only wakes a campaign sooner; leadership is never decided from it."""

    def on_entry(entry: KeyValue.Entry) -> None:
        if entry.operation in (KV_DEL, KV_PURGE):
            deleted.set()

    await follow_keys(kv, keys, on_entry, clock, log, rewatch)


async def follow_keys(
    kv: KeyValue,
    keys: str,
    on_entry: Callable[[KeyValue.Entry], None],
    clock: Clock,
    log: logging.Logger,
    rewatch: float,
) -> None:
    """Hand every entry of `keys` (a subject pattern), headers only, to `on_entry`, forever:
    a watch that fails or ends is opened again `rewatch` s later. For hints that only wake a
    pass sooner (`watch_deletes`, `heartbeat.watch_arrivals`): nothing is decided from it."""
    while True:
        try:
            watcher = await kv.watch(keys, meta_only=True)
        except Exception as exc:  # the periodic passes still run; try watching again later
            log.debug("leader.watch_failed keys=%s error=%r", keys, exc)
        else:
            try:
                async for entry in watcher:
                    if entry is not None:
                        on_entry(entry)
            finally:
                await _stop_watcher(watcher, log)
        await clock.sleep(rewatch)


def _lease_doc(value: bytes | None) -> dict[str, Any]:
    try:
        doc = json.loads(value or b"{}")
    except ValueError:  # not our JSON: show no holder rather than fail
        return {}
    return doc if isinstance(doc, dict) else {}


async def _stop_watcher(watcher: KeyValue.KeyWatcher, log: logging.Logger) -> None:
    try:
        await watcher.stop()
    except Exception as exc:  # a closed connection has no subscription left to remove
        log.debug("leader.watch_stop_failed error=%r", exc)


async def read_holder(kv: KeyValue) -> dict[str, Any]:
    """The lease's current value ({instance, epoch, since}) in the leader bucket `kv`, read
    for display only (an edge shows it; leadership is never decided by a read)."""
    try:
        entry = await asyncio.wait_for(kv.get(LEASE_KEY), timeout=1.0)
        doc = json.loads(entry.value or b"{}")
    except Exception:  # no key (no leader), not our JSON, or NATS away
        return {}
    return doc if isinstance(doc, dict) else {}
