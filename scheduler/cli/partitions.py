"""`scheduler partitions set --count N`: move a deployment to another partition count.

With every engine stopped, one PostgreSQL transaction moves every task and cron job row to
its partition under N, gives the deployment N office rows, each at an epoch above every old
one, and records N (scheduler/store/postgres/repartition.py). Before it writes, and again
before it commits, it asks NATS whether an engine looks alive (scheduler/leadership/
liveness.py) and refuses if one does; `--force` skips that, for a cluster known to be down
(NATS included). `--dry-run` says what would move and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from scheduler.cli.provision import QuietBus
from scheduler.errors import ConfigError, EnginesRunningError
from scheduler.partitions import MAX_PARTITIONS
from scheduler.settings import Settings
from scheduler.store.postgres.repartition import Alive, Repartition, TableMove, repartition

EXIT_REFUSED = 2  # a running engine: the operator's setup is wrong for this command
NEXT = (
    "stop every engine; `scheduler partitions set --count N` (this); start the engines with "
    "SCHEDULER_PARTITIONS=N"
)


def count_arg(text: str) -> int:
    """1 to MAX_PARTITIONS (SCHEDULER_PARTITIONS' bound); ArgumentTypeError otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"{value} is out of range: 1 to {MAX_PARTITIONS}")
    return value


def register(sub: Any) -> None:
    """`scheduler partitions set`."""
    parts = sub.add_parser(
        "partitions", help="change the deployment's partition count (engines stopped)"
    )
    verbs = parts.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cmd = verbs.add_parser(
        "set",
        help="move every row to its partition under a new count",
        description=(
            "Move every task and cron job row to its partition under N, give every "
            "partition an office row at an epoch above every old one (an engine still running "
            "the old count is fenced on every write), and record N: one PostgreSQL "
            "transaction. Refused (exit status 2) while an engine looks alive: a lease key in "
            "the leader bucket or a heartbeat younger than 15 s in the state bucket. The steps: "
            f"{NEXT} (docs/leadership.md, 'Changing the count')."
        ),
    )
    cmd.add_argument("--config", help="YAML config file (keys as the SCHEDULER_* variables)")
    cmd.add_argument(
        "--count", type=count_arg, required=True, metavar="N", help="the new partition count"
    )
    cmd.add_argument(
        "--dry-run",
        action="store_true",
        help="say how many rows would move; write nothing and lock nothing (may run while "
        "the engines still fire: it names those that look alive)",
    )
    cmd.add_argument(
        "--force",
        action="store_true",
        help="skip the check that no engine runs (NATS is not asked): only for a cluster "
        "known to be down",
    )
    cmd.set_defaults(func=cmd_set)


def cmd_set(args: argparse.Namespace) -> int:
    from scheduler.settings import load_settings

    settings = load_settings(args.config)
    started = time.perf_counter()
    try:
        result = asyncio.run(change_count(settings, args.count, args.dry_run, args.force))
    except EnginesRunningError as exc:
        print(
            f"scheduler: partitions set: refused, {exc}: stop every engine first (or, for a "
            "cluster known to be down, --force)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    for line in summary(result, time.perf_counter() - started):
        print(line)
    return 0


async def change_count(settings: Settings, count: int, dry_run: bool, force: bool) -> Repartition:
    """Connect, ask NATS (unless `force`), move (or count) the rows; one line per table is
    printed as it is done."""
    from scheduler.store.postgres.connect import connect

    dsn = settings.database_dsn
    if dsn is None:
        raise ConfigError("SCHEDULER_DATABASE_URL", "not set")
    budget = settings.startup_timeout.total_seconds()
    async with contextlib.AsyncExitStack() as stack:
        alive = None if force else await stack.enter_async_context(nats_liveness(settings))
        conn = await connect(dsn, budget)
        stack.push_async_callback(conn.close)
        result = await repartition(conn, count, alive, dry_run, _print_table(dry_run))
    return result


@contextlib.asynccontextmanager
async def nats_liveness(settings: Settings) -> AsyncIterator[Alive]:
    """The check of running engines over the deployment's buckets, on a connection open
    while it is in use. A bucket that does not exist shows no engine."""
    from scheduler.bus.nats.connection import NatsBus
    from scheduler.leadership.liveness import engine_signs

    if not settings.nats_url:
        raise ConfigError(
            "SCHEDULER_NATS_URL", "not set: it is asked whether engines run (or pass --force)"
        )
    bus = NatsBus(settings, QuietBus(), "partitions")
    await bus.connect(settings.startup_timeout.total_seconds())
    assert bus.js is not None
    js = bus.js

    async def bucket(name: str) -> KeyValue | None:
        try:
            return await bus.setup(js.key_value(name))
        except BucketNotFoundError:  # never provisioned: no engine ever ran on this NATS
            return None

    async def alive() -> str | None:
        leader, state = await bucket(settings.leader_bucket), await bucket(settings.state_bucket)
        return await engine_signs(leader, state, datetime.now(UTC))

    try:
        yield alive
    finally:
        await bus.close()


def _print_table(dry_run: bool) -> Callable[[TableMove], None]:
    verb = "would move" if dry_run else "moved"

    def show(t: TableMove) -> None:
        print(f"{t.table}: {t.moved:,} of {t.rows:,} rows {verb} ({t.seconds:.2f} s)", flush=True)

    return show


def summary(r: Repartition, seconds: float) -> list[str]:
    """The lines after the tables': the offices and the count, or why nothing was written."""
    if not r.needed:
        return [f"partition count {r.count} already, every row in place: nothing to do"]
    moving = sum(t.seconds for t in r.tables)  # the statements alone, not the connecting
    rate = f", {r.moved / moving:,.0f} rows/s" if r.moved and moving > 0 else ""
    if r.dry_run:
        lines = [
            f"partition_offices: {r.offices_was} -> {r.count} rows, each at epoch {r.epoch} "
            f"(the old rows' highest: {r.top}), would be written",
            f"dry run: nothing written (partition count {r.was} -> {r.count})",
        ]
        if r.engines is not None:
            lines.append(f"engines look alive ({r.engines}): stop every engine before the run")
        return lines
    return [
        f"partition_offices: {r.offices_was} -> {r.count} rows, each at epoch {r.epoch} "
        f"(the old rows' highest: {r.top})",
        f"partition count {r.was} -> {r.count} in {seconds:.2f} s ({r.moved:,} rows moved"
        f"{rate}): start the engines with SCHEDULER_PARTITIONS={r.count}",
    ]
