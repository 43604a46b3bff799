"""Read Kubernetes CronJob manifests: one or more YAML documents (`---`), or a `kind: List`
as `kubectl get cronjobs -o yaml` prints it. Other kinds are passed over with a note.

Mapped: `spec.schedule` (Kubernetes reads it with robfig/cron: five fields, `?`, macros,
`@every`), `spec.timeZone`, `spec.suspend` -> `paused`, `spec.startingDeadlineSeconds` ->
`catchup_window`, `spec.concurrencyPolicy` Forbid -> `concurrency: forbid`. The job template's
containers (name, image, command, args) go into `data`, for the worker. Pure.
"""

from __future__ import annotations

import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from scheduler.cron.expression import MACROS, CronExpr, CronSyntaxError
from scheduler.cron.imported import (
    Entry,
    Parsed,
    UnreadableInput,
    foreign_term,
    human_seconds,
    interval_cron,
)
from scheduler.cron.jobs import too_big

_GO_DURATION = re.compile(r"(?:\d+(?:\.\d*)?(?:h|m|s|ms))+")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_TZ_PREFIX = re.compile(r"(?:CRON_TZ|TZ)=(\S+)\s+(.*)")
_CONTAINER_KEYS = ("name", "image", "command", "args")
REPLACE = (
    "concurrencyPolicy Replace (stop the running Job, start the new one): nothing here stops "
    "a worker's run; written as concurrency: allow"
)
FORBID = (
    "concurrencyPolicy Forbid -> concurrency: forbid, which skips an occurrence while the last "
    "message is still unacknowledged in a work-queue stream (docs/cron.md); it does not see "
    "whether a worker's run has finished"
)


def parse_cronjobs(text: str, source: str) -> Parsed:
    """The CronJobs among the manifests of `text`; UnreadableInput if it is not YAML."""
    entries: list[Entry] = []
    notes: list[str] = []
    for line, doc in _documents(text, source):
        for item_line, item in _items(line, doc):
            kind = item.get("kind") if isinstance(item, dict) else None
            if kind == "CronJob" and isinstance(item, dict):
                entries.append(_cronjob(item, item_line))
            elif item is not None:
                shown = f"kind {kind!r}" if kind else f"a {type(item).__name__}"
                notes.append(f"line {item_line}: {shown} is not a CronJob: passed over")
    if any(e.skipped is None and "timezone" not in e.job for e in entries):
        notes.append(
            "CronJobs without spec.timeZone run in kube-controller-manager's zone (UTC on most "
            "clusters); they are written in --timezone's (UTC unless given)"
        )
    if any(e.skipped is None and "catchup_window" not in e.job for e in entries):
        notes.append(
            "without startingDeadlineSeconds Kubernetes starts the last missed run however late; "
            "here catchup_window keeps its default, 1h"
        )
    return Parsed(source, tuple(entries), tuple(notes))


def _documents(text: str, source: str) -> list[tuple[int, Any]]:
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a control character, before any parsing
        line = text.count("\n", 0, exc.position) + 1
        raise UnreadableInput(
            f"{source}:{line}: not YAML: character #x{exc.character:04x}"
        ) from None
    found: list[tuple[int, Any]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            if (problem := too_big(node)) is not None:
                raise UnreadableInput(f"{source}:{node.start_mark.line + 1}: {problem}")
            found.append((node.start_mark.line + 1, loader.construct_document(node)))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UnreadableInput(f"{source}{where}: not YAML: {problem}") from None
    except (RecursionError, ValueError, TypeError, AttributeError, OverflowError) as exc:
        if isinstance(exc, UnreadableInput):
            raise
        raise UnreadableInput(f"{source}: YAML that cannot be built: {exc}") from None
    finally:
        loader.dispose()
    return found


def _items(line: int, doc: Any) -> list[tuple[int, Any]]:
    if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        return [(line, item) for item in doc["items"]]
    return [(line, doc)]


def _cronjob(doc: dict[str, Any], line: int) -> Entry:
    found = doc.get("metadata")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    name = str(meta.get("name") or f"cronjob-line-{line}")
    namespace = meta.get("namespace")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return Entry(line, name, skipped="spec: missing or not a mapping")
    job: dict[str, Any] = {"description": f"Kubernetes CronJob {namespace or 'default'}/{name}"}
    lost: list[str] = []
    notes: list[str] = []
    problem = (
        _schedule(spec.get("schedule"), job, notes)
        or _zone(spec.get("timeZone"), job)
        or _policy(spec.get("concurrencyPolicy"), job, lost, notes)
        or _suspend(spec.get("suspend"), job)
        or _deadline(spec.get("startingDeadlineSeconds"), job)
    )
    if problem is not None:
        return Entry(line, name, skipped=problem)
    job["data"] = _data(name, namespace, spec)
    return Entry(line, name, job, lost=tuple(lost), notes=tuple(notes))


def _schedule(value: Any, job: dict[str, Any], notes: list[str]) -> str | None:
    """Put `spec.schedule` into `job` as cron (and timezone); why not, or None."""
    if not isinstance(value, str) or not value.strip():
        return "spec.schedule: missing or not a string"
    text = " ".join(value.split())
    if (prefixed := _TZ_PREFIX.fullmatch(text)) is not None:
        job["timezone"], text = prefixed.group(1), prefixed.group(2)
        notes.append("spec.schedule's TZ= prefix read as the zone (Kubernetes 1.27+ refuses it)")
    if text.lower().startswith("@every"):
        return _every(text, job, notes)
    if text.startswith("@"):
        if text.lower() not in MACROS:
            return f"spec.schedule {text!r}: unknown macro (known: @every, {', '.join(MACROS)})"
        job["cron"] = text.lower()
        return None
    fields = text.split()
    if len(fields) != 5:
        return f"spec.schedule {text!r}: Kubernetes reads five fields, not {len(fields)}"
    return _fields(fields, job, notes)


def _every(text: str, job: dict[str, Any], notes: list[str]) -> str | None:
    duration = text[len("@every") :].strip()
    if not _GO_DURATION.fullmatch(duration):
        return f"spec.schedule {text!r}: {duration!r} is not a duration like 90s, 5m, 1h30m"
    seconds = sum(float(n) * _UNIT[u] for n, u in _GO_PART.findall(duration))
    cron = interval_cron(seconds)
    if cron is None:
        return (
            f"spec.schedule {text!r}: every {human_seconds(seconds)} divides no minute, hour "
            "or day evenly, so no cron expression fires at that interval"
        )
    job["cron"] = cron
    notes.append(
        f"@every {duration} -> {cron!r}: on the clock's multiples, not counted from the "
        "controller's start"
    )
    return None


def _fields(fields: list[str], job: dict[str, Any], notes: list[str]) -> str | None:
    names = ("minute", "hour", "day-of-month", "month", "day-of-week")
    for name, text in zip(names, fields, strict=True):
        term = foreign_term(text.replace("?", "*"))  # robfig reads `?` as `*`
        if term is not None:
            return f"spec.schedule {name} field {text!r}: {term!r} is not cron that jobs here take"
    fields = [f.replace("?", "*") for f in fields]
    dom, dow = fields[2], fields[4]
    robfig_and = _robfig_star(dom) or _robfig_star(dow)
    if robfig_and and not (dom.startswith("*") or dow.startswith("*")):
        return (
            f"spec.schedule days {dom!r} and {dow!r}: Kubernetes matches both (a '*' term), "
            "cron here either; write the '*' term first or drop it"
        )
    if not robfig_and and (dom.startswith("*") or dow.startswith("*")):
        fields[2], fields[4] = re.sub(r"^\*", "1-31", dom), re.sub(r"^\*", "0-6", dow)
        notes.append(
            f"days {dom!r} {dow!r}: Kubernetes matches either day for a stepped '*'; "
            f"written as {fields[2]!r} {fields[4]!r} to keep that"
        )
    cron = " ".join(fields)
    try:
        expr = CronExpr.parse(cron)
    except CronSyntaxError as exc:
        return f"spec.schedule: {exc}"
    if expr.day_or:
        notes.append("day-of-month and day-of-week both set: fires on either (as Kubernetes does)")
    job["cron"] = cron
    return None


def _robfig_star(field_text: str) -> bool:
    """robfig/cron's star bit: some term is `*` or `?` with no step above 1."""
    for term in field_text.split(","):
        base, _, step = term.partition("/")
        if base in ("*", "?") and step in ("", "1"):
            return True
    return False


def _zone(value: Any, job: dict[str, Any]) -> str | None:
    if value is None:
        return None
    zone = value if isinstance(value, str) else None
    try:
        ZoneInfo(zone or "")
    except (ZoneInfoNotFoundError, ValueError):
        return f"spec.timeZone {value!r}: unknown time zone (use an IANA name)"
    job["timezone"] = zone
    return None


def _policy(value: Any, job: dict[str, Any], lost: list[str], notes: list[str]) -> str | None:
    if value in (None, "Allow"):
        return None
    if value == "Forbid":
        job["concurrency"] = "forbid"
        notes.append(FORBID)
        return None
    if value == "Replace":
        lost.append(REPLACE)
        return None
    return f"spec.concurrencyPolicy {value!r}: not Allow, Forbid or Replace"


def _suspend(value: Any, job: dict[str, Any]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        return f"spec.suspend {value!r}: not true or false"
    if value:
        job["paused"] = True
    return None


def _deadline(value: Any, job: dict[str, Any]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return f"spec.startingDeadlineSeconds {value!r}: not a whole number of seconds >= 1"
    job["catchup_window"] = f"{value}s"
    return None


def _data(name: str, namespace: Any, spec: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {"cronjob": name}
    if isinstance(namespace, str):
        data["namespace"] = namespace
    pod = _dig(spec, "jobTemplate", "spec", "template", "spec")
    containers = pod.get("containers") if isinstance(pod, dict) else None
    if isinstance(containers, list):
        data["containers"] = [_container(c) for c in containers if isinstance(c, dict)]
    return data


def _container(container: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in _CONTAINER_KEYS:
        value = container.get(key)
        if isinstance(value, str):
            out[key] = value
        elif isinstance(value, list):
            out[key] = [str(part) for part in value]
    return out


def _dig(doc: Any, *keys: str) -> Any:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc
