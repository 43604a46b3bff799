"""The audit's transforms: plain `DataFrame -> DataFrame` functions, PySpark imported inside.

`occurrences()` stacks expected cron occurrences, deliveries and undelivered tasks into one row
per occurrence; `classify()` adds lateness and the flags; the `per_*` functions and
`histogram()` aggregate the occurrence table.
"""

from __future__ import annotations

import functools
from typing import Any

from scheduler.audit.expected import JobVersion, expand_arrow, to_us
from scheduler.audit.summary import BUCKETS
from scheduler.audit.window import AuditWindow

EXPECTED_SCHEMA = "key string, subject string, scheduled_for timestamp, due_at timestamp"
VERSION_SCHEMA = (
    "name string, subject string, cron string, timezone string, jitter_us bigint, "
    "paused boolean, active_from_us bigint, active_until_us bigint"
)
STATES = (None, "pending", "claimed", "dead", "expired")  # delayed_messages states we report


def expected_occurrences(spark: Any, versions: list[JobVersion], window: AuditWindow) -> Any:
    """Every expected cron occurrence (key, subject, scheduled_for, due_at), expanded on the
    executors job by job with the daemon's cron code."""
    rows = [v.row() for v in sorted(versions, key=lambda v: (v.cron, v.timezone, v.name))]
    jobs = spark.createDataFrame(rows, VERSION_SCHEMA)
    slices = max(1, min(len(rows), spark.sparkContext.defaultParallelism * 4))
    body = functools.partial(expand_arrow, start_us=to_us(window.start), end_us=to_us(window.end))
    return jobs.repartition(slices).mapInArrow(body, EXPECTED_SCHEMA)


def occurrences(log: Any, expected: Any, unfired: Any | None) -> Any:
    """One row per cron occurrence (expected or delivered) and per delayed task (delivered, or
    known undelivered from PostgreSQL): deliveries, first and last `fired_at`, due time.

    Expected occurrences, deliveries and undelivered tasks are stacked and grouped once by
    (kind, key, occurrence, subject): one hash aggregation (fixed-width buffers only) instead of
    a join and a group per side. A delivery to another subject than the job's is therefore a
    missed occurrence plus an unexpected delivery."""
    from pyspark.sql import functions as F

    none_ts, none_str = F.lit(None).cast("timestamp"), F.lit(None).cast("string")
    cron = F.col("kind") == "cron"
    manual = F.col("manual") if "manual" in log.columns else F.lit(False)
    parts = [
        expected.select(
            F.lit("cron").alias("kind"),
            "key",
            F.col("scheduled_for").alias("slot"),
            "subject",
            "scheduled_for",
            "due_at",
            F.lit(True).alias("is_expected"),
            none_ts.alias("fired_at"),
            none_str.alias("state"),
        ),
        log.select(  # an operator's manual fires gather in one row per job, kind "manual"
            F.when(manual, F.lit("manual")).otherwise(F.col("kind")).alias("kind"),
            "key",
            F.when(cron & ~manual, F.col("scheduled_for")).alias("slot"),
            "subject",
            "scheduled_for",
            none_ts.alias("due_at"),
            F.lit(False).alias("is_expected"),
            "fired_at",
            none_str.alias("state"),
        ),
    ]
    if unfired is not None:
        parts.append(
            unfired.select(
                F.lit("delayed").alias("kind"),
                "key",
                none_ts.alias("slot"),
                "subject",
                F.col("scheduled_for").cast("timestamp").alias("scheduled_for"),
                none_ts.alias("due_at"),
                F.lit(False).alias("is_expected"),
                none_ts.alias("fired_at"),
                "state",
            )
        )
    stacked = functools.reduce(lambda a, b: a.unionByName(b), parts)
    codes = F.coalesce(
        *(F.when(F.col("state") == name, F.lit(i)) for i, name in enumerate(STATES[1:], 1)),
        F.lit(0),
    )
    grouped = (
        stacked.withColumn("state", codes)
        .groupBy("kind", "key", "slot", "subject")
        .agg(
            F.max("is_expected").alias("is_expected"),
            F.min("scheduled_for").alias("scheduled_for"),
            F.max("due_at").alias("due_at"),
            F.count("fired_at").alias("deliveries"),
            F.min("fired_at").alias("first_fired_at"),
            F.max("fired_at").alias("last_fired_at"),
            F.max("state").alias("state"),
        )
    )
    delivered = F.col("deliveries") > 0
    state = F.element_at(F.array(*(F.lit(n) for n in STATES)), F.col("state") + 1)
    return grouped.select(
        "kind",
        "key",
        "subject",
        "scheduled_for",
        F.coalesce("due_at", "scheduled_for").alias("due_at"),
        (F.col("is_expected") | (F.col("kind") == "delayed")).alias("expected"),
        "deliveries",
        "first_fired_at",
        "last_fired_at",
        F.when(~delivered & (F.col("state") > 0), state).alias("state"),
    )


def classify(occ: Any, window: AuditWindow, late_ms: int) -> Any:
    """Adds lateness (whole ms, first delivery minus due time, floored), the flags and a status."""
    from pyspark.sql import functions as F

    delivered = F.col("deliveries") > 0
    timed = delivered & (F.col("kind") != "manual")
    lateness = F.floor(
        (F.unix_micros("first_fired_at") - F.unix_micros("due_at")) / F.lit(1000)
    ).cast("long")
    flags = {
        "missed": (F.col("kind") == "cron") & F.col("expected") & ~delivered,
        "doubled": timed & (F.col("deliveries") > 1),
        "early": timed & (F.col("first_fired_at") < F.col("due_at")),
        "late": timed & (F.col("lateness_ms") > late_ms),
        "unexpected": (F.col("kind") == "cron") & ~F.col("expected") & delivered,
        "overdue": F.coalesce(F.col("state").isin("pending", "claimed"), F.lit(False)),
    }
    out = occ.withColumn("lateness_ms", F.when(timed, lateness))
    for name, flag in flags.items():
        out = out.withColumn(name, F.coalesce(flag, F.lit(False)))
    status = F.when(F.col("kind") == "manual", "manual").otherwise("ok")
    for name in ("unexpected", "late", "doubled", "early"):
        status = F.when(F.col(name), name).otherwise(status)
    status = F.when(F.col("state").isin("dead", "expired"), F.col("state")).otherwise(status)
    status = F.when(F.col("overdue"), "overdue").otherwise(status)
    status = F.when(F.col("missed"), "missed").otherwise(status)
    return out.withColumn("status", status).withColumn("hour", F.hour("scheduled_for"))


def _counts() -> list[Any]:
    from pyspark.sql import functions as F

    def total(flag: str) -> Any:
        return F.sum(F.col(flag).cast("long")).alias(flag)

    return [
        F.sum(F.col("expected").cast("long")).alias("expected"),
        F.sum(F.when(F.col("kind") != "manual", F.col("deliveries"))).alias("fired"),
        F.sum(F.when(F.col("kind") == "manual", F.col("deliveries"))).alias("manual"),
        F.sum(((F.col("deliveries") > 0) & (F.col("kind") != "manual")).cast("long")).alias(
            "delivered"
        ),
        *(total(f) for f in ("missed", "doubled", "early", "late", "unexpected", "overdue")),
        F.sum((F.col("state") == "dead").cast("long")).alias("dead"),
        F.sum((F.col("state") == "expired").cast("long")).alias("expired"),
    ]


def _lateness(column: str = "lateness_ms") -> list[Any]:
    from pyspark.sql import functions as F

    return [
        F.expr(f"percentile({column}, array(0.5, 0.95, 0.99))").alias("_p"),
        F.max(column).alias("max"),
        F.avg(column).alias("mean"),
    ]


def _spread(frame: Any) -> Any:
    from pyspark.sql import functions as F

    for index, name in enumerate(("p50", "p95", "p99")):
        frame = frame.withColumn(name, F.col("_p")[index])
    return frame.drop("_p")


def per_schedule(occ: Any) -> Any:
    from pyspark.sql import functions as F

    cron = occ.filter(F.col("kind").isin("cron", "manual")).groupBy("key")
    return _spread(cron.agg(F.min("subject").alias("subject"), *_counts(), *_lateness()))


COUNT_COLUMNS: tuple[str, ...]
COUNT_COLUMNS = ("expected", "fired", "manual", "delivered", "missed", "doubled", "early", "late")
COUNT_COLUMNS += ("unexpected", "overdue", "dead", "expired")


def with_idle_jobs(schedules: Any, jobs: Any) -> Any:
    """Per-schedule rows plus zero rows for jobs (key, job_subject) that had nothing to do."""
    from pyspark.sql import functions as F

    joined = schedules.join(jobs, "key", "full_outer")
    joined = joined.withColumn("subject", F.coalesce("subject", "job_subject")).drop("job_subject")
    return joined.fillna(0, subset=list(COUNT_COLUMNS))


def per_subject(occ: Any) -> Any:
    from pyspark.sql import functions as F

    def fired(kind: str) -> Any:
        return F.sum(F.when(F.col("kind") == kind, F.col("deliveries"))).alias(kind)

    grouped = occ.groupBy("subject")
    return _spread(grouped.agg(*_counts(), fired("cron"), fired("delayed"), *_lateness()))


def per_hour(occ: Any) -> Any:
    return _spread(occ.groupBy("hour", "kind").agg(*_counts(), *_lateness())).orderBy(
        "hour", "kind"
    )


def per_kind(occ: Any) -> Any:
    return _spread(occ.groupBy("kind").agg(*_counts(), *_lateness()))


def per_minute(occ: Any, window: AuditWindow) -> Any:
    """Lateness p50/p99/max per minute of the window (for the report's plot over the day)."""
    from pyspark.sql import functions as F

    minute = F.floor((F.unix_micros("due_at") - F.lit(to_us(window.start))) / F.lit(60_000_000))
    timed = occ.filter(F.col("lateness_ms").isNotNull()).withColumn("minute", minute)
    grouped = timed.groupBy("minute").agg(
        F.expr("percentile(lateness_ms, array(0.5, 0.99))").alias("_p"),
        F.max("lateness_ms").alias("max"),
        F.count(F.lit(1)).alias("count"),
    )
    return grouped.select(
        "minute", F.col("_p")[0].alias("p50"), F.col("_p")[1].alias("p99"), "max", "count"
    ).orderBy("minute")


def histogram(occ: Any) -> Any:
    """How many delivered occurrences fall in each lateness bucket (edges in `BUCKETS`; -1 for
    early ones)."""
    from pyspark.sql import functions as F

    bucket = F.lit(-1)
    for edge in BUCKETS:
        bucket = F.when(F.col("lateness_ms") >= edge, F.lit(edge)).otherwise(bucket)
    timed = occ.filter(F.col("lateness_ms").isNotNull())
    return timed.groupBy(bucket.alias("bucket")).count().orderBy("bucket")
