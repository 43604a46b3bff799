"""Read a Celery beat schedule from its Python config without running it: the file is parsed
with `ast` and only literal values are read (never exec, eval or import).

Found: `beat_schedule` / `CELERYBEAT_SCHEDULE` / `CELERY_BEAT_SCHEDULE` dicts (assigned, as
`conf.update(beat_schedule=...)`, `.update({...})` or one key at a time), and the `timezone` /
`CELERY_TIMEZONE` setting. Each entry's `schedule` maps when it is `crontab(...)` with literal
fields, or an interval (`schedule(timedelta(...))`, `timedelta(...)`, a number of seconds) that
divides a minute, hour or day. `task`, `args`, `kwargs` go into `data`. Pure.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from scheduler.cron.expression import CronExpr, CronSyntaxError
from scheduler.cron.imported import (
    MAX_INTERVAL,
    Entry,
    Parsed,
    UnreadableInput,
    human_seconds,
    interval_cron,
)

SCHEDULE_NAMES = {"beat_schedule", "CELERYBEAT_SCHEDULE", "CELERY_BEAT_SCHEDULE"}
ZONE_NAMES = {"timezone", "CELERY_TIMEZONE"}
_CRONTAB_ARGS = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
_TIMEDELTA_ARGS = ("days", "seconds", "microseconds", "milliseconds", "minutes", "hours", "weeks")
_SECONDS = {"days": 86400, "seconds": 1, "microseconds": 1e-6, "milliseconds": 1e-3,
            "minutes": 60, "hours": 3600, "weeks": 604800}  # fmt: skip
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_ROUTING = ("queue", "exchange", "routing_key")
NOT_LITERAL = "is not written as a literal; the importer reads the file, it does not run it"


def parse_celery(text: str, source: str) -> Parsed:
    """The beat entries of a Celery config; UnreadableInput if it is not Python."""
    try:
        tree = ast.parse(text, filename=source)
    except SyntaxError as exc:
        raise UnreadableInput(f"{source}:{exc.lineno or 0}: not Python: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise UnreadableInput(f"{source}: cannot be parsed: {type(exc).__name__}") from None
    entries: list[Entry] = []
    zones: list[str] = []
    for node in ast.walk(tree):
        for key, value in _schedule_items(node):
            entries.append(_entry(key, value))
        if isinstance(node, ast.Call) and _call_name(node) == "add_periodic_task":
            entries.append(_periodic_task(node))
        zones += _zones(node)
    zone = zones[-1] if zones else None
    notes = [
        "mq-scheduler runs no task: it publishes to the job's subject, and a worker there runs "
        "data.task with data.args and data.kwargs"
    ]
    if zone is not None:
        entries, problem = _with_zone(entries, zone)
        notes += [problem] if problem else []
    elif entries:
        notes.append("no timezone setting: Celery reads crontab() in UTC; so do these jobs")
    entries.sort(key=lambda e: e.line)
    return Parsed(source, tuple(entries), tuple(notes))


def _periodic_task(call: ast.Call) -> Entry:
    name = _keyword(call, "name")
    hint = name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else ""
    reason = (
        "add_periodic_task() names its task by a code reference, which only running the app "
        "resolves; write it as a beat_schedule entry (task by its registered name)"
    )
    return Entry(call.lineno, hint or f"periodic-task-line-{call.lineno}", skipped=reason)


def _schedule_items(node: ast.AST) -> list[tuple[ast.expr | None, ast.expr]]:
    """(key, entry) pairs that `node` adds to a beat schedule."""
    if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        found: list[tuple[ast.expr | None, ast.expr]] = []
        for target in targets:
            if _named(target) in SCHEDULE_NAMES:
                found += _dict_items(node.value)
            elif isinstance(target, ast.Subscript) and _named(target.value) in SCHEDULE_NAMES:
                found.append((target.slice, node.value))
        return found
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "update" and _named(node.func.value) in SCHEDULE_NAMES and node.args:
            return _dict_items(node.args[0])
        return [
            item
            for kw in node.keywords
            if kw.arg in SCHEDULE_NAMES
            for item in _dict_items(kw.value)
        ]
    return []


def _named(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _dict_items(node: ast.expr) -> list[tuple[ast.expr | None, ast.expr]]:
    return list(zip(node.keys, node.values, strict=True)) if isinstance(node, ast.Dict) else []


def _zones(node: ast.AST) -> list[str]:
    values: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        values += [node.value for t in node.targets if _named(t) in ZONE_NAMES]
    elif isinstance(node, ast.Call):
        values += [kw.value for kw in node.keywords if kw.arg in ZONE_NAMES]
    return [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]


def _with_zone(entries: list[Entry], zone: str) -> tuple[list[Entry], str | None]:
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return entries, f"timezone {zone!r}: unknown time zone; jobs written in --timezone's"
    out = []
    for entry in entries:
        job = {**entry.job, "timezone": zone} if entry.skipped is None else entry.job
        out.append(Entry(entry.line, entry.name_hint, job, entry.skipped, entry.lost, entry.notes))
    return out, None


def _entry(key: ast.expr | None, value: ast.expr) -> Entry:
    line = value.lineno
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return Entry(line, f"celery-line-{line}", skipped=f"the entry's name {NOT_LITERAL}")
    name = key.value
    fields = _dict_items(value)
    if not fields or any(not _is_str(k) for k, _ in fields):
        return Entry(line, name, skipped=f"the entry {NOT_LITERAL} (a dict of literal keys)")
    spec = {
        k.value: v for k, v in fields if isinstance(k, ast.Constant) and isinstance(k.value, str)
    }
    job: dict[str, Any] = {"description": f"Celery beat entry {name!r}"}
    lost: list[str] = []
    notes: list[str] = []
    problem = (
        _task(spec, job)
        or _when(spec.get("schedule"), job, notes)
        or _options(spec.get("options"), job, lost, notes)
    )
    if problem is not None:
        return Entry(line, name, skipped=problem)
    return Entry(line, name, job, lost=tuple(lost), notes=tuple(notes))


def _number(value: Any) -> bool:
    """An int or a finite float (True is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


def _is_str(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NotLiteral


class _NotLiteral:
    """Marks a value that is not a literal."""


def _task(spec: dict[str, ast.expr], job: dict[str, Any]) -> str | None:
    task = spec.get("task")
    if task is None or not _is_str(task):
        return f"'task' is missing or {NOT_LITERAL}" if task is not None else "'task' is missing"
    data: dict[str, Any] = {"task": _literal(task)}
    for key in ("args", "kwargs"):
        if key not in spec:
            continue
        value = _literal(spec[key])
        if value is _NotLiteral:
            return f"'{key}' {NOT_LITERAL}"
        try:
            data[key] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            return f"'{key}' {value!r} is not JSON (the envelope's data is)"
    job["data"] = data
    return None


def _when(node: ast.expr | None, job: dict[str, Any], notes: list[str]) -> str | None:
    """Put the entry's `schedule` into `job` as cron; why not, or None."""
    if node is None:
        return "'schedule' is missing"
    call = _call_name(node)
    if call == "crontab" and isinstance(node, ast.Call):
        return _crontab(node, job, notes)
    if call == "solar":
        return "solar() follows sunrise and sunset at a place; no cron expression does"
    if call == "schedule" and isinstance(node, ast.Call):
        every = node.args[0] if node.args else _keyword(node, "run_every")
        return _interval(every, job, notes)
    return _interval(node, job, notes)


def _call_name(node: ast.expr) -> str | None:
    return _named(node.func) if isinstance(node, ast.Call) else None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _interval(node: ast.expr | None, job: dict[str, Any], notes: list[str]) -> str | None:
    seconds = _seconds(node) if node is not None else None
    if seconds is None:
        return (
            "'schedule' is not crontab(), schedule(), timedelta() or a number of seconds "
            "written as literals; the importer reads the file, it does not run it"
        )
    cron = interval_cron(seconds)
    if cron is None:
        return (
            f"'schedule' every {human_seconds(seconds)}: that divides no minute, hour or day "
            "evenly, so no cron expression fires at that interval"
        )
    job["cron"] = cron
    notes.append(
        f"every {human_seconds(seconds)} -> {cron!r}: on the clock's multiples, not counted "
        "from beat's start or the last run"
    )
    return None


def _seconds(node: ast.expr) -> float | None:
    value = _literal(node)
    if _number(value):
        return float(value) if abs(value) <= MAX_INTERVAL else None
    if _call_name(node) != "timedelta" or not isinstance(node, ast.Call):
        return None
    total = 0.0
    parts = [*zip(_TIMEDELTA_ARGS, node.args, strict=False)]
    parts += [(kw.arg, kw.value) for kw in node.keywords if kw.arg is not None]
    if len(parts) != len(node.args) + len(node.keywords):
        return None
    for unit, arg in parts:
        amount = _literal(arg)
        if unit not in _SECONDS or not _number(amount) or abs(amount) > MAX_INTERVAL:
            return None
        total += amount * _SECONDS[unit]
    return total


def _crontab(call: ast.Call, job: dict[str, Any], notes: list[str]) -> str | None:
    given: dict[str, ast.expr] = dict(zip(_CRONTAB_ARGS, call.args, strict=False))
    for kw in call.keywords:
        if kw.arg in _CRONTAB_ARGS:
            given[kw.arg] = kw.value
        elif kw.arg is not None:
            notes.append(f"crontab({kw.arg}=...) left out")
    fields: dict[str, str] = {}
    for name in _CRONTAB_ARGS:
        text = _cron_field(name, given[name]) if name in given else "*"
        if text is None:
            return f"crontab({name}=...) {NOT_LITERAL} (a string, a number, or a set of numbers)"
        fields[name] = text
    dom, dow = fields["day_of_month"], fields["day_of_week"]
    if not dom.startswith("*") and not dow.startswith("*"):
        return (
            f"crontab(day_of_month={dom!r}, day_of_week={dow!r}): Celery runs on days matching "
            "both, cron on days matching either; no cron expression says both"
        )
    cron = " ".join(fields[n] for n in ("minute", "hour", "day_of_month", "month_of_year"))
    cron = f"{cron} {dow}"
    try:
        CronExpr.parse(cron)
    except CronSyntaxError as exc:
        return f"crontab(): {exc}"
    job["cron"] = cron
    return None


def _cron_field(name: str, node: ast.expr) -> str | None:
    value = _literal(node)
    if isinstance(value, str):
        text = " ".join(value.split()).replace(" ", "")
        return _day_names(text) if name == "day_of_week" else text
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list | tuple | set | frozenset) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(str(v) for v in sorted(value))
    if _call_name(node) == "range" and isinstance(node, ast.Call):
        bounds = [_literal(a) for a in node.args]
        small = all(_number(b) and isinstance(b, int) and abs(b) <= 1000 for b in bounds)
        if small and 1 <= len(bounds) <= 3 and (len(bounds) < 3 or bounds[2] != 0):
            numbers = range(*bounds)
            return ",".join(str(n) for n in numbers) if 0 < len(numbers) <= 60 else None
    return None


def _day_names(text: str) -> str:
    """Celery also takes whole day names (`monday`): cron's are three letters."""
    out = []
    for term in text.split(","):
        parts = [p[:3] if p[:3].lower() in _DAYS else p for p in term.split("-")]
        out.append("-".join(parts))
    return ",".join(out)


def _options(
    node: ast.expr | None, job: dict[str, Any], lost: list[str], notes: list[str]
) -> str | None:
    if node is None:
        return None
    options = _literal(node)
    if not isinstance(options, dict):
        return f"'options' {NOT_LITERAL}"
    for key, value in options.items():
        if key == "expires" and _number(value) and 0 < value <= MAX_INTERVAL:
            job["ttl_seconds"] = max(1, round(value))
            notes.append(f"options expires={value} -> ttl_seconds: {job['ttl_seconds']}")
        elif key in _ROUTING:
            notes.append(f"options {key}={value!r}: the job's subject routes it instead")
        else:
            lost.append(f"options {key}={value!r}: no counterpart in a job")
    return None
