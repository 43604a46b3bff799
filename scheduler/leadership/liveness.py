"""Whether any engine looks alive, from NATS: what `scheduler partitions set` asks before it
moves rows, since an engine running the old layout would go on storing tasks in the old
partitions (intake is not fenced).

Two signs, either enough: a lease key present in the leader bucket (`leader` under P = 1,
`p.<n>` under P > 1, of any count; a key outlives its engine by at most the lease TTL, the bucket's
max_age, and a stopping engine deletes its own), and a heartbeat in the state bucket younger
than the heartbeat's STALE_AFTER (an engine deletes its own when it stops). A bucket that
cannot be read is a sign too: nothing can be said, so the caller refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from nats.js.kv import KeyValue

from scheduler.leadership.heartbeat import STALE_AFTER
from scheduler.leadership.partition_map import read_partition_map
from scheduler.operations.instances import read_instances
from scheduler.partitions import MAX_PARTITIONS, spans


def describe(leader: bool, partitions: Sequence[int], instances: Sequence[str]) -> str | None:
    """The signs in words (`lease key leader held; lease keys of partitions 0-7 held;
    heartbeats of a, b within 15 s`), None when there are none."""
    signs = []
    if leader:
        signs.append("lease key leader held")
    if partitions:
        signs.append(f"lease keys of partitions {spans(partitions)} held")
    if instances:
        within = int(STALE_AFTER.total_seconds())
        signs.append(f"heartbeats of {', '.join(sorted(instances))} within {within} s")
    return "; ".join(signs) or None


async def engine_signs(
    leader_kv: KeyValue | None, state_kv: KeyValue | None, now: datetime
) -> str | None:
    """What says an engine runs, in words; None when neither bucket shows one (a bucket
    that does not exist, None, shows none)."""
    leader: bool = False
    held: list[int] = []
    if leader_kv is not None:
        single = await read_partition_map(leader_kv, 1)
        several = await read_partition_map(leader_kv, MAX_PARTITIONS)
        if not (single.readable and several.readable):
            return "the lease bucket could not be read"
        leader = not single.unowned()
        held = [p.partition for p in several.leases if p.owner is not None]
    fresh: list[str] = []
    if state_kv is not None:
        try:
            found = await read_instances(state_kv, now, STALE_AFTER)
        except Exception as exc:  # NATS away or slow: no answer is no proof, so a sign
            return f"the state bucket could not be read: {exc!r}"
        fresh = [i.instance for i in found if not i.stale]
    return describe(leader, held, fresh)
