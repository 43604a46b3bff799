"""`scheduler export-log`: a day of `fire_log`, streamed from PostgreSQL to JSON lines or Parquet.

Rows are read through a server-side cursor and written as they come, so memory stays bounded
whatever the day's size. The window is the audit's: occurrences due in the day, delivered within
the grace around it. JSON lines carry the record of docs/drift-audit.md ("The input") with
times as RFC 3339 UTC milliseconds, formatted by PostgreSQL; Parquet keeps them as UTC
timestamps (µs).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import asyncpg

from scheduler.audit.window import AuditWindow

FETCH = 20_000
ROW_GROUP = 200_000
_WHERE = (
    "FROM fire_log WHERE scheduled_for >= $1 AND scheduled_for < $2 "
    "AND fired_at >= $3 AND fired_at < $4"
)
_MS = '\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\''
JSONL_QUERY = (
    "SELECT json_build_object('kind', kind, 'key', key, 'subject', subject, "
    f"'scheduled_for', to_char(scheduled_for AT TIME ZONE 'UTC', {_MS}), "
    f"'fired_at', to_char(fired_at AT TIME ZONE 'UTC', {_MS}), 'attempt', attempt, "
    "'epoch', epoch, 'instance', instance, 'stream', stream, 'stream_seq', stream_seq, "
    "'manual', manual)::text " + _WHERE
)
COLUMNS = (
    "kind",
    "key",
    "subject",
    "scheduled_for",
    "fired_at",
    "attempt",
    "epoch",
    "instance",
    "stream",
    "stream_seq",
    "manual",
)
PARQUET_QUERY = f"SELECT {', '.join(COLUMNS)} " + _WHERE


def run(dsn: str, window: AuditWindow, out: str, fmt: str) -> tuple[int, float]:
    """Write the window's records to `out`; (records written, seconds taken)."""
    began = time.monotonic()
    count = asyncio.run(export(dsn, window, out, fmt))
    return count, time.monotonic() - began


def _bounds(window: AuditWindow) -> tuple[Any, ...]:
    return window.start, window.end, window.fired_from, window.fired_until


async def export(dsn: str, window: AuditWindow, out: str, fmt: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(readonly=True, isolation="repeatable_read"):
            if fmt == "jsonl":
                return await _jsonl(conn, window, out)
            return await _parquet(conn, window, out)
    finally:
        await conn.close()


@contextmanager
def _opened(out: str) -> Iterator[IO[str]]:
    if out == "-":
        yield sys.stdout
        return
    with open(out, "w", encoding="utf-8") as handle:
        yield handle


async def _jsonl(conn: asyncpg.Connection, window: AuditWindow, out: str) -> int:
    count = 0
    handle: IO[str]
    with _opened(out) as handle:
        cursor = await conn.cursor(JSONL_QUERY, *_bounds(window))
        while rows := await cursor.fetch(FETCH):
            handle.write("\n".join(r[0] for r in rows))
            handle.write("\n")
            count += len(rows)
    return count


async def _parquet(conn: asyncpg.Connection, window: AuditWindow, out: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
        [
            ("kind", pa.string()),
            ("key", pa.string()),
            ("subject", pa.string()),
            ("scheduled_for", ts),
            ("fired_at", ts),
            ("attempt", pa.int32()),
            ("epoch", pa.int64()),
            ("instance", pa.string()),
            ("stream", pa.string()),
            ("stream_seq", pa.int64()),
            ("manual", pa.bool_()),
        ]
    )
    count = 0
    with pq.ParquetWriter(out, schema) as writer:
        cursor = await conn.cursor(PARQUET_QUERY, *_bounds(window))
        pending: list[Any] = []  # Arrow batches (compact), not asyncpg records
        rows_pending = 0
        while rows := await cursor.fetch(FETCH):
            pending.append(_table(rows, schema))
            rows_pending += len(rows)
            if rows_pending >= ROW_GROUP:
                writer.write_table(pa.concat_tables(pending))
                count, pending, rows_pending = count + rows_pending, [], 0
        if pending or count == 0:
            writer.write_table(pa.concat_tables(pending) if pending else _table([], schema))
            count += rows_pending
    return count


def _table(rows: list[Any], schema: Any) -> Any:
    import pyarrow as pa

    columns = list(zip(*rows, strict=True)) if rows else [() for _ in COLUMNS]
    return pa.Table.from_arrays(
        [pa.array(list(col), type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
