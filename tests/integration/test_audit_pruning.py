"""The audit's JDBC read of fire_log touches only the partitions of its day (and the default)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import asyncpg

from scheduler.audit.inputs import fired_at_slices
from scheduler.audit.window import AuditWindow


async def test_each_slice_is_pruned_to_the_days_partitions(database_url: str) -> None:
    """Every parallel range the audit reads plans only the day's partitions, the next day's (for
    the grace) and the default one, never the other days the daemon created."""
    today = datetime.now(UTC).date()
    window = AuditWindow.of_day(today)
    conn = await asyncpg.connect(database_url)
    try:
        # The daemon's upkeep, run as it runs at start: the test database was cloned from a
        # template migrated earlier (possibly yesterday, when a run crosses midnight UTC).
        await conn.fetch("SELECT * FROM scheduler_fire_log_upkeep(30, 2)")
        parts = {
            r["relname"]
            for r in await conn.fetch(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = 'fire_log'::regclass"
            )
        }
        scanned: set[str] = set()
        for where in fired_at_slices(window, 8):
            plan = await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) SELECT * FROM fire_log WHERE {where}"
            )
            scanned |= set(_relations(json.loads(plan)))
    finally:
        await conn.close()
    later = f"fire_log_p{today + timedelta(days=2):%Y%m%d}"
    assert later in parts  # the daemon's upkeep made it: pruning has something to skip
    assert f"fire_log_p{today:%Y%m%d}" in scanned
    assert later not in scanned
    assert scanned <= {
        f"fire_log_p{today:%Y%m%d}",
        f"fire_log_p{today + timedelta(days=1):%Y%m%d}",
        "fire_log_default",
    }


def _relations(node: object) -> list[str]:
    if isinstance(node, list):
        return [name for item in node for name in _relations(item)]
    if isinstance(node, dict):
        own = [node["Relation Name"]] if "Relation Name" in node else []
        return own + [name for value in node.values() for name in _relations(value)]
    return []
