"""Where the log comes from: JSON lines, Parquet or PostgreSQL over JDBC.

`classify()` is pure (plus a look at local paths) so a bad `--input` fails before Spark starts;
the readers turn any source into the same normalized DataFrame: the record's columns, parsed,
and a `problem` column that says why a record cannot be used (None when it can).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlparse

from scheduler.audit.expected import JobVersion, from_us, to_us
from scheduler.audit.record import (
    DATE_LIKE,
    FIELDS,
    KINDS,
    NO_OFFSET,
    NOT_BOOLEAN,
    OPTIONAL,
    REQUIRED,
    RFC3339,
    TIMES,
    column_problems,
    json_key_problems,
)
from scheduler.audit.window import AuditWindow
from scheduler.errors import AuditInputError
from scheduler.store.postgres import task_states as states

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
JDBC_JAR_ENV = "SCHEDULER_JDBC_JAR"
JDBC_DRIVER = "org.postgresql.Driver"
FORMATS = ("json", "parquet")
_JSON_SUFFIXES = (".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz", ".ndjson.gz")
_OVERDUE_STATES = (states.PENDING, states.CLAIMED)
_LOST_STATES = ("dead", "expired")
# A task's state as the store reports it (scheduler.store.postgres.task_states: a claim keeps the
# task's ready status and sets `claimed_epoch`, migration 0013).
_STATE = states.reported()


@dataclass(frozen=True, slots=True)
class Source:
    """A classified `--input`: its format, where Spark reads it, and how to show it."""

    format: str  # json | parquet | jdbc
    location: str
    display: str
    properties: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def jdbc(self) -> bool:
        return self.format == "jdbc"


def classify(text: str, input_format: str | None = None) -> Source:
    """Check `--input` and say what it is; AuditInputError names what is wrong."""
    if text.startswith(("jdbc:", "postgresql://", "postgres://")):
        return jdbc_source(text)
    if "://" in text:  # hdfs://, s3a://, file://: Spark reads it; nothing to look at here
        fmt = input_format or ("parquet" if text.rstrip("/").endswith(".parquet") else "json")
        return Source(fmt, text, text)
    path = Path(text)
    if not path.exists():
        raise AuditInputError("--input", f"{text!r} does not exist")
    if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
        raise AuditInputError("--input", f"{text!r} is not readable (permission denied)")
    files = _data_files(path)
    if not files:
        raise AuditInputError("--input", f"{text!r} holds no log files")
    fmt = input_format or _guess_format(files)
    if fmt == "json":
        _check_first_json(files[0])
    else:
        _check_parquet_files(files)
    return Source(fmt, str(path.resolve()), text)


def _data_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = (p for p in sorted(path.rglob("*")) if p.is_file())
    return [p for p in found if not any(part.startswith(("_", ".")) for part in p.parts[-1:])]


def _guess_format(files: list[Path]) -> str:
    return "parquet" if any(p.suffix == ".parquet" for p in files) else "json"


def _check_first_json(path: Path) -> None:
    if not path.name.endswith(_JSON_SUFFIXES) and path.suffix not in ("", ".txt", ".log"):
        raise AuditInputError(
            "--input", f"{str(path)!r} is neither JSON lines nor Parquet (use --input-format)"
        )
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            line = next((ln for ln in handle if ln.strip()), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditInputError("--input", f"{str(path)!r} cannot be read as text: {exc}") from None
    if line is None:
        return  # an empty log is a valid log: nothing was delivered
    try:
        record = json.loads(line)
    except ValueError:
        raise AuditInputError(
            "--input", f"{str(path)!r}: the first line is not JSON (expected one record per line)"
        ) from None
    if problems := json_key_problems(record, str(path)):
        raise AuditInputError("--input", problems[0])


def _check_parquet_files(files: list[Path]) -> None:
    """Every Parquet file's columns, read from its footer before Spark starts: each file must be
    a usable log, and give the record's columns the types the first file gives them (Spark
    reads the folder with one schema and fails on a file that disagrees)."""
    first: tuple[Path, dict[str, Any]] | None = None
    for path in files:
        columns = _parquet_columns(path)
        dtypes = {name: _arrow_type(kind) for name, kind in columns.items()}
        if problems := column_problems(dtypes, str(path)):
            raise AuditInputError("--input", problems[0])
        if first is None:
            first = (path, columns)
        elif problem := _disagreement(path, columns, *first):
            raise AuditInputError("--input", problem)


def _parquet_columns(path: Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise AuditInputError("--input", f"{str(path)!r} is not readable Parquet: {exc}") from None
    return {f.name: f.type for f in schema}


def _disagreement(
    path: Path, columns: dict[str, Any], first: Path, expected: dict[str, Any]
) -> str | None:
    """How `path` gives one of the record's columns another type than `first`, or None."""
    for name in FIELDS:
        found, wanted = columns.get(name), expected.get(name)
        if found is None or wanted is None or _same_kind(found, wanted):
            continue
        return f"{str(path)!r}: column {name!r} is {found}, expected {wanted} as in {str(first)!r}"
    return None


def _same_kind(a: Any, b: Any) -> bool:
    """Types Spark reads as one: any string width, timestamps of any unit (with or without a
    zone on both sides); anything else must be equal."""
    import pyarrow.types as t

    if t.is_timestamp(a) and t.is_timestamp(b):
        return (a.tz is None) == (b.tz is None)
    strings = (t.is_string, t.is_large_string)
    if any(f(a) for f in strings) and any(f(b) for f in strings):
        return True
    return bool(a == b)


def _arrow_type(kind: Any) -> str:
    import pyarrow.types as t

    if t.is_string(kind) or t.is_large_string(kind):
        return "string"
    if t.is_timestamp(kind):
        return "timestamp"
    if t.is_integer(kind):
        return "bigint"
    if t.is_boolean(kind):
        return "boolean"
    return str(kind)


def jdbc_source(text: str) -> Source:
    """A PostgreSQL URL (`jdbc:postgresql://...` or `postgresql://user:pw@host/db`) as JDBC."""
    if text.startswith("jdbc:") and not text.startswith("jdbc:postgresql://"):
        raise AuditInputError("--input", "only jdbc:postgresql:// URLs are supported")
    parsed = urlparse(text.removeprefix("jdbc:"))
    query = dict(parse_qsl(parsed.query))
    if "host" in query or not parsed.hostname:
        raise AuditInputError(
            "--input", "JDBC needs a TCP host (postgresql://user@host:5432/db); not a unix socket"
        )
    props = {"driver": JDBC_DRIVER}
    if parsed.username:
        props["user"] = unquote(parsed.username)
    if parsed.password:
        props["password"] = unquote(parsed.password)
    for key in ("user", "password"):
        if key in query:
            props[key] = query.pop(key)
    host = parsed.hostname if ":" not in parsed.hostname else f"[{parsed.hostname}]"
    netloc = f"{host}:{parsed.port}" if parsed.port else host
    database = quote(unquote(parsed.path.lstrip("/")) or "postgres")
    url = f"jdbc:postgresql://{netloc}/{database}"
    if query:
        url += "?" + urlencode(query)
    shown = url + (f" (user {props['user']})" if "user" in props else "")
    return Source("jdbc", url, shown, props)


def jdbc_jar(explicit: str | None) -> str:
    """The PostgreSQL JDBC driver jar: --jdbc-jar, $SCHEDULER_JDBC_JAR or Debian's."""
    path = explicit or os.environ.get(JDBC_JAR_ENV) or DEFAULT_JDBC_JAR
    if not Path(path).is_file():
        raise AuditInputError(
            "--jdbc-jar",
            f"PostgreSQL JDBC driver {path!r} not found: install Debian's libpostgresql-jdbc-java "
            "or pass --jdbc-jar PATH",
        )
    return path


# --- Reading --------------------------------------------------------------------------------------


def read_log(spark: Any, source: Source, window: AuditWindow, slices: int) -> Any:
    """The log as normalized records with `problem` and `refusal` columns; JDBC reads only the
    window."""
    from pyspark.sql import functions as F

    if source.format == "json":
        from pyspark.sql import types as T

        # every field as text but `manual`: a JSON `"yes"` (or `"true"`) there makes the record
        # corrupt with its other fields kept, so the audit can name it
        fields = [
            T.StructField(name, T.BooleanType() if name == "manual" else T.StringType())
            for name in (*REQUIRED, *OPTIONAL)
        ]
        fields.append(T.StructField("_corrupt_record", T.StringType()))
        reader = spark.read.schema(T.StructType(fields)).option("mode", "PERMISSIVE")
        raw = reader.option("columnNameOfCorruptRecord", "_corrupt_record").json(source.location)
    elif source.format == "parquet":
        # the files' columns are checked to agree (classify); merged, a column that only some
        # files have (`manual`) is read from those and null elsewhere
        raw = spark.read.option("mergeSchema", "true").parquet(source.location)
        dtypes = dict(raw.dtypes)
        if problems := column_problems(dtypes, source.display):
            raise AuditInputError("--input", problems[0])
    else:
        raw = spark.read.jdbc(
            source.location,
            "fire_log",
            predicates=fired_at_slices(window, slices),
            properties={**source.properties, "fetchsize": "20000"},
        )
        return normalize(raw)
    return normalize(raw, F.regexp_replace(F.col("_metadata.file_path"), "^file:(//)?", ""))


def _sql_ts(instant: datetime) -> str:
    return f"TIMESTAMPTZ '{instant.isoformat()}'"


def fired_at_slices(window: AuditWindow, slices: int) -> list[str]:
    """One WHERE clause per Spark partition: equal `fired_at` ranges over the window plus its
    grace, each also bounded on `scheduled_for` (PostgreSQL prunes to the day's partitions)."""
    lo, hi = window.fired_from, window.fired_until
    step = (hi - lo) / slices
    edges = [lo + step * i for i in range(slices)] + [hi]
    due = f"scheduled_for >= {_sql_ts(window.start)} AND scheduled_for < {_sql_ts(window.end)}"
    return [
        f"fired_at >= {_sql_ts(a)} AND fired_at < {_sql_ts(b)} AND {due}"
        for a, b in itertools.pairwise(edges)
    ]


def normalize(raw: Any, origin: Any = None) -> Any:
    """Typed record columns, `problem` (why the record is unusable, or null) and `refusal` (why
    the whole log is refused, naming `origin` (its file) and the record, or null)."""
    from pyspark.sql import functions as F

    columns = set(raw.columns)
    dtypes = dict(raw.dtypes)

    def text(name: str) -> Any:
        if name not in columns:
            return F.lit(None).cast("string")
        return F.col(name) if dtypes[name] == "string" else F.col(name).cast("string")

    def parsed(name: str, sql_type: str) -> Any:
        if name not in columns:
            return F.lit(None).cast(sql_type)
        if dtypes[name] == "string" and sql_type == "timestamp":  # `t`/`z` are RFC 3339 too
            return F.expr(f"try_cast(upper(`{name}`) AS timestamp)")
        if dtypes[name] == "string":
            return F.expr(f"try_cast(`{name}` AS {sql_type})")
        return F.col(name) if dtypes[name] == sql_type else F.col(name).cast(sql_type)

    def absent(name: str) -> Any:
        return F.col(name).isNull() if name in columns else F.lit(True)

    kind, key, subject = text("kind"), text("key"), text("subject")
    scheduled, fired = (_rfc3339(parsed, text, dtypes, name) for name in TIMES)
    corrupt = F.col("_corrupt_record") if "_corrupt_record" in columns else F.lit(None)
    problem = (
        F.when(corrupt.isNotNull(), "not a JSON record")
        .when(kind.isNull(), "no kind")
        .when(~kind.isin(*KINDS), "kind is neither cron nor delayed")
        .when(key.isNull() | (key == ""), "no key")
        .when(subject.isNull() | (subject == ""), "no subject")
        .when(absent("scheduled_for"), "no scheduled_for")
        .when(scheduled.isNull(), "scheduled_for is not an RFC 3339 time")
        .when(absent("fired_at"), "no fired_at")
        .when(fired.isNull(), "fired_at is not an RFC 3339 time")
    )
    record = F.concat(
        F.lit("the log") if origin is None else origin,
        F.lit(": record "),
        F.coalesce(F.concat(F.lit("'"), key, F.lit("'")), F.lit("with no key")),
        F.lit(" ("),
        F.coalesce(kind, F.lit("no kind")),
        F.lit("): "),
    )
    refusals = [_time_refusal(text, dtypes, name, record) for name in TIMES]
    if "_corrupt_record" in columns:
        refusals.append(_manual_refusal(corrupt, record))
    refusal = F.coalesce(*refusals)
    return raw.select(
        kind.alias("kind"),
        key.alias("key"),
        subject.alias("subject"),
        scheduled.alias("scheduled_for"),
        fired.alias("fired_at"),
        parsed("attempt", "int").alias("attempt"),
        parsed("epoch", "bigint").alias("epoch"),
        text("instance").alias("instance"),
        parsed("stream_seq", "bigint").alias("stream_seq"),
        F.coalesce(parsed("manual", "boolean"), F.lit(False)).alias("manual"),
        problem.alias("problem"),
        refusal.alias("refusal"),
    )


def _rfc3339(parsed: Any, text: Any, dtypes: dict[str, str], name: str) -> Any:
    """A time column; text that is not RFC 3339 with an offset is null (Spark alone would read
    `2026-11-21` or `2026-11-21T06:00:00` as UTC)."""
    from pyspark.sql import functions as F

    value = parsed(name, "timestamp")
    if dtypes.get(name) != "string":
        return value
    return F.when(text(name).rlike(RFC3339), value)


def _time_refusal(text: Any, dtypes: dict[str, str], name: str, record: Any) -> Any:
    """Why a time given as text that starts like a date is refused (no offset, a date alone)."""
    from pyspark.sql import functions as F

    if dtypes.get(name) != "string":
        return F.lit(None).cast("string")
    value = text(name)
    bad = value.rlike(DATE_LIKE) & ~value.rlike(RFC3339)
    shown = F.concat(F.lit(f'{name} "'), F.substring(value, 1, 60), F.lit(f'" {NO_OFFSET}'))
    return F.when(bad, F.concat(record, shown))


def _manual_refusal(corrupt: Any, record: Any) -> Any:
    """Why a JSON record whose `manual` is not a boolean is refused: the line is JSON (it parses
    as an object) yet the reader flagged it, and `manual` is the one field read as non-text."""
    from pyspark.sql import functions as F

    fields = F.from_json(corrupt, "map<string,string>")
    value = F.regexp_extract(corrupt, _MANUAL_VALUE, 1)
    bad = corrupt.isNotNull() & fields.isNotNull() & fields.getItem("manual").isNotNull()
    shown = F.concat(F.lit("manual is "), F.substring(value, 1, 60), F.lit(f", {NOT_BOOLEAN}"))
    return F.when(bad, F.concat(record, shown))


# `"manual": <value>` in a raw JSON line: a string (with escapes) or a bare token
_MANUAL_VALUE = r'"manual"\s*:\s*("(?:[^"\\]|\\.)*"|[^,}\s]+)'


def in_window(window: AuditWindow) -> Any:
    """The filter of records the audit counts: due in the window, fired within its grace."""
    from pyspark.sql import functions as F

    due = (F.col("scheduled_for") >= F.lit(window.start)) & (F.col("scheduled_for") < window.end)
    fired = (F.col("fired_at") >= F.lit(window.fired_from)) & (
        F.col("fired_at") < F.lit(window.fired_until)
    )
    return due & fired


def _jdbc_query(spark: Any, source: Source, sql: str) -> Any:
    return spark.read.jdbc(source.location, f"({sql}) AS q", properties=source.properties)


def read_history(spark: Any, source: Source, window: AuditWindow) -> list[JobVersion] | None:
    """Job versions in force during the window from `schedule_history`; None when the table
    is missing or does not reach back to the window's start (then the YAML is used)."""
    us = "(extract(epoch FROM {0}) * 1000000)::bigint"
    try:
        first = _jdbc_query(
            spark, source, f"SELECT {us.format('min(valid_from)')} AS first FROM schedule_history"
        )
        start = first.collect()[0]["first"]
    except Exception as exc:
        if _missing_relation(exc, "schedule_history"):
            return None
        raise
    if start is None or start > to_us(window.start):
        return None
    sql = (
        f"SELECT definition::text AS definition, {us.format('valid_from')} AS since, "
        f"{us.format('valid_to')} AS until FROM schedule_history "
        f"WHERE valid_from < {_sql_ts(window.end)} AND "
        f"(valid_to IS NULL OR valid_to > {_sql_ts(window.start)}) ORDER BY name, valid_from"
    )
    rows = _jdbc_query(spark, source, sql).collect()
    return [
        JobVersion.of_definition(
            r["definition"],
            from_us(r["since"]),
            None if r["until"] is None else from_us(r["until"]),
        )
        for r in rows
    ]


def read_partitions(spark: Any, source: Source) -> int | None:
    """The deployment's partition count from its `partitioning` row (migration 0022); None
    when the table is missing (a database from before partitions: one leader, P = 1)."""
    try:
        rows = _jdbc_query(
            spark, source, "SELECT partitions FROM partitioning WHERE id = 1"
        ).collect()
    except Exception as exc:
        if _missing_relation(exc, "partitioning"):
            return None
        raise
    return int(rows[0]["partitions"]) if rows else None


def read_unfired(spark: Any, source: Source, window: AuditWindow) -> Any:
    """Delayed tasks due in the window that were not delivered: still pending or claimed now
    (overdue), or dead-lettered or expired. Columns: key, subject, scheduled_for, state."""
    states = ", ".join(f"'{s}'" for s in (*_OVERDUE_STATES, *_LOST_STATES))
    sql = (
        f"SELECT key, subject, scheduled_for, state FROM (SELECT id AS key, target AS subject, "
        f"scheduled_for, {_STATE} AS state FROM delayed_messages WHERE scheduled_for >= "
        f"{_sql_ts(window.start)} AND scheduled_for < {_sql_ts(window.end)}) AS t "
        f"WHERE state IN ({states})"
    )
    return _jdbc_query(spark, source, sql)


_MISSING = re.compile(r'relation "([^"]+)" does not exist')


def _missing_relation(exc: BaseException, name: str) -> bool:
    return any(m == name for m in _MISSING.findall(str(exc)))


def connection_problem(exc: BaseException) -> str | None:
    """The PostgreSQL driver's own message when `exc` (or a Java exception it wraps) is a
    connection or login failure; None for anything else."""
    texts = [str(exc)]
    origin = getattr(exc, "_origin", None)  # PySpark keeps the Java throwable here
    while origin is not None and len(texts) < 12:
        texts.append(str(origin.toString()))
        origin = origin.getCause()
    for text in texts:
        match = re.search(r"org\.postgresql\.util\.PSQLException: ([^\n]+)", text)
        if match:
            return match.group(1).strip()
    if any("FAILED_JDBC.CONNECTION" in t for t in texts):
        return "could not connect to the database"
    return None
