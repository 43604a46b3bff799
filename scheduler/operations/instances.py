"""The running instances, from the heartbeats each one writes to the state bucket.

Every instance writes `instances.<id>` = `{instance, role, epoch, since, at}` every few seconds
and on every change of role (`scheduler.leadership.heartbeat.Heartbeat`) and deletes it when it
stops. A record not renewed for `stale_after` (the heartbeat's `STALE_AFTER`, which the daemon
passes) belongs to an instance that crashed or lost NATS: it is listed, marked `stale`, until
`GONE_AFTER`, then left out. For display only: leadership is
decided by the lease, never by these records.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

from nats.js.kv import KeyValue

from scheduler.operations.records import Instance

PREFIX = "instances."
GONE_AFTER = timedelta(hours=1)
READ_TIMEOUT = 2.0


async def read_instances(kv: KeyValue, now: datetime, stale_after: timedelta) -> list[Instance]:
    """Every instance seen within `GONE_AFTER`: the leader first, then by name."""
    watcher = await kv.watch(PREFIX + ">", ignore_deletes=True)
    entries: list[tuple[str, bytes]] = []
    try:
        async with asyncio.timeout(READ_TIMEOUT):
            while (entry := await watcher.updates(timeout=READ_TIMEOUT)) is not None:
                entries.append((entry.key.removeprefix(PREFIX), entry.value or b""))
    finally:
        await watcher.stop()
    found = [
        d
        for key, value in entries
        if (d := instance_record(key, value, now, stale_after)) is not None
    ]
    return sorted(found, key=lambda d: (d.stale, d.role != "leader", d.instance))


def instance_record(
    key: str, value: bytes, now: datetime, stale_after: timedelta
) -> Instance | None:
    """One heartbeat as listed (an older daemon's names its instance by its key only), or None
    when it is not a heartbeat or too old to list."""
    try:
        doc = json.loads(value)
        seen = _instant(doc["at"])
        instance = str(doc.get("instance") or key)
    except (ValueError, KeyError, TypeError, AttributeError):  # not a heartbeat
        return None
    if now - seen > GONE_AFTER:
        return None
    since = doc.get("since")
    epoch = doc.get("epoch")
    return Instance(
        instance=instance,
        role="leader" if doc.get("role") == "leader" else "standby",
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        since=_instant(since) if isinstance(since, str) else None,
        last_seen=seen,
        stale=now - seen > stale_after,
    )


def _instant(text: str) -> datetime:
    at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError("naive time")
    return at
