"""The audit run: session, stages, files. The transforms themselves are in `transforms.py`.

`run()` reads the log, expands and joins the expected occurrences, writes the occurrence table,
gathers the terms that fired each partition (`handovers.py`), aggregates both and writes
`summary.json`, `run.json` and the report. Nothing large passes through the driver: the
expansion runs by job on the executors (`mapInArrow`), the per-occurrence table goes straight to
Parquet, and only per-schedule, per-subject, per-hour and per-minute aggregates and the first
handovers are collected.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from scheduler.audit import handovers
from scheduler.audit import summary as summaries
from scheduler.audit.expected import JobVersion, to_us
from scheduler.audit.inputs import (
    Source,
    in_window,
    read_history,
    read_log,
    read_partitions,
    read_unfired,
)
from scheduler.audit.output import Output
from scheduler.audit.summary import DEFAULT_HANDOVER_MARGIN, LISTED_HANDOVERS, Partitioning, Slo
from scheduler.audit.transforms import (
    classify,
    expected_occurrences,
    histogram,
    occurrences,
    per_hour,
    per_kind,
    per_minute,
    per_schedule,
    per_subject,
    with_idle_jobs,
)
from scheduler.audit.window import AuditWindow
from scheduler.errors import AuditInputError

TABLES = ("occurrences", "schedules", "subjects", "hours", "terms", "handovers")
Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(f"audit: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """Everything `scheduler audit` was asked to do, already checked."""

    window: AuditWindow
    source: Source
    out: Output
    schedules_dir: Path | None = None
    schedules_from: str = "auto"  # auto | yaml | history
    master: str | None = None
    slo: Slo = field(default_factory=Slo)
    jars: tuple[str, ...] = ()
    conf: tuple[tuple[str, str], ...] = ()
    partitions: int | None = None  # None: the database's `partitioning` row (JDBC), else 1
    handover_margin: timedelta = DEFAULT_HANDOVER_MARGIN


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
    options.out.prepare()
    spark, owned = session.start(
        options.master, list(options.jars), options.out.spark_log, dict(options.conf)
    )
    try:
        master = spark.sparkContext.master
        progress(f"spark {spark.version} on {master} ready in {time.monotonic() - began:.1f} s")
        result = Audit(spark, options, progress).run()
        result.run.update(master=master, spark=spark.version)
        result.run["seconds"] = round(time.monotonic() - began, 2)
        options.out.write_text(spark, "run.json", _json(result.run))
        from scheduler.audit import report

        options.out.write_text(spark, "report.html", report.render(result.summary, result.run))
        progress(f"report written to {options.out.path('report.html')}")
        return result
    finally:
        if owned:
            spark.stop()


def _json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, default=str) + "\n"


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
        log, uncounted = self.read(observation)
        expected = expected_occurrences(self.spark, versions, self.window)
        occ = classify(
            occurrences(log, expected, self.unfired()), self.window, self.options.slo.late_ms
        )
        occ.write.mode("overwrite").parquet(self.options.out.path("occurrences"))
        occ = self.spark.read.parquet(self.options.out.path("occurrences"))
        took = self._stage("occurrences", began)
        if (refused := _refusal(observation)) is not None:
            raise AuditInputError("--input", refused)
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
        partitioning = self.partitioning()
        tables = self.aggregate(occ, {v.name: v.subject for v in versions}, uncounted, partitioning)
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
            "handovers": summaries.handover_summary(
                partitioning,
                self.options.handover_margin,
                to_us(self.window.end) - to_us(self.window.start),
                tables["handovers"],
            ),
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
        self.options.out.write_text(self.spark, "summary.json", _json(doc))
        self.progress(
            f"aggregates: {len(doc['schedules']):,} schedule(s), {len(doc['subjects']):,} "
            f"subject(s) ({self.stages['aggregates']:.1f} s); SLO "
            + ("ok" if doc["slo"]["ok"] else f"BREACHED by {len(doc['slo']['breaches'])}")
        )
        self.progress(_handover_line(doc["handovers"], self.stages["handovers"]))
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
        from scheduler.cron.jobs import load_dir

        loaded = load_dir(opts.schedules_dir)
        for error in loaded.errors:
            self.progress(f"schedules: skipped: {error}")
        return [JobVersion.of_job(job) for job in loaded.jobs], str(opts.schedules_dir)

    def read(self, observation: Any) -> tuple[Any, Any]:
        """The usable in-window records, counted on the way by the occurrences stage (the
        log's full scan), and the same records uncounted, for the handovers' terms (a second
        scan, of the columns they need)."""
        from pyspark.sql import functions as F

        parallelism = self.spark.sparkContext.defaultParallelism
        raw = read_log(self.spark, self.options.source, self.window, max(4, 2 * parallelism))
        usable = F.col("problem").isNull() & in_window(self.window)
        counted = raw.observe(observation, *_observed(self.window))
        return (
            counted.filter(usable).drop("problem", "refusal"),
            raw.filter(usable).drop("problem", "refusal"),
        )

    def partitioning(self) -> Partitioning:
        """The partition count deliveries are assigned by: --partitions, else the database's
        `partitioning` row (JDBC), else 1."""
        opts = self.options
        if opts.partitions is not None:
            return Partitioning(opts.partitions, "--partitions")
        if opts.source.jdbc and (recorded := read_partitions(self.spark, opts.source)):
            return Partitioning(recorded, "partitioning table")
        return Partitioning()

    def handovers(
        self, log: Any, occ: Any, partitioning: Partitioning
    ) -> dict[str, list[dict[str, Any]]]:
        """The terms that fired each partition (to `terms/`: the small table every handover
        count starts from, so the log is read once more, not once per count), the handovers
        (all of them to `handovers/`), their counts, the faults near them and the first
        `LISTED_HANDOVERS`, as rows for `summary.handover_summary`. Small jobs one after
        the other, beside the aggregates."""
        began = time.monotonic()
        terms = self._written("terms", handovers.terms(log, partitioning.count))
        steps = handovers.handovers(terms)
        hoods = handovers.neighbourhoods(steps, self.options.handover_margin, self.window)
        # the late, missed and doubled runs, few: kept for the joins below instead of a scan
        # of the occurrence table for each
        faults = handovers.faults(occ, partitioning.count).persist()
        try:
            written = self._written("handovers", handovers.per_handover(steps, faults, hoods))
            work = {
                "listed": _first_handovers(written),
                "counts": handovers.counts(terms, written),
                "hours": handovers.per_hour(written),
                "faults": handovers.fault_counts(faults, hoods),
                "covered": handovers.covered(hoods),
            }
            rows = {name: [r.asDict() for r in frame.collect()] for name, frame in work.items()}
        finally:
            faults.unpersist()
        self._stage("handovers", began)
        return rows

    def _written(self, name: str, frame: Any) -> Any:
        """`frame` written to the table `name` (one file: these tables are small), read back."""
        path = self.options.out.path(name)
        frame.coalesce(1).write.mode("overwrite").parquet(path)
        return self.spark.read.parquet(path)

    def unfired(self) -> Any:
        if not self.options.source.jdbc:
            return None
        return read_unfired(self.spark, self.options.source, self.window)

    def aggregate(
        self, occ: Any, jobs: dict[str, str], log: Any, partitioning: Partitioning
    ) -> dict[str, Any]:
        """Every aggregate, three Spark jobs at a time (each is a scan of the occurrence table;
        running them side by side overlaps one's planning with another's tasks), the
        handovers' chain of small jobs first, beside them."""
        out = self.options.out
        known = self.spark.createDataFrame(list(jobs.items()), "key string, job_subject string")

        def table(name: str, frame: Any) -> Callable[[], list[dict[str, Any]]]:
            def written() -> list[dict[str, Any]]:
                frame.coalesce(1).write.mode("overwrite").parquet(out.path(name))
                return [r.asDict() for r in self.spark.read.parquet(out.path(name)).collect()]

            return written

        def rows(frame: Any) -> Callable[[], list[dict[str, Any]]]:
            return lambda: [r.asDict() for r in frame.collect()]

        work: dict[str, Callable[[], Any]] = {
            "handovers": lambda: self.handovers(log, occ, partitioning),
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


def _first_handovers(written: Any) -> Any:
    """The first `LISTED_HANDOVERS` handovers in order, with their times in µs."""
    from pyspark.sql import functions as F

    first = written.orderBy("first_fired_at", *handovers.HANDOVER).limit(LISTED_HANDOVERS)
    return first.select(
        "*",
        F.unix_micros("last_fired_at").alias("last_fired_us"),
        F.unix_micros("first_fired_at").alias("first_fired_us"),
    )


def _handover_line(block: dict[str, Any], seconds: float) -> str:
    """The progress line of the handovers (their chain of jobs ran beside the aggregates)."""
    near = block["near"]
    late = f"late {near['late']['near']:,} of {near['late']['all']:,}"
    missed = f"missed {near['missed']['near']:,} of {near['missed']['all']:,}"
    return (
        f"handovers: {block['count']:,} over {block['partitions']:,} partition(s) "
        f"({block['moves']:,} moved, {block['term_restarts']:,} term restarts, "
        f"{block['suspect']:,} suspect); {late}, {missed} due within "
        f"{near['margin_seconds']:g} s of one ({seconds:.1f} s)"
    )


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
        F.count("refusal").alias("refused"),
        F.min("refusal").alias("refusal"),  # the first by file and key: the same on every run
    ]
    for index, problem in enumerate(_PROBLEMS):
        hit = (F.col("problem") == problem).cast("long")
        metrics.append(F.sum(hit).alias(f"problem_{index}"))
    return metrics


def _refusal(observation: Any) -> str | None:
    """Why the log is refused (a record with a time without an offset, a `manual` that is not
    a boolean), naming the first such record and how many more there are; None if none."""
    got = observation.get
    count = int(got.get("refused") or 0)
    if not count:
        return None
    more = f" (and {count - 1:,} more record(s) like it)" if count > 1 else ""
    return f"{got['refusal']}{more}"


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
