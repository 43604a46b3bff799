"""The execution-log record (docs/drift-audit.md, "The input") and checks of a log's columns.
Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

# field -> what it must be; Spark type names as `DataFrame.dtypes` spells them
REQUIRED = {
    "kind": "string",
    "key": "string",
    "subject": "string",
    "scheduled_for": "timestamp",
    "fired_at": "timestamp",
}
OPTIONAL = {
    "attempt": "bigint",
    "epoch": "bigint",
    "instance": "string",
    "stream_seq": "bigint",
    "manual": "boolean",  # an operator's "trigger now" (fire_log.manual): not an occurrence
}
FIELDS = {**REQUIRED, **OPTIONAL}
KINDS = ("cron", "delayed")
_ACCEPTED = {
    "string": {"string"},
    "timestamp": {"timestamp", "timestamp_ntz", "string"},
    "bigint": {"bigint", "int", "smallint", "tinyint", "string", "decimal"},
    "boolean": {"boolean"},  # Spark would read "yes", "t" or "1" as true: only a real boolean
}
TIMES = ("scheduled_for", "fired_at")
# A time as text: RFC 3339 with seconds and an offset (`2026-11-21T06:00:00.012Z`). Python and
# Java regex spell it the same; the audit matches it in Python (first record) and Spark (all).
RFC3339 = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
# Text that starts like a date but is not RFC 3339 (a date alone, a time without an offset,
# `+0100`): a log written in another format, refused; Spark would read most of these as UTC.
DATE_LIKE = r"^\d{4}-\d{2}-\d{2}"
NO_OFFSET = "is not an RFC 3339 time with an offset (like 2026-11-21T06:00:00.012Z)"
NOT_BOOLEAN = "expected true or false (a JSON boolean)"


def column_problems(dtypes: Mapping[str, str], where: str) -> list[str]:
    """What is wrong with a log whose columns are `dtypes` (name -> Spark type); [] if usable."""
    missing = [name for name in REQUIRED if name not in dtypes]
    if missing:
        found = ", ".join(sorted(dtypes)) or "none"
        return [
            f"{where}: no column {', '.join(repr(m) for m in missing)} "
            f"(a log record needs {', '.join(REQUIRED)}; found: {found})"
        ]
    problems = []
    for name, wanted in FIELDS.items():
        actual = dtypes.get(name)
        if actual is None or actual == "null":  # a null is the record's problem, not the log's
            continue
        base = actual.split("(")[0]
        if base not in _ACCEPTED[wanted]:
            kind = "a timestamp or an RFC 3339 string" if wanted == "timestamp" else wanted
            problems.append(f"{where}: column {name!r} is {actual}, expected {kind}")
    return problems


def json_key_problems(record: object, where: str) -> list[str]:
    """Problems of the first JSON record of a log: not an object, required keys missing, a
    `manual` that is not a boolean, a time that is not RFC 3339 with an offset."""
    if not isinstance(record, dict):
        return [f"{where}: a line is not a JSON object (each line must be one log record)"]
    if _json_type(record.get("manual")) not in ("boolean", "null"):
        return [f"{where}: {_named(record)}: manual is {_json(record['manual'])}, {NOT_BOOLEAN}"]
    if problems := column_problems({k: _json_type(v) for k, v in record.items()}, where):
        return problems
    return [
        f"{where}: {_named(record)}: {name} {_json(record[name])} {NO_OFFSET}"
        for name in TIMES
        if refused_time(record[name])
    ]


def refused_time(value: object) -> bool:
    """True for text that starts like a date but is not RFC 3339 with an offset (junk that is no
    date at all is an unusable record, counted, not a reason to stop)."""
    return (
        isinstance(value, str)
        and re.match(RFC3339, value) is None
        and re.match(DATE_LIKE, value) is not None
    )


def _named(record: Mapping[str, object]) -> str:
    key, kind = record.get("key"), record.get("kind")
    return f"record {key if not isinstance(key, str) else repr(key)} ({kind})"


def _json(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "string"
    return "struct"
