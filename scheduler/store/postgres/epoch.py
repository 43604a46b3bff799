"""The fencing epochs in PostgreSQL, one per partition: taking office over a set of
partitions, and the one fence every leader's write runs.

The table `partition_offices` (migration 0023) has one row per partition; its `epoch` is that
partition's fencing token (`leadership`, a view of partition 0's row, is how P = 1 and the
previous version see it). Every state change a leader makes (claim, fired, retry, expire, dead,
cron cursors and failures) is one statement run by `fenced`: its first WITH item, `lead`, holds
the office rows of the partitions the statement writes to, read `FOR SHARE`, only while every
one of them still has the writer's epoch; every write of the statement joins `lead` on its
row's partition, and `fenced` raises FencedError, nothing written, when any of those
partitions has moved on. `take_office` raises the epochs of a set of partitions (`UPDATE`,
which needs each row exclusively), so it waits for every such statement in flight: once it
returns, no write fenced by an older epoch of those partitions can still commit, and every
later one finds no `lead` and fails. Writes to partitions it did not take go on. This is the
only place that SQL is written.

One statement, not a transaction that checks first: one round trip (the claim and the booking
of deliveries are the hot path), and no way to write outside the lock. With P = 1 the office is
partition 0: the same row lock and the same round trip as one epoch for the whole deployment.

A term holds one epoch over all the partitions it took (`take_office` gives them the same
one), so a claim's `claimed_epoch`, a `fire_log` row's epoch and a fenced write's `$1` stay one
number per term, and a write names its partitions, not pairs. Term numbers are unique and
increasing across all partitions (`partitioning.term_hwm`, migration 0028), so a running term
can gain partitions in place at its own number (`grow_office`): the fence is equality, and no
former owner of a gained partition held that number.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from typing import Any, TypedDict, cast

import asyncpg

from scheduler.errors import FencedError, ServiceUnavailableError
from scheduler.store.postgres.partitioning import count_changed

# The office row of partition 0 while it holds the epoch `$1`, locked until the statement's
# transaction ends: the first WITH items of every fenced statement under P = 1 (the office
# {0}), one row and one parameter, as the one epoch row was before partitions.
_LEAD = (
    "held AS (SELECT partition, epoch FROM partition_offices WHERE partition = 0 "
    "AND epoch = $1 FOR SHARE), lead AS (SELECT partition, epoch FROM held)"
)
# The same over the partitions `{owned}` (an array parameter): their office rows while every
# one of them holds the epoch `$1`, and none as soon as one has moved on, so a statement writes
# all of its partitions or none.
_LEAD_OVER = (
    "held AS (SELECT partition, epoch FROM partition_offices WHERE partition = "
    "ANY({owned}) AND epoch = $1 FOR SHARE), lead AS (SELECT partition, epoch FROM held "
    "WHERE (SELECT count(*) FROM held) = cardinality({owned}))"
)
_NOTHING = "SELECT true AS fenced_row WHERE false"  # `rows` of a statement that returns none
# One epoch over a set of partitions: their rows locked in partition order (two overlapping
# takes cannot deadlock), read as they are once locked (not as the statement's snapshot saw
# them), then the high-water mark of every term number issued (`partitioning.term_hwm`,
# migration 0028) raised above itself, the highest of them and the floor, under its row lock
# (two takes are serialized there: no number is issued twice), and every taken partition set
# to that number (nothing issued when nothing is taken: a take refused for its count).
# `seen` is what the statement's snapshot saw issued (the mark and the partitions), for the
# restore warning: the mark itself is never derived from the partitions' epochs alone, which
# an in-place gain can lower (`grow_office`).
_TAKE = (
    "WITH {counted}was AS (SELECT partition, epoch FROM partition_offices WHERE partition = "
    "ANY($3::smallint[]) AND EXISTS (SELECT 1 FROM counted) ORDER BY partition FOR UPDATE), "
    "top AS (SELECT max(epoch) AS was FROM was), "
    "issued AS (UPDATE partitioning AS n SET term_hwm = greatest(n.term_hwm, top.was, $2) + 1 "
    "FROM top WHERE n.id = 1 AND top.was IS NOT NULL RETURNING n.term_hwm AS epoch), "
    "seen AS (SELECT greatest(n.term_hwm, top.was) AS was FROM partitioning AS n, top "
    "WHERE n.id = 1) "
    "UPDATE partition_offices AS o SET epoch = issued.epoch, instance = $1, "
    "since = now() FROM was, issued, seen WHERE o.partition = was.partition "
    "RETURNING o.partition, o.epoch, seen.was"
)
# A running term of number `$2` over `$4` gains the partitions `$5` in place: every row of both
# locked in partition order, then the gained set to `$2` only while the term still holds every
# one of its own (`$4` at `$2`), none of the gained holds `$2` already, no partition outside
# the term holds it, and it is a number issued (at most the mark). Nothing written otherwise.
_GROW = (
    "WITH was AS (SELECT partition, epoch FROM partition_offices WHERE partition = "
    "ANY($3::smallint[]) ORDER BY partition FOR UPDATE), "
    "fit AS (SELECT (SELECT count(*) FROM was WHERE partition = ANY($4::smallint[]) "
    "AND epoch = $2) = cardinality($4::smallint[]) "
    "AND NOT EXISTS (SELECT 1 FROM was WHERE partition = ANY($5::smallint[]) AND epoch = $2) "
    "AND NOT EXISTS (SELECT 1 FROM partition_offices WHERE epoch = $2 "
    "AND partition <> ALL($3::smallint[])) "
    "AND (SELECT term_hwm FROM partitioning WHERE id = 1) >= $2 AS ok) "
    "UPDATE partition_offices AS o SET epoch = $2, instance = $1, since = now() FROM fit "
    "WHERE fit.ok AND o.partition = ANY($5::smallint[]) RETURNING o.partition"
)
# Every take locks the count's row (which holds the mark) first, before any office row, as
# `scheduler partitions set` does (partitioning, then the offices): takes queue there, none
# deadlocks with another or with the move (a share lock here, upgraded by `issued`, would
# let two takes each wait for the other's). With the taker's count (`$4`): the take happens
# only while the deployment records it, so an engine of the old count never takes office
# again after the move (docs/leadership.md, I7).
_TAKE_COUNTED = _TAKE.format(
    counted="counted AS (SELECT 1 FROM partitioning WHERE id = 1 AND partitions = $4 "
    "FOR NO KEY UPDATE), "
)
_TAKE = _TAKE.format(
    counted="counted AS (SELECT 1 FROM partitioning WHERE id = 1 FOR NO KEY UPDATE), "
)
_log = logging.getLogger(__name__)
OFFICE_OF_ONE = (0,)  # under P = 1, every row is in partition 0


class FencedBy(TypedDict, total=False):
    """`fenced`'s keywords naming the partitions a statement writes to and the writer's
    office, left out under P = 1 (`fenced_by`)."""

    partitions: Collection[int]
    office: Collection[int]


def fenced_by(partitions: Collection[int], office: Collection[int]) -> FencedBy:
    """The keyword arguments of `fenced` for a write to `partitions` by a term holding
    `office`: none for partition 0 in an office of partition 0 alone (P = 1), so such a call
    reads as before partitions."""
    if set(partitions) == {0} and set(office) == {0}:
        return {}
    return {"partitions": partitions, "office": office}


async def take_office(
    pool: asyncpg.Pool,
    instance: str,
    floor: int = 0,
    partitions: Iterable[int] = OFFICE_OF_ONE,
    count: int | None = None,
) -> int:
    """Issue a new term number, above every number issued before (`partitioning.term_hwm`),
    the epochs of `partitions` and `floor` (the highest epoch the caller has seen in use), and
    set each of `partitions` to it: every other epoch of those partitions is now fenced. One
    statement; no number is issued twice (the mark's row lock serializes the takes).

    `count`, the engine's own partition count (the engines pass it): the take happens only
    while the deployment records that count, else ConfigError (the count was changed under
    the engine by `scheduler partitions set`; nothing taken).

    `floor` keeps an epoch from going backwards when the database was restored from an older
    backup (docs/operations.md, "Backup and restore"): without it the restored value would be
    incremented into epochs a leader of before the restore held, whose late writes would pass
    the fence again. A restore found this way is logged (`leader.epoch_behind`)."""
    owned = sorted(set(partitions))
    async with pool.acquire() as conn:
        if count is None:
            rows = await conn.fetch(_TAKE, instance, floor, owned)
        else:
            rows = await conn.fetch(_TAKE_COUNTED, instance, floor, owned, count)
            if not rows:
                recorded = await conn.fetchval("SELECT partitions FROM partitioning WHERE id = 1")
                if recorded != count:
                    raise count_changed(count, recorded)
    # the migrations insert a row per partition of the recorded count, which the engine's
    # own count equals (check_partitions); only `scheduler partitions set` replaces them
    assert len(rows) == len(owned), f"no office for some of the partitions {owned}"
    epoch, was = int(rows[0]["epoch"]), int(rows[0]["was"])
    if was < floor:
        _log.warning(
            "leader.epoch_behind instance=%s database_epoch=%d seen=%d epoch=%d "
            "(restored from an older backup?)",
            instance,
            was,
            floor,
            epoch,
        )
    return epoch


async def grow_office(
    pool: asyncpg.Pool,
    instance: str,
    epoch: int,
    kept: Collection[int],
    gained: Collection[int],
) -> bool:
    """Join `gained` to the running term of number `epoch` over `kept`: set each gained
    partition's epoch to `epoch` (one statement, their rows and the term's locked in partition
    order, so it waits for every write fenced by a former owner in flight); True when done,
    False (nothing written) when the term no longer holds every one of `kept` at `epoch`, a
    gained partition holds `epoch` already or a partition outside the term holds it.

    Safe because term numbers are unique (`take_office` issues each once): every former owner
    of a gained partition held another number, so its writes there fail the fence from now on,
    however stale; the term's own writes there pass. A gained partition's epoch may go down
    (its former owner's term may be newer): the fence is equality, not order."""
    kept_, gained_ = sorted(set(kept)), sorted(set(gained))
    if not gained_ or set(kept_) & set(gained_):
        raise ValueError(f"a growth gains partitions the term does not hold: {gained_}")
    async with pool.acquire() as conn:
        rows = await conn.fetch(_GROW, instance, epoch, kept_ + gained_, kept_, gained_)
    return len(rows) == len(gained_)


# A prepared statement run more than five times may keep a generic plan, planned without its
# parameters: an array parameter (`unnest($2::text[])`, `string_to_array($3, ...)`) is then
# estimated at 10 elements whatever it holds. For an outcome (a booking, a retry, dead
# letters) that picked a nested loop over the task rows that rescans `u` for each: quadratic,
# 200 ms for a booking of 800 and over a second for the largest; at 3,000 tasks/s 51 such
# bookings took as long as the other 405 together (bench/README.md, host Q, auto_explain).
# Planned with its parameters, each array's length is known and the join is by hash or by key.
# So such a statement is prepared afresh for each run (a new prepared statement is planned for
# its parameters for its first five runs), one more round trip. Not `SET LOCAL plan_cache_mode`
# in a transaction around it: a leader frozen (SIGSTOP) between its statements would hold that
# transaction open, and with it the lock on its office rows that a successor's take waits for
# (tests/faults' SIGSTOP test caught it: no successor within 9 s).


async def fenced(
    conn: asyncpg.Connection,
    epoch: int,
    writes: str,
    *args: Any,
    rows: str | None = None,
    partitions: Collection[int] = OFFICE_OF_ONE,
    office: Collection[int] | None = None,
    custom_plan: bool = False,
) -> list[asyncpg.Record]:
    """Run one statement that writes only while `epoch` is the current fencing epoch of every
    one of `partitions` (the partitions of the rows it writes); raise FencedError, having
    written nothing, when a newer leader has taken office over any of them.

    `writes` are the statement's WITH items after `lead` (a row (partition, epoch) per
    partition, see `_LEAD`): each write joins `lead` on its row's partition, itself or through
    an item that does, so it touches no row once the epoch is stale, nor a row of a partition
    not in `partitions`. `rows`, a SELECT over those items, is what the statement returns
    (nothing without it). `$1` is `epoch`; `args` are `$2`, `$3`, ...; the partitions, unless
    they are just partition 0 (P = 1), are the last parameter.

    `office`, the partitions the writer's term holds, when given: a write naming a partition
    outside it raises FencedError without being sent. Term numbers are unique (migration
    0028), but a previous version's take (during a rolling upgrade) could give one again to a
    term over other partitions: the row check alone would then let a term write in a
    partition another term holds at its own number.

    The statement always yields a row (`in_office` left-joined to `rows`), so a fenced epoch
    is told apart from a write that matched nothing.

    `custom_plan`: plan this execution for its own parameters (a statement prepared for it
    alone) rather than by the cached statement's generic plan, which estimates every array
    at 10 elements (see the comment above)."""
    owned = sorted(set(partitions))
    if not owned:
        raise ValueError("a fenced statement names the partitions it writes to: none given")
    if office is not None and not set(owned) <= set(office):
        raise FencedError(epoch)  # a partition this term never took
    lead, more = _LEAD, cast(tuple[list[int], ...], ())
    if owned != [0]:
        lead, more = _LEAD_OVER.format(owned=f"${len(args) + 2}::smallint[]"), (owned,)
    found = f"SELECT true AS fenced_row, r.* FROM ({rows}) AS r" if rows else _NOTHING
    statement = (
        f"WITH {lead}, {writes} SELECT (SELECT count(*) FROM lead) AS in_office, f.* "
        f"FROM (SELECT 1) AS one LEFT JOIN ({found}) AS f ON true"
    )
    if custom_plan:  # a statement of its own, not the cached one: planned for these arrays
        result = await (await conn.prepare(statement)).fetch(epoch, *args, *more)
    else:
        result = await conn.fetch(statement, epoch, *args, *more)
    if not result or result[0]["in_office"] == 0:
        raise FencedError(epoch)
    return [r for r in result if r["fenced_row"]]


async def database_time(
    pool: asyncpg.Pool, now: Callable[[], datetime], timeout: float = 2
) -> tuple[datetime, datetime, datetime]:
    """(`now()` before asking, PostgreSQL's `clock_timestamp()`, `now()` after): the round trip
    measured around the query alone, on a connection already acquired. Raises
    ServiceUnavailableError (an OSError) when PostgreSQL cannot be asked, TimeoutError after
    `timeout` seconds."""
    try:
        async with pool.acquire() as conn:
            sent = now()
            theirs = await conn.fetchval("SELECT clock_timestamp()", timeout=timeout)
            back = now()
    except asyncpg.PostgresError as exc:
        raise ServiceUnavailableError("postgres", repr(exc)) from exc
    return sent, theirs, back
