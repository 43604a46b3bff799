"""The deployment's partition count as PostgreSQL records it (table `partitioning`, migration
0022), and the check an engine makes of its own SCHEDULER_PARTITIONS against it at start.

Every task and cron job row holds the partition `partition_of` gave it under the recorded count
(scheduler/partitions.py), so an engine counting otherwise would store new rows in other
partitions than the old ones: it refuses to start instead. Changing the count means moving
every row to its new partition: `scheduler partitions set --count N`, with every engine
stopped (scheduler/store/postgres/repartition.py; docs/leadership.md, "Partitions").
"""

from __future__ import annotations

import asyncpg

from scheduler.errors import ConfigError

VARIABLE = "SCHEDULER_PARTITIONS"
# FROM items naming partitions one row each (`o.part`), for a LATERAL read of one range per
# partition of an index that leads with the partition (migration 0024), merged by the outer
# ORDER BY: `partition = ANY(...)` over several partitions cannot read such an index in due
# order. `EACH_OF` takes an array parameter (a term's office, say `$3`); `EACH_PARTITION` is
# every partition of the recorded count (the operators' reads, which own none).
EACH_OF = "unnest({}::smallint[]) AS o(part)"
EACH_PARTITION = (
    "generate_series(0, (SELECT partitions - 1 FROM partitioning WHERE id = 1)) AS o(part)"
)


# The first engine's count is recorded (chosen_at set) when it is the recorded one, or when no
# task and no cron job is stored under the recorded one yet; an engine finding it chosen
# changes nothing (migration 0027).
CHOOSE_SQL = (
    "UPDATE partitioning SET partitions = $1, chosen_at = now() WHERE id = 1 "
    "AND chosen_at IS NULL AND (partitions = $1 OR (NOT EXISTS (SELECT 1 FROM delayed_messages) "
    "AND NOT EXISTS (SELECT 1 FROM schedules)))"
)


# An office row (the fencing epoch, migration 0023) for every partition of the recorded count.
# Migration 0023 made them for the count recorded then (1): a count chosen since has none for
# partitions 1..P-1, and `take_office` over them found none, so an engine of a new deployment
# at P > 1 never took office. Epoch 0, as every row of a new deployment: a take raises each
# partition it takes above the highest epoch among them.
OFFICES_SQL = (
    "INSERT INTO partition_offices (partition, epoch) SELECT p, 0 FROM partitioning n, "
    "generate_series(0, n.partitions - 1) AS p WHERE n.id = 1 ON CONFLICT (partition) DO NOTHING"
)


async def check_partitions(pool: asyncpg.Pool, partitions: int) -> None:
    """Choose this count for the deployment if it has none yet (the first engine to start on
    a database storing no task and no cron job), then raise ConfigError naming
    SCHEDULER_PARTITIONS, this count and the recorded one, unless they are equal; then make
    sure each partition of the count has its office row."""
    await pool.execute(CHOOSE_SQL, partitions)
    # FOR SHARE: while `scheduler partitions set` changes the count, this waits for it and
    # then reads the new count (a plain read would see the old one and let the engine start)
    recorded = await pool.fetchval("SELECT partitions FROM partitioning WHERE id = 1 FOR SHARE")
    if recorded != partitions:
        raise ConfigError(
            VARIABLE,
            f"is {partitions}, but this deployment's database records a partition count of "
            f"{recorded} (table partitioning), under which its tasks and cron jobs are "
            "stored. Changing the count means moving every row to its new partition "
            f"(scheduler partitions set --count {partitions}, every engine stopped): "
            f"start with {VARIABLE}={recorded}",
        )
    await pool.execute(OFFICES_SQL)


def count_changed(engine: int, recorded: int) -> ConfigError:
    """The error of an engine of `engine` partitions that finds `recorded` when it takes
    office: the count was changed while it ran (`take_office`)."""
    return ConfigError(
        VARIABLE,
        f"is {engine}, but this deployment's partition count was changed to {recorded} while "
        f"this engine ran (scheduler partitions set): it takes office no more; restart it with "
        f"{VARIABLE}={recorded}",
    )
