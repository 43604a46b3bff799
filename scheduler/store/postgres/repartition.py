"""Moving a deployment to another partition count (`scheduler partitions set`, issue 37).

Every task and cron job row keeps the partition `partition_of` gave it under the recorded
count (scheduler/partitions.py), and each partition has its office row, its fencing epoch
(migration 0023). Changing the count is therefore one transaction that:

1. locks `partitioning` and every `partition_offices` row (`FOR UPDATE`): an engine starting
   meanwhile waits in its check of the count (`check_partitions` reads it `FOR SHARE`) and
   then reads the new one, and no take of office or fenced write gets through until the end;
2. asks whether an engine looks alive (`alive`, unless forced) and refuses if so (a dry
   run, read-only and taking no lock, only reports it);
3. sets each row's partition to `partition_of(key, N)`, in SQL (`RULE`, the same SHA-256);
4. replaces the office rows by exactly N, each at one number above every term number ever
   issued (the mark, `partitioning.term_hwm`, and every old row's epoch), so a write fenced
   by any epoch of the old layout finds no office row that holds it;
5. records N in `partitioning` (`chosen_at` now, the mark at that number), asks `alive`
   again, and commits.

An intent row (a cancel or reschedule of a task still on the lane) stays in partition 0,
where the API writes every intent whatever the count (scheduler.store.postgres.intents); the
task taking it over at intake gives it its own partition. So a second run with the same
count finds every row in place and changes nothing: no row, no epoch.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from scheduler.errors import EnginesRunningError

# `partition_of(key, $1)` in SQL: the first four bytes of the SHA-256 of the key's UTF-8,
# big-endian (a bit(32) cast to bigint reads them unsigned), modulo the count $1.
RULE = "(('x' || left(encode(sha256(convert_to({key}, 'UTF8')), 'hex'), 8))::bit(32)::bigint % $1)"

# Each table with a partition column, and the partition of one of its rows under the count $1
TARGETS: dict[str, str] = {
    "delayed_messages": f"CASE WHEN status = 'intent' THEN 0 ELSE {RULE.format(key='id')} END",
    "schedules": RULE.format(key="name"),
}

Alive = Callable[[], Awaitable[str | None]]  # what says an engine runs; None: nothing does


@dataclass(frozen=True, slots=True)
class TableMove:
    """One table's rows: `moved` of `rows` changed partition (or would, in a dry run)."""

    table: str
    moved: int
    rows: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Repartition:
    """What a change of the count did (or, in a dry run, would do): `needed` False when the
    count, the rows and the office rows were all in place already (nothing written). `epoch`
    is every new office row's, the one above `top`, the highest epoch of the old rows."""

    was: int
    count: int
    tables: tuple[TableMove, ...]
    offices_was: int
    top: int
    needed: bool
    dry_run: bool
    engines: str | None = None  # a dry run's signs of a running engine (a run would refuse)

    @property
    def written(self) -> bool:
        return self.needed and not self.dry_run

    @property
    def epoch(self) -> int:
        return self.top + 1

    @property
    def moved(self) -> int:
        return sum(t.moved for t in self.tables)


async def repartition(
    conn: asyncpg.Connection,
    count: int,
    alive: Alive | None,
    dry_run: bool = False,
    progress: Callable[[TableMove], None] = lambda _: None,
) -> Repartition:
    """Move every row to its partition among `count` and give the deployment `count` office
    rows above every old epoch, in one transaction on `conn`. `alive` (None: skip, `--force`)
    is asked after the locks are taken and again before the commit; a sign of a running
    engine raises EnginesRunningError, nothing written. With `dry_run`, a read-only
    transaction that takes no lock (so it can be run while the engines still fire, to plan)
    counts what would move and keeps the signs in `engines`. `progress` hears of each table
    as it is done."""
    lock = "" if dry_run else " FOR UPDATE"
    async with conn.transaction(readonly=dry_run):
        counted = await conn.fetchrow(
            f"SELECT partitions, term_hwm FROM partitioning WHERE id = 1{lock}"
        )
        assert counted is not None, "migration 0022 records the count's row"
        was, issued = counted["partitions"], int(counted["term_hwm"] or 0)
        offices = await conn.fetch(
            f"SELECT partition, epoch FROM partition_offices ORDER BY partition{lock}"
        )
        signs = None if alive is None else await alive()
        if signs is not None and not dry_run:
            raise EnginesRunningError(signs)
        tables = []
        for table in TARGETS:
            tables.append(await _move(conn, table, count, dry_run))
            progress(tables[-1])
        # above every number ever issued (the mark: a partition's epoch can be below it after
        # a term grew in place), so no term of the old layout holds the new rows' number
        top = max((int(r["epoch"]) for r in offices), default=issued)
        top = max(top, issued)
        in_place = was == count and [r["partition"] for r in offices] == list(range(count))
        needed = not in_place or any(t.moved for t in tables)
        result = Repartition(was, count, tuple(tables), len(offices), top, needed, dry_run, signs)
        if not result.written:
            return result  # nothing written: the transaction ends with nothing to commit
        await _record(conn, count, result.epoch)
        if alive is not None and (late := await alive()) is not None:  # started meanwhile
            raise EnginesRunningError(late)
    return result


async def _record(conn: asyncpg.Connection, count: int, epoch: int) -> None:
    """Exactly `count` office rows, each at `epoch` (no instance, no since, as a new
    deployment's), `count` recorded as chosen now, and `epoch` as issued (the mark)."""
    await conn.execute("DELETE FROM partition_offices")
    await conn.execute(
        "INSERT INTO partition_offices (partition, epoch) "
        "SELECT p, $2 FROM generate_series(0, $1 - 1) AS p",
        count,
        epoch,
    )
    await conn.execute(
        "UPDATE partitioning SET partitions = $1, chosen_at = now(), "
        "term_hwm = greatest(term_hwm, $2) WHERE id = 1",
        count,
        epoch,
    )


async def _move(conn: asyncpg.Connection, table: str, count: int, dry_run: bool) -> TableMove:
    """Set (or with `dry_run` count) the partition of `table`'s rows that are not in theirs.
    One statement: the engines are stopped, so no lock it holds keeps anything waiting, and
    the transaction is all-or-nothing anyway (docs/leadership.md: its cost, measured)."""
    target = TARGETS[table]
    started = time.perf_counter()
    rows = int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    if dry_run:
        moved = await conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE partition <> {target}", count
        )
    else:
        status = await conn.execute(
            f"UPDATE {table} SET partition = {target} WHERE partition <> {target}", count
        )
        moved = status.rsplit(" ", 1)[-1]
    return TableMove(table, int(moved), rows, time.perf_counter() - started)
