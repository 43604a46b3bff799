"""The audit as Spark transforms: expected occurrences joined with the log, then aggregated.

`run()` is the shell (session, stages, files); the transforms in between are plain
`DataFrame -> DataFrame` functions. Nothing large passes through the driver: the expansion runs
by job on the executors (`mapInArrow`), the per-occurrence table goes straight to Parquet, and
only per-schedule, per-subject, per-hour and per-minute aggregates are collected.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.audit import summary as summaries
from scheduler.audit.expected import JobVersion, expand_arrow, to_us
from scheduler.audit.inputs import Source, in_window, read_history, read_log, read_unfired
from scheduler.audit.summary import BUCKETS, Slo
from scheduler.audit.window import AuditWindow
from scheduler.errors import AuditInputError

EXPECTED_SCHEMA = "key string, subject string, scheduled_for timestamp, due_at timestamp"
VERSION_SCHEMA = (
    "name string, subject string, cron string, timezone string, jitter_us bigint, "
    "paused boolean, active_from_us bigint, active_until_us bigint"
)
TABLES = ("occurrences", "schedules", "subjects", "hours")
Progress = Callable[[str], None]
STATES = (None, "pending", "claimed", "dead", "expired")  # delayed_messages states we report


def stderr_progress(line: str) -> None:
    print(f"audit: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """Everything `scheduler audit` was asked to do, already checked."""

    window: AuditWindow
    source: Source
    out: Path
    schedules_dir: Path | None = None
    schedules_from: str = "auto"  # auto | yaml | history
    master: str | None = None
    slo: Slo = field(default_factory=Slo)
    jars: tuple[str, ...] = ()
    conf: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class AuditResult:
    summary: dict[str, Any]
    run: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.summary["slo"]["ok"])


def run(options: AuditOptions, progress: Progress = stderr_progress) -> AuditResult:
    """Run the whole audit; write tables, summary.json, run.json and report.html under `out`."""
    from scheduler.audit import session

    began = time.monotonic()
    options.out.mkdir(parents=True, exist_ok=True)
    spark, owned = session.start(
        options.master, list(options.jars), options.out / "spark.log", dict(options.conf)
    )
    try:
        master = spark.sparkContext.master
        progress(f"spark {spark.version} on {master} ready in {time.monotonic() - began:.1f} s")
        result = Audit(spark, options, progress).run()
        result.run.update(master=master, spark=spark.version)
        result.run["seconds"] = round(time.monotonic() - began, 2)
        _write_json(options.out / "run.json", result.run)
        from scheduler.audit import report

        report.write(options.out / "report.html", result.summary, result.run)
        progress(f"report written to {options.out / 'report.html'}")
        return result
    finally:
        if owned:
            spark.stop()


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")


class Audit:
    """One audit run on a given session: the stages in order, each timed."""

    def __init__(self, spark: Any, options: AuditOptions, progress: Progress) -> None:
        self.spark = spark
        self.options = options
        self.progress = progress
        self.window = options.window
        self.stages: dict[str, float] = {}

    def _stage(self, name: str, began: float) -> float:
        self.stages[name] = round(time.monotonic() - began, 2)
        return self.stages[name]

    def run(self) -> AuditResult:
        from pyspark.sql import Observation

        began = time.monotonic()
        versions, schedules_source = self.versions()
        observation = Observation("input")
        log = self.read(observation)
        expected = expected_occurrences(self.spark, versions, self.window)
        occ = classify(
            occurrences(log, expected, self.unfired()), self.window, self.options.slo.late_ms
        )
        occ.write.mode("overwrite").parquet(str(self.options.out / "occurrences"))
        occ = self.spark.read.parquet(str(self.options.out / "occurrences"))
        took = self._stage("occurrences", began)
        stats = _input_stats(observation)
        self.progress(
            f"input: {stats['records']:,} records ({self.options.source.format}), "
            f"{stats['in_window']:,} in the window, {stats['invalid']:,} invalid"
        )
        self.progress(
            f"occurrences: {len(versions):,} job version(s) from {schedules_source}, "
            f"expanded, joined and written ({took:.1f} s)"
        )
        began = time.monotonic()
        tables = self.aggregate(occ, {v.name: v.subject for v in versions})
        self._stage("aggregates", began)
        extra = {
            "window": {
                "start": self.window.start.isoformat().replace("+00:00", "Z"),
                "end": self.window.end.isoformat().replace("+00:00", "Z"),
                "grace_seconds": self.window.grace.total_seconds(),
            },
            "input": stats,
            "expected_from": schedules_source,
            "jobs": len({v.name for v in versions}),
        }
        doc = summaries.build(
            self.window.day.isoformat(),
            self.options.slo,
            tables["schedules"],
            tables["subjects"],
            tables["kinds"],
            extra,
            {v.name: v.subject for v in versions},
        )
        _write_json(self.options.out / "summary.json", doc)
        self.progress(
            f"aggregates: {len(doc['schedules']):,} schedule(s), {len(doc['subjects']):,} "
            f"subject(s) ({self.stages['aggregates']:.1f} s); SLO "
            + ("ok" if doc["slo"]["ok"] else f"BREACHED by {len(doc['slo']['breaches'])}")
        )
        run = {
            "date": doc["date"],
            "input": self.options.source.display,
            "format": self.options.source.format,
            "stages_seconds": self.stages,
            "series": tables["series"],
            "histogram": tables["histogram"],
            "hours": tables["hours"],
        }
        return AuditResult(doc, run)

    # -- stages ------------------------------------------------------------------------------

    def versions(self) -> tuple[list[JobVersion], str]:
        """The job versions to expand, and where they came from (history or yaml)."""
        opts = self.options
        history = None
        if opts.source.jdbc and opts.schedules_from in ("auto", "history"):
            history = read_history(self.spark, opts.source, self.window)
            if history is None and opts.schedules_from == "history":
                raise AuditInputError(
                    "--schedules-from",
                    "the database's schedule_history does not reach back to "
                    f"{self.window.start.isoformat()}",
                )
        if history is not None:
            return history, "schedule_history"
        if opts.schedules_dir is None:
            raise AuditInputError("--schedules", "required (no schedule_history to use instead)")
        from scheduler.schedules import load_dir

        loaded = load_dir(opts.schedules_dir)
        for error in loaded.errors:
            self.progress(f"schedules: skipped: {error}")
        return [JobVersion.of_job(job) for job in loaded.jobs], str(opts.schedules_dir)

    def read(self, observation: Any) -> Any:
        """The usable in-window records, counted on the way (the log is scanned once, by the
        occurrences stage)."""
        from pyspark.sql import functions as F

        parallelism = self.spark.sparkContext.defaultParallelism
        raw = read_log(self.spark, self.options.source, self.window, max(4, 2 * parallelism))
        counted = raw.observe(observation, *_observed(self.window))
        return counted.filter(F.col("problem").isNull() & in_window(self.window)).drop("problem")

    def unfired(self) -> Any:
        if not self.options.source.jdbc:
            return None
        return read_unfired(self.spark, self.options.source, self.window)

    def aggregate(self, occ: Any, jobs: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
        """Every aggregate, three Spark jobs at a time (each is a scan of the occurrence table;
        running them side by side overlaps one's planning with another's tasks)."""
        out = self.options.out
        known = self.spark.createDataFrame(list(jobs.items()), "key string, job_subject string")

        def table(name: str, frame: Any) -> Callable[[], list[dict[str, Any]]]:
            def written() -> list[dict[str, Any]]:
                frame.coalesce(1).write.mode("overwrite").parquet(str(out / name))
                return [r.asDict() for r in self.spark.read.parquet(str(out / name)).collect()]

            return written

        def rows(frame: Any) -> Callable[[], list[dict[str, Any]]]:
            return lambda: [r.asDict() for r in frame.collect()]

        work = {
            "schedules": table("schedules", with_idle_jobs(per_schedule(occ), known)),
            "subjects": table("subjects", per_subject(occ)),
            "hours": table("hours", per_hour(occ)),
            "kinds": rows(per_kind(occ)),
            "series": rows(per_minute(occ, self.window)),
            "histogram": rows(histogram(occ)),
        }
        with ThreadPoolExecutor(3, thread_name_prefix="aggregate") as pool:
            futures = {name: pool.submit(job) for name, job in work.items()}
            return {name: future.result() for name, future in futures.items()}


_PROBLEMS = (
    "not a JSON record",
    "no kind",
    "kind is neither cron nor delayed",
    "no key",
    "no subject",
    "no scheduled_for",
    "scheduled_for is not an RFC 3339 time",
    "no fired_at",
    "fired_at is not an RFC 3339 time",
)


def _observed(window: AuditWindow) -> list[Any]:
    from pyspark.sql import functions as F

    ok = F.col("problem").isNull()
    metrics = [
        F.count(F.lit(1)).alias("records"),
        F.sum((~ok).cast("long")).alias("invalid"),
        F.sum((ok & in_window(window)).cast("long")).alias("in_window"),
    ]
    for index, problem in enumerate(_PROBLEMS):
        hit = (F.col("problem") == problem).cast("long")
        metrics.append(F.sum(hit).alias(f"problem_{index}"))
    return metrics


def _input_stats(observation: Any) -> dict[str, Any]:
    got = observation.get
    invalid = {p: int(got.get(f"problem_{i}") or 0) for i, p in enumerate(_PROBLEMS)}
    records = int(got.get("records") or 0)
    in_window_count = int(got.get("in_window") or 0)
    bad = int(got.get("invalid") or 0)
    return {
        "records": records,
        "in_window": in_window_count,
        "outside_window": records - bad - in_window_count,
        "invalid": bad,
        "invalid_reasons": {p: n for p, n in invalid.items() if n},
    }


# --- Transforms -----------------------------------------------------------------------------------


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
        log.select(
            "kind",
            "key",
            F.when(cron, F.col("scheduled_for")).alias("slot"),
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
        *(F.when(F.col("state") == name, F.lit(i)) for i, name in enumerate(STATES) if i),
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
    lateness = F.floor(
        (F.unix_micros("first_fired_at") - F.unix_micros("due_at")) / F.lit(1000)
    ).cast("long")
    flags = {
        "missed": (F.col("kind") == "cron") & F.col("expected") & ~delivered,
        "doubled": F.col("deliveries") > 1,
        "early": delivered & (F.col("first_fired_at") < F.col("due_at")),
        "late": delivered & (F.col("lateness_ms") > late_ms),
        "unexpected": (F.col("kind") == "cron") & ~F.col("expected") & delivered,
        "overdue": F.coalesce(F.col("state").isin("pending", "claimed"), F.lit(False)),
    }
    out = occ.withColumn("lateness_ms", F.when(delivered, lateness))
    for name, flag in flags.items():
        out = out.withColumn(name, F.coalesce(flag, F.lit(False)))
    status = F.lit("ok")
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
        F.sum("deliveries").alias("fired"),
        F.sum((F.col("deliveries") > 0).cast("long")).alias("delivered"),
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

    cron = occ.filter(F.col("kind") == "cron").groupBy("key")
    return _spread(cron.agg(F.min("subject").alias("subject"), *_counts(), *_lateness()))


COUNT_COLUMNS = ("expected", "fired", "delivered", "missed", "doubled", "early", "late")
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
