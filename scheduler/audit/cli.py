"""`scheduler audit` and `scheduler export-log`. Importing this module does not import PySpark.

Exit codes of `audit`: 0 done (SLO met, or breached without --fail-on-slo), 1 SLO breached with
--fail-on-slo, 2 bad input (one line on stderr says what), 4 the audit could not run (Spark or
database failure; Spark's own log is OUT/spark.log).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler.audit.output import Output
from scheduler.audit.window import DEFAULT_GRACE, AuditWindow, parse_day, parse_instant
from scheduler.durations import parse_duration
from scheduler.errors import AuditInputError
from scheduler.partitions import MAX_PARTITIONS

if TYPE_CHECKING:  # the job module is imported only when an audit runs
    from scheduler.audit.job import AuditOptions

EXIT_BREACH, EXIT_BAD_INPUT, EXIT_FAILED = 1, 2, 4
DATABASE_ENV = "SCHEDULER_DATABASE_URL"


def _window_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--date", required=True, help="UTC day to audit: YYYY-MM-DD, today or yesterday"
    )
    parser.add_argument(
        "--grace",
        default=None,
        help="deliveries fired this long before or after the window still count (default 1h)",
    )


def configure_audit(parser: argparse.ArgumentParser) -> None:
    """Arguments of `scheduler audit`."""
    _window_arguments(parser)
    parser.add_argument(
        "--input",
        help="JSON lines or Parquet (file or folder), or jdbc:postgresql://host:port/db?user=..."
        f" / postgresql://user:pw@host/db (default: ${DATABASE_ENV})",
    )
    parser.add_argument("--input-format", choices=("json", "parquet"), help="override detection")
    parser.add_argument("--schedules", help="folder of scheduled_jobs YAML (the expected runs)")
    parser.add_argument(
        "--schedules-from",
        choices=("auto", "yaml", "history"),
        default="auto",
        help="expected runs from the YAML or the database's schedule_history (auto: history "
        "when the JDBC input has it for the day, else YAML)",
    )
    parser.add_argument(
        "--out", required=True, help="output folder (created), or a URL Spark writes (s3a://...)"
    )
    parser.add_argument("--master", help="Spark master URL (default local[*], or spark-submit's)")
    parser.add_argument("--late-ms", type=int, default=1000, help="late above this (default 1000)")
    parser.add_argument(
        "--slo-p99-ms", type=int, default=1000, help="lateness p99 SLO (default 1000)"
    )
    parser.add_argument("--fail-on-slo", action="store_true", help="exit 1 when the SLO breaks")
    parser.add_argument("--jdbc-jar", help="PostgreSQL JDBC driver jar (default Debian's)")
    parser.add_argument("--from", dest="since", help="audit from this RFC 3339 time in the day")
    parser.add_argument("--until", help="audit until this RFC 3339 time in the day (exclusive)")
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help="the deployment's partition count P, for handovers (default: the database's "
        "partitioning table over JDBC, else 1)",
    )
    parser.add_argument(
        "--handover-margin",
        default=None,
        help="a late, missed or doubled run due this close to a handover is near it (default 10s)",
    )


def _window(args: argparse.Namespace) -> AuditWindow:
    day = parse_day(args.date, datetime.now(UTC).date())
    since = parse_instant("--from", args.since) if getattr(args, "since", None) else None
    until = parse_instant("--until", args.until) if getattr(args, "until", None) else None
    grace = DEFAULT_GRACE
    if args.grace is not None:
        try:
            grace = parse_duration(args.grace)
        except (TypeError, ValueError) as exc:
            raise AuditInputError("--grace", str(exc)) from None
    return AuditWindow.of_day(day, since, until, grace)


def audit_options(args: argparse.Namespace) -> AuditOptions:
    """Check every option before Spark starts; AuditInputError says which one is wrong."""
    from scheduler.audit.inputs import classify, jdbc_jar
    from scheduler.audit.job import AuditOptions
    from scheduler.audit.summary import Slo

    window = _window(args)
    text = args.input or os.environ.get(DATABASE_ENV)
    if not text:
        raise AuditInputError("--input", f"required (or set {DATABASE_ENV})")
    source = classify(text, args.input_format)
    schedules = Path(args.schedules) if args.schedules else None
    if schedules is not None and not schedules.is_dir():
        raise AuditInputError("--schedules", f"{args.schedules!r} is not a directory")
    if schedules is None and (not source.jdbc or args.schedules_from == "yaml"):
        raise AuditInputError("--schedules", "required for a file input (folder of YAML)")
    for option, value in (("--late-ms", args.late_ms), ("--slo-p99-ms", args.slo_p99_ms)):
        if value < 0:
            raise AuditInputError(option, "must not be negative")
    conf = []
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AuditInputError("--conf", f"{item!r} is not KEY=VALUE")
        conf.append((key.strip(), value.strip()))
    jars = (jdbc_jar(args.jdbc_jar),) if source.jdbc else ()
    return AuditOptions(
        window=window,
        source=source,
        out=_writable(Output(args.out)),
        schedules_dir=schedules,
        schedules_from=args.schedules_from,
        master=args.master,
        slo=Slo(args.slo_p99_ms, args.late_ms),
        jars=jars,
        conf=tuple(conf),
        partitions=_partitions(args.partitions),
        handover_margin=_margin(args.handover_margin),
    )


def _partitions(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_PARTITIONS:
        raise AuditInputError("--partitions", f"{value} is not between 1 and {MAX_PARTITIONS}")
    return value


def _margin(text: str | None) -> timedelta:
    from scheduler.audit.summary import DEFAULT_HANDOVER_MARGIN

    if text is None:
        return DEFAULT_HANDOVER_MARGIN
    try:
        return parse_duration(text)
    except (TypeError, ValueError) as exc:
        raise AuditInputError("--handover-margin", str(exc)) from None


def _writable(out: Output) -> Output:
    """A local --out folder is created and checked now; a URL is Spark's to check."""
    if out.remote:
        return out
    folder = Path(out.location)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AuditInputError("--out", f"cannot create {out.location!r}: {exc.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AuditInputError("--out", f"{out.location!r} is not writable (permission denied)")
    return out


def java_problem() -> str | None:
    """None when a Java runtime is there for Spark, else what to do about it."""
    home = os.environ.get("JAVA_HOME")
    if (home and Path(home, "bin", "java").is_file()) or shutil.which("java"):
        return None
    return (
        "no Java runtime (java not on PATH, JAVA_HOME unset): install Java 17+, e.g. "
        "apt-get install openjdk-17-jre-headless"
    )


def cmd_audit(args: argparse.Namespace) -> int:
    """Run the audit; print a one-line verdict on stdout."""
    try:
        options = audit_options(args)
    except AuditInputError as exc:
        return _bad_input("audit", exc)
    if (problem := java_problem()) is not None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        print(f"scheduler audit: {problem}", file=sys.stderr)
        return EXIT_FAILED
    try:
        from scheduler.audit.job import run
    except ImportError as exc:
        print(
            f"scheduler audit: {exc.name or 'pyspark'} is missing: "
            "pip install 'mq-scheduler[audit]' (and a Java 17+ runtime)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        result = run(options)
    except AuditInputError as exc:
        return _bad_input("audit", exc)
    except Exception as exc:  # Spark or JDBC: one line, the detail is in spark.log
        return _failed(exc, options)
    doc = result.summary
    verdict = "SLO met" if result.ok else f"SLO BREACHED by {', '.join(doc['slo']['breaches'])}"
    totals = doc["totals"].get("cron", {})
    print(
        f"audit {doc['date']}: {verdict}; cron {totals.get('expected', 0):,} expected, "
        f"{totals.get('missed', 0):,} missed, {totals.get('doubled', 0):,} doubled; "
        f"report {options.out.path('report.html')}"
    )
    return EXIT_BREACH if args.fail_on_slo and not result.ok else 0


def _bad_input(verb: str, exc: AuditInputError) -> int:
    print(f"scheduler {verb}: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _failed(exc: Exception, options: AuditOptions) -> int:
    from scheduler.audit.inputs import connection_problem

    problem = connection_problem(exc) if options.source.jdbc else None
    if problem is not None:
        print(
            f"scheduler audit: --input: cannot read {options.source.display}: {problem}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    print(
        f"scheduler audit: failed: {first} (Spark's log: {options.out.spark_log})",
        file=sys.stderr,
    )
    return EXIT_FAILED


def configure_export(parser: argparse.ArgumentParser) -> None:
    """Arguments of `scheduler export-log`."""
    _window_arguments(parser)
    parser.add_argument("--out", required=True, help="file to write ('-' for stdout, jsonl only)")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--config", help="YAML config file (keys as the SCHEDULER_* variables)")


def cmd_export(args: argparse.Namespace) -> int:
    """Stream the day's fire_log from the configured database to a file."""
    from scheduler.audit import export
    from scheduler.errors import ConfigError
    from scheduler.settings import load_settings

    try:
        window = _window(args)
        if args.format == "parquet" and args.out == "-":
            raise AuditInputError("--out", "Parquet needs a file, not stdout")
    except AuditInputError as exc:
        return _bad_input("export-log", exc)
    dsn = load_settings(args.config).database_dsn
    if dsn is None:
        raise ConfigError(DATABASE_ENV, "not set (export-log reads fire_log from it)")
    count, seconds = export.run(dsn, window, args.out, args.format)
    where = "stdout" if args.out == "-" else args.out
    print(
        f"export-log {window.day}: {count:,} records to {where} in {seconds:.1f} s",
        file=sys.stderr,
    )
    return 0


def audit_main(argv: list[str] | None = None) -> int:
    """`python -m scheduler.audit` / `spark-submit .../scheduler/audit/__main__.py`."""
    parser = argparse.ArgumentParser(prog="scheduler-audit", description="the drift audit")
    configure_audit(parser)
    return cmd_audit(parser.parse_args(argv))
