"""History for operators: lateness, deliveries and dead letters over a recent window.

Two bounded statements per answer, on whichever pool the store was given (the API's own):

- the fire log: the newest `cap` deliveries of the window (manual ones left out: a trigger or a
  backfill is never late), read newest first over the index on `fired_at` (all deliveries) or
  over `fire_log_once` (key, scheduled_for, ...) for one cron job, then aggregated in the same
  statement: per bucket the count, lateness p50/p99/max; over the window the same; each epoch's
  first and last delivery; and the `worst` deliveries at or above the abnormal threshold;
- the dead letters that last failed in the window, per bucket, over `dead_letters_age`
  (last_failed, id), also capped.

A window busier than `cap` deliveries is answered for its newest part (`oldest` says where
it starts): the cost stays that of `cap` rows whatever the rate.
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.operations.stores import Window
from scheduler.store.postgres.connect import PostgresStore

LATE_MS = "(greatest(extract(epoch FROM fired_at - scheduled_for), 0) * 1000)::float8"
_ALL = "fired_at >= $1::timestamptz AND fired_at < $2::timestamptz AND NOT manual"
# One cron job: its key index bounds the scan. An occurrence fires after it is due (beyond a
# leader's skew), so `scheduled_for` a day before the window's start is a safe lower bound.
_ONE = (
    "key = $6::text AND kind = 'cron' AND scheduled_for >= $1::timestamptz - interval '1 day' "
    "AND scheduled_for < $2::timestamptz AND " + _ALL
)
WORST = 10


def _fires_sql(where: str) -> str:
    rows = (
        "SELECT kind, key, subject, scheduled_for, fired_at, attempt, epoch, instance, "
        f"{LATE_MS} AS late_ms FROM fire_log WHERE {where} ORDER BY fired_at DESC LIMIT $4::int"
    )
    quantiles = "percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY late_ms)"
    return (
        f"WITH f AS MATERIALIZED ({rows}), "
        "b AS (SELECT floor(extract(epoch FROM fired_at - $1::timestamptz) / $3::float8)::int "
        "AS i, count(*) AS n, "
        f"{quantiles} AS q, max(late_ms) AS mx FROM f GROUP BY 1), "
        "e AS (SELECT epoch, min(instance) AS instance, min(fired_at) AS first_at, "
        "max(fired_at) AS last_at FROM f GROUP BY epoch), "
        "w AS (SELECT * FROM f WHERE late_ms >= $5::float8 ORDER BY late_ms DESC LIMIT "
        f"{WORST}) "
        "SELECT (SELECT count(*) FROM f) AS n, (SELECT min(fired_at) FROM f) AS oldest, "
        f"(SELECT {quantiles} FROM f) AS q, (SELECT max(late_ms) FROM f) AS mx, "
        "(SELECT json_agg(b) FROM b)::text AS buckets, "
        "(SELECT json_agg(e ORDER BY epoch) FROM e)::text AS epochs, "
        "(SELECT json_agg(w ORDER BY late_ms DESC) FROM w)::text AS worst"
    )


FIRES_SQL = _fires_sql(_ALL + " AND $6::text IS NULL")
JOB_FIRES_SQL = _fires_sql(_ONE)
DEAD_SQL = (
    "SELECT floor(extract(epoch FROM last_failed - $1::timestamptz) / $3::float8)::int AS i, "
    "count(*) AS n FROM (SELECT last_failed FROM dead_letters WHERE last_failed >= "
    "$1::timestamptz AND last_failed < $2::timestamptz ORDER BY last_failed DESC "
    "LIMIT $4::int) d GROUP BY 1"
)


class HistoryStore:
    def __init__(self, db: PostgresStore) -> None:
        self.db = db

    async def read(self, window: Window) -> dict[str, Any]:
        """The fire log's figures and the dead letters per bucket (see the module doc)."""
        args = (window.since, window.until, window.bucket.total_seconds(), window.cap)
        async with self.db.timed("history") as conn:
            sql = FIRES_SQL if window.job is None else JOB_FIRES_SQL
            row = await conn.fetchrow(sql, *args, window.abnormal_ms, window.job)
            dead = [] if window.job is not None else await conn.fetch(DEAD_SQL, *args)
        assert row is not None  # a SELECT of scalar subqueries, no FROM: exactly one row
        quantiles = row["q"] or [None, None]
        return {
            "deliveries": int(row["n"]),
            "oldest": row["oldest"],
            "p50": quantiles[0],
            "p99": quantiles[1],
            "max": row["mx"],
            "buckets": json.loads(row["buckets"] or "[]"),
            "epochs": json.loads(row["epochs"] or "[]"),
            "worst": json.loads(row["worst"] or "[]"),
            "dead": None if window.job is not None else {int(r["i"]): int(r["n"]) for r in dead},
        }
