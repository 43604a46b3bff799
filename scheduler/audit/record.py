"""The execution-log record (design section 7) and checks of a log's columns. Pure."""

from __future__ import annotations

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
    "boolean": {"boolean", "string"},
}


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
        if actual is None:
            continue
        base = actual.split("(")[0]
        if base not in _ACCEPTED[wanted]:
            kind = "a timestamp or an RFC 3339 string" if wanted == "timestamp" else wanted
            problems.append(f"{where}: column {name!r} is {actual}, expected {kind}")
    return problems


def json_key_problems(record: object, where: str) -> list[str]:
    """Problems of the first JSON record of a log: not an object, or required keys missing."""
    if not isinstance(record, dict):
        return [f"{where}: a line is not a JSON object (each line must be one log record)"]
    return column_problems({k: _json_type(v) for k, v in record.items()}, where)


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, float):
        return "double"
    if value is None or isinstance(value, str):
        return "string"
    return "struct"
