"""What an importer read from a foreign schedule, and how it becomes `scheduled_jobs` YAML.

Each reader (`import_crontab`, `import_cronjob`, `import_celery`) turns its source into `Entry`
values: a job's keys without `name` and `subject`, or the reason the entry was skipped, plus
what could not be mapped (`lost`) and what differs but is kept (`notes`). `assemble` then names
the jobs (kebab-case, unique), fills the subject template and validates every job with the YAML
loader's own model, so what `render` writes is what `scheduler validate` accepts. Pure.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from scheduler.cron.jobs import TOP_KEY, JobSpec

MAX_INPUT_CHARS = 1024 * 1024  # a source is read whole, as a schedules file is
MAX_NAME = 100  # JobSpec's bound on `name`
TEMPLATE_FIELDS = ("name",)
MAX_INTERVAL = 400 * 86400.0  # seconds; longer intervals have no cron form anyway
_NOT_KEBAB = re.compile(r"[^a-z0-9]+")
_LW = re.compile(r"\d*[LW]|LW", re.IGNORECASE)  # last day, nearest weekday (Quartz, cronie)


class UnreadableInput(ValueError):
    """A source that cannot be read at all (not YAML, not Python, too large); names the place."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One schedule entry of a source. `job` holds the job's keys other than name and subject
    (`cron` at least) unless `skipped` says why the entry cannot become a job."""

    line: int
    name_hint: str
    job: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    lost: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Parsed:
    """A whole source: its entries in order, and notes that concern the file, not an entry."""

    source: str
    entries: tuple[Entry, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Imported:
    """A job written to the output: its definition and where it came from."""

    source: str
    line: int
    definition: dict[str, Any]
    lost: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Skipped:
    source: str
    line: int
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """Everything an import produced: the jobs, the skipped entries, the file notes."""

    jobs: tuple[Imported, ...]
    skipped: tuple[Skipped, ...]
    notes: tuple[tuple[str, str], ...]  # (source, note)

    @property
    def complete(self) -> bool:
        """True when every entry became a job with nothing left out."""
        return not self.skipped and not any(job.lost for job in self.jobs)


def check_template(template: str) -> str:
    """The subject template, or ValueError naming what is wrong: `{name}` is its only
    placeholder, with no conversion or format spec."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"subject template {template!r}: {exc}") from None
    known = ", ".join(f"{{{f}}}" for f in TEMPLATE_FIELDS)
    for _, field_name, spec, conversion in parts:
        if field_name is None:
            continue
        if field_name not in TEMPLATE_FIELDS:
            problem = f"unknown placeholder {{{field_name}}} (known: {known})"
        elif spec or conversion:
            problem = f"{{{field_name}}} takes no conversion or format spec"
        else:
            continue
        raise ValueError(f"subject template {template!r}: {problem}")
    return template


def foreign_term(field_text: str) -> str | None:
    """The first term of a cron field in syntax that jobs here do not take (`L`, `15W`, `LW`,
    `5#2`, `?`), or None. Names (`jul`, `wed`) are not mistaken for it."""
    for term in re.split(r"[,/-]", field_text):
        if "#" in term or "?" in term or _LW.fullmatch(term):
            return term
    return None


def kebab(text: str) -> str:
    """`text` as a kebab-case name (may be empty): lowercase letters and digits joined by '-'."""
    return _NOT_KEBAB.sub("-", text.lower()).strip("-")[:MAX_NAME].rstrip("-")


def interval_cron(seconds: float) -> str | None:
    """A cron expression firing every `seconds` on the clock's multiples, or None when no
    cron expression fires at that interval (it does not divide a minute, hour or day)."""
    if not 0 < seconds <= MAX_INTERVAL or seconds != int(seconds):  # inf and NaN too
        return None
    s = int(seconds)
    if s < 60 and 60 % s == 0:
        return "* * * * * *" if s == 1 else f"*/{s} * * * * *"
    minutes, hours = s // 60, s // 3600
    if s % 60 == 0 and minutes < 60 and 60 % minutes == 0:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if s % 3600 == 0 and hours < 24 and 24 % hours == 0:
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    return {86400: "0 0 * * *", 604800: "0 0 * * 0"}.get(s)


def human_seconds(seconds: float) -> str:
    """`90` -> `1m30s`: a duration as the YAML writes them."""
    if not 0 < seconds <= MAX_INTERVAL or seconds != int(seconds):
        return f"{seconds}s"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)


def assemble(parsed: Iterable[Parsed], subject: str, timezone: str = "UTC") -> Outcome:
    """Name, address and validate every entry of every source; names are unique across all.
    `timezone` is the zone of entries whose source names none."""
    template = check_template(subject)
    taken: set[str] = set()
    jobs: list[Imported] = []
    skipped: list[Skipped] = []
    notes: list[tuple[str, str]] = []
    for source in parsed:
        notes += [(source.source, note) for note in source.notes]
        for entry in source.entries:
            name = _unique(kebab(entry.name_hint) or f"job-line-{entry.line}", taken)
            if entry.skipped is not None:
                skipped.append(Skipped(source.source, entry.line, name, entry.skipped))
                continue
            definition = _definition(entry, name, template.format(name=name), timezone)
            problem = _invalid(definition)
            if problem is not None:
                skipped.append(Skipped(source.source, entry.line, name, problem))
                continue
            taken.add(name)
            jobs.append(Imported(source.source, entry.line, definition, entry.lost, entry.notes))
    return Outcome(tuple(jobs), tuple(skipped), tuple(notes))


def _unique(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    for number in range(2, len(taken) + 3):
        suffix = f"-{number}"
        candidate = base[: MAX_NAME - len(suffix)].rstrip("-") + suffix
        if candidate not in taken:
            return candidate
    raise AssertionError("unreachable: fewer names are taken than tried")


def _definition(entry: Entry, name: str, subject: str, timezone: str) -> dict[str, Any]:
    """The job's keys in the order a person reads them: what, where, when, then the rest."""
    job = dict(entry.job)
    head = {"name": name, "subject": subject, "cron": job.pop("cron")}
    head["timezone"] = job.pop("timezone", None) or timezone
    head["data"] = job.pop("data", {})
    description = job.pop("description", "")
    return {**head, **job, "description": description}


def _invalid(definition: dict[str, Any]) -> str | None:
    try:
        JobSpec.model_validate(definition)
    except ValidationError as exc:
        return "; ".join(_message(err["loc"], err["msg"]) for err in exc.errors())
    return None


def _message(loc: tuple[int | str, ...], msg: str) -> str:
    key = ".".join(str(part) for part in loc)
    text = msg.removeprefix("Value error, ")
    return f"{key}: {text}" if key else text


def render(outcome: Outcome) -> str:
    """The jobs as one `scheduled_jobs` YAML document, each under a comment saying where it
    came from and what differs."""
    sources = sorted({job.source for job in outcome.jobs} | {s.source for s in outcome.skipped})
    lines = [
        f"# Imported by `scheduler schedules import` from {', '.join(sources) or 'nothing'}.",
        "# Review every subject and data before use: see docs/migrating.md.",
    ]
    if not outcome.jobs:
        return "\n".join([*lines, f"{TOP_KEY}: []", ""])
    lines.append(f"{TOP_KEY}:")
    for job in outcome.jobs:
        lines.append(f"  # {_one_line(job.source)}:{job.line}")
        lines += [f"  # not mapped: {_one_line(text)}" for text in job.lost]
        lines += [f"  # note: {_one_line(text)}" for text in job.notes]
        dumped = yaml.safe_dump([job.definition], sort_keys=False, allow_unicode=True, width=100)
        lines += [f"  {line}" for line in dumped.splitlines()]
    return "\n".join(lines) + "\n"


def report(outcome: Outcome) -> list[str]:
    """One line per file note, skipped entry, unmapped part and note, as `source:line: name:`."""
    out = [f"{source}: note: {note}" for source, note in outcome.notes]
    found: list[tuple[str, int, str]] = []
    for s in outcome.skipped:
        found.append((s.source, s.line, f"{s.source}:{s.line}: {s.name}: skipped: {s.reason}"))
    for job in outcome.jobs:
        where = f"{job.source}:{job.line}: {job.definition['name']}"
        found += [(job.source, job.line, f"{where}: not mapped: {text}") for text in job.lost]
        found += [(job.source, job.line, f"{where}: note: {text}") for text in job.notes]
    found.sort(key=lambda item: (item[0], item[1]))
    return out + [_one_line(text) for _, _, text in found]


def _one_line(text: str) -> str:
    return " ".join(text.split())
