"""The `scheduled_jobs` YAML files: the job model, a lint-friendly loader, per-occurrence jitter.

YAML is the source of truth for cron jobs (docs/cron.md). The loader reads every `*.yaml` /
`*.yml` file of a folder, validates each job strictly (pydantic at the edge) and collects every
problem with its `file:line` instead of stopping at the first, so `scheduler validate` can list
them all. Valid jobs become frozen `Job` values with a parsed `CronExpr` and a `ZoneInfo`.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from hashlib import blake2b
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails

from scheduler.clock import rfc3339
from scheduler.cron.expression import CronExpr
from scheduler.durations import parse_duration
from scheduler.messages.subjects import MAX_SUBJECT_BYTES, REFUSED_PREFIXES

TOP_KEY = "scheduled_jobs"
# Bounds on what a schedules file may make the loader do (docs/security.md, "What the daemon
# refuses"): a file is read whole, and aliases let a few lines stand for billions of values.
MAX_FILE_BYTES = 1024 * 1024
MAX_YAML_VALUES = 100_000  # values after expanding aliases
MAX_YAML_DEPTH = 64
MAX_CRON_CHARS = 1024
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_SUBJECT = re.compile(r"^[a-z0-9_-]+(?:\.[a-z0-9_-]+)*$")

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class Misfire(StrEnum):
    """What to do with occurrences missed while no leader was firing."""

    SKIP = "skip"
    FIRE_ONCE = "fire_once"
    FIRE_ALL = "fire_all"


class Concurrency(StrEnum):
    """Whether a new occurrence may fire while the previous one is still unacked."""

    ALLOW = "allow"
    FORBID = "forbid"


class JobSpec(BaseModel):
    """One entry of `scheduled_jobs`, exactly as written; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=100)
    subject: str
    cron: str
    data: dict[str, Any] = Field(default_factory=dict)
    type: str | None = None
    timezone: str = "UTC"
    priority: StrictInt = Field(default=5, ge=1, le=10)
    jitter: Duration = timedelta(0)
    misfire: Misfire = Misfire.FIRE_ONCE
    catchup_window: Duration = timedelta(hours=1)
    concurrency: Concurrency = Concurrency.ALLOW
    ttl_seconds: StrictInt | None = Field(default=None, gt=0)
    paused: StrictBool = False
    description: str = ""

    @field_validator("name")
    @classmethod
    def _kebab_case(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not kebab-case (lowercase letters, digits, '-')")
        return value

    @field_validator("subject")
    @classmethod
    def _literal_subject(cls, value: str) -> str:
        if "*" in value or ">" in value:
            raise ValueError(f"{value!r} contains a wildcard; a job fires to one literal subject")
        for prefix in REFUSED_PREFIXES:
            if value.startswith(prefix):
                raise ValueError(f"{value!r} is under {prefix}, which jobs may never target")
        if not _SUBJECT.match(value):
            raise ValueError(f"{value!r} is not a lowercase dotted subject (e.g. mq.scheduled.x)")
        if len(value) > MAX_SUBJECT_BYTES:
            raise ValueError(f"is {len(value)} characters long; at most {MAX_SUBJECT_BYTES}")
        return value

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        if len(value) > MAX_CRON_CHARS:
            raise ValueError(f"is {len(value)} characters long; at most {MAX_CRON_CHARS}")
        CronExpr.parse(value)
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        _zone(value)
        return value

    @field_validator("type")
    @classmethod
    def _type_token(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(ch.isspace() for ch in value)):
            raise ValueError(f"{value!r} must be a non-empty string without spaces")
        return value

    @field_validator("data")
    @classmethod
    def _json_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            copy: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
            return copy
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must be plain JSON ({exc}); quote dates and times") from exc

    def to_job(self, file: str = "", line: int = 0) -> Job:
        """The validated, parsed job value."""
        parsed = {"cron": CronExpr.parse(self.cron), "timezone": _zone(self.timezone)}
        fields = {**dict(self), **parsed, "type": self.type or f"scheduled.{self.name}"}
        return Job(**fields, file=file, line=line)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(
            f"unknown time zone {name!r} (use an IANA name like Europe/Berlin)"
        ) from exc


@dataclass(frozen=True, slots=True)
class Job:
    """A valid cron job; `file` and `line` say where it was defined. Treat `data` as read-only."""

    name: str
    subject: str
    cron: CronExpr
    data: dict[str, Any] = field(hash=False)
    type: str
    timezone: ZoneInfo
    priority: int
    jitter: timedelta
    misfire: Misfire
    catchup_window: timedelta
    concurrency: Concurrency
    ttl_seconds: int | None
    paused: bool
    description: str
    file: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)

    def definition(self) -> dict[str, Any]:
        """The job as plain JSON values: what is stored when syncing, and what is fingerprinted."""
        return {
            "name": self.name,
            "subject": self.subject,
            "cron": self.cron.text,
            "data": self.data,
            "type": self.type,
            "timezone": self.timezone.key,
            "priority": self.priority,
            "jitter_seconds": self.jitter.total_seconds(),
            "misfire": self.misfire.value,
            "catchup_window_seconds": self.catchup_window.total_seconds(),
            "concurrency": self.concurrency.value,
            "ttl_seconds": self.ttl_seconds,
            "paused": self.paused,
            "description": self.description,
        }

    def fingerprint(self) -> str:
        """A content hash of the definition: equal iff nothing but `file`/`line` differs."""
        return _hash(self.definition())


def job_from_definition(definition: dict[str, Any], file: str = "", line: int = 0) -> Job:
    """The job a stored `Job.definition()` describes (what the management API reads back)."""
    spec = dict(definition)
    spec["jitter"] = spec.pop("jitter_seconds", 0)
    spec["catchup_window"] = spec.pop("catchup_window_seconds", 3600)
    return JobSpec.model_validate(spec).to_job(file, line)


@dataclass(frozen=True, slots=True)
class ScheduleError:
    """One problem found while loading schedules; `line` and `job` are None when unknown."""

    file: str
    line: int | None
    job: str | None
    message: str

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def __str__(self) -> str:
        job = f"{self.job}: " if self.job else ""
        return f"{self.location}: {job}{self.message}"


@dataclass(frozen=True, slots=True)
class ScheduleSet:
    """The valid jobs (sorted by name) and every error, from one load."""

    jobs: tuple[Job, ...]
    errors: tuple[ScheduleError, ...]
    files: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def get(self, name: str) -> Job | None:
        return next((job for job in self.jobs if job.name == name), None)

    def fingerprint(self) -> str:
        """A content hash over all valid jobs, independent of file names and order."""
        return _hash([job.definition() for job in self.jobs])


def _hash(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return blake2b(text.encode(), digest_size=16).hexdigest()


# --- Reading YAML with line numbers ---------------------------------------------------------------


class _LineLoader(yaml.SafeLoader):
    """A SafeLoader that remembers where each mapping, key and list item was written."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.key_lines: dict[int, tuple[Any, dict[Any, int]]] = {}
        self.item_lines: dict[int, tuple[Any, list[int]]] = {}
        self.duplicates: list[tuple[int, object]] = []
        self.building: yaml.Node | None = None  # the node being constructed, for error lines

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        self.building = node
        return super().construct_object(node, deep)

    def construct_line_map(self, node: yaml.MappingNode) -> Iterable[dict[Any, Any]]:
        data: dict[Any, Any] = {}
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                try:
                    if key in lines:
                        self.duplicates.append((key_node.start_mark.line + 1, key))
                    lines.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: construct_mapping reports it below
                    continue
        self.key_lines[id(data)] = (data, lines)  # keeps `data` alive so the id stays unique
        yield data
        data.update(self.construct_mapping(node))

    def construct_line_seq(self, node: yaml.SequenceNode) -> Iterable[list[Any]]:
        items: list[Any] = []
        self.item_lines[id(items)] = (items, [item.start_mark.line + 1 for item in node.value])
        yield items
        items.extend(self.construct_sequence(node))

    def lines_of(self, mapping: object) -> dict[Any, int]:
        return self.key_lines.get(id(mapping), (None, {}))[1]


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_line_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _LineLoader.construct_line_seq)


@dataclass(slots=True)
class _FileResult:
    jobs: list[Job] = field(default_factory=list)
    errors: list[ScheduleError] = field(default_factory=list)


def _read_yaml(text: str, filename: str, out: _FileResult) -> tuple[Any, _LineLoader] | None:
    if len(text) > MAX_FILE_BYTES:
        problem = f"the file is {len(text)} characters long; at most {MAX_FILE_BYTES}"
        out.errors.append(ScheduleError(filename, None, None, problem))
        return None
    try:
        loader = _LineLoader(text)  # raises on control characters in the text
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        problem = f"YAML syntax error: character #x{exc.character:04x} is not allowed"
        out.errors.append(ScheduleError(filename, line, None, problem))
        return None
    try:
        node = loader.get_single_node()
        if node is not None and (refused := too_big(node)) is not None:
            out.errors.append(ScheduleError(filename, node.start_mark.line + 1, None, refused))
            return None
        return (loader.construct_document(node) if node is not None else None), loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        out.errors.append(ScheduleError(filename, where, None, f"YAML syntax error: {problem}"))
        return None
    except RecursionError:
        problem = f"YAML nesting is deeper than the loader can read (at most {MAX_YAML_DEPTH})"
        out.errors.append(ScheduleError(filename, None, None, problem))
        return None
    # A scalar the safe constructors cannot build (`!!timestamp x` fails with AttributeError)
    except (ValueError, OverflowError, TypeError, AttributeError) as exc:
        node = loader.building
        where = node.start_mark.line + 1 if node is not None else None
        problem = str(exc)
        if isinstance(exc, TypeError | AttributeError) and node is not None:
            shown = str(node.value)[:40] if isinstance(node, yaml.ScalarNode) else "this node"
            problem = f"a {node.tag.rsplit(':', 1)[-1]} cannot be built from {shown!r}"
        out.errors.append(ScheduleError(filename, where, None, f"YAML value error: {problem}"))
        return None
    finally:
        loader.dispose()


def too_big(root: yaml.Node) -> str | None:
    """Why a composed document is refused before it is built, or None: more than
    MAX_YAML_VALUES values once aliases are expanded, or nested deeper than MAX_YAML_DEPTH.
    Each distinct node is visited once, so an alias bomb costs its size in lines, not values."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if depth > MAX_YAML_DEPTH:
            return f"YAML nesting is deeper than {MAX_YAML_DEPTH} levels"
        children = _children(node)
        if children_done or not children:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_YAML_VALUES:
                return (
                    f"the document expands to more than {MAX_YAML_VALUES} values "
                    "(aliases repeated into a bomb?)"
                )
            continue
        if id(node) in sizes:
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)
    return None


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _job_list(doc: Any, loader: _LineLoader, filename: str, out: _FileResult) -> list[Any]:
    def error(line: int | None, message: str) -> list[Any]:
        out.errors.append(ScheduleError(filename, line, None, message))
        return []

    if not isinstance(doc, dict):
        found = "an empty file" if doc is None else f"a {type(doc).__name__}"
        return error(1, f"expected a mapping with top-level key {TOP_KEY!r}, found {found}")
    lines = loader.lines_of(doc)
    for key in doc:
        if key != TOP_KEY:
            error(lines.get(key), f"unknown top-level key {key!r} (expected only {TOP_KEY!r})")
    if TOP_KEY not in doc:
        return error(1, f"missing top-level key {TOP_KEY!r}")
    jobs = doc[TOP_KEY]
    if not isinstance(jobs, list):
        return error(lines.get(TOP_KEY), f"{TOP_KEY!r} must be a list of jobs (use [] for none)")
    return jobs


def _job_from(item: Any, line: int, loader: _LineLoader, filename: str, out: _FileResult) -> None:
    if not isinstance(item, dict):
        message = f"a job must be a mapping of keys, found {type(item).__name__}"
        out.errors.append(ScheduleError(filename, line, None, message))
        return
    name = item.get("name") if isinstance(item.get("name"), str) else None
    try:
        spec = JobSpec.model_validate(item)
    except ValidationError as exc:
        lines = loader.lines_of(item)
        for err in exc.errors():
            key = err["loc"][0] if err["loc"] else None
            message = _message(err)
            out.errors.append(ScheduleError(filename, lines.get(key, line), name, message))
        return
    out.jobs.append(spec.to_job(filename, line))


def _message(err: ErrorDetails) -> str:
    key = ".".join(str(part) for part in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown key {key!r} (known: {', '.join(JobSpec.model_fields)})"
    if err["type"] == "missing":
        return f"missing required key {key!r}"
    text = err["msg"].removeprefix("Value error, ")
    return f"{key}: {text}" if key else text


def _load_one(text: str, filename: str) -> _FileResult:
    out = _FileResult()
    parsed = _read_yaml(text, filename, out)
    if parsed is None:
        return out
    doc, loader = parsed
    for line, key in loader.duplicates:
        out.errors.append(ScheduleError(filename, line, None, f"duplicate key {key!r}"))
    items = _job_list(doc, loader, filename, out)
    item_lines = loader.item_lines.get(id(items), (None, []))[1]
    for index, item in enumerate(items):
        line = item_lines[index] if index < len(item_lines) else 1
        _job_from(item, line, loader, filename, out)
    return out


def _merge(results: list[_FileResult], files: list[str]) -> ScheduleSet:
    """Join per-file results; every definition of a duplicated name is an error and is dropped."""
    errors = [err for result in results for err in result.errors]
    by_name: dict[str, list[Job]] = defaultdict(list)
    for job in (job for result in results for job in result.jobs):
        by_name[job.name].append(job)
    jobs: list[Job] = []
    for name, found in sorted(by_name.items()):
        if len(found) == 1:
            jobs.append(found[0])
            continue
        for job in found:
            others = ", ".join(f"{o.file}:{o.line}" for o in found if o is not job)
            message = f"duplicate job name {name!r}: also defined at {others}"
            errors.append(ScheduleError(job.file, job.line, name, message))
    errors.sort(key=lambda e: (e.file, e.line or 0))
    return ScheduleSet(jobs=tuple(jobs), errors=tuple(errors), files=tuple(files))


def load_text(text: str, filename: str = "<string>") -> ScheduleSet:
    """Load one YAML document given as text (for tests and tools)."""
    return _merge([_load_one(text, filename)], [filename])


def schedule_files(path: str | Path) -> list[Path]:
    """The `*.yaml` / `*.yml` files directly in `path`, sorted; hidden files are skipped."""
    folder = Path(path)
    if not folder.is_dir():
        raise NotADirectoryError(f"schedules directory {str(folder)!r} does not exist")
    found = (p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    return sorted(p for p in found if not p.name.startswith("."))


def load_dir(path: str | Path) -> ScheduleSet:
    """Load every schedule file in `path`; raise NotADirectoryError if it is not a folder."""
    results, names = [], []
    for file in schedule_files(path):
        names.append(str(file))
        try:
            if (size := file.stat().st_size) > MAX_FILE_BYTES:  # never read a huge file whole
                problem = f"the file is {size} bytes long; at most {MAX_FILE_BYTES}"
                results.append(_FileResult(errors=[ScheduleError(str(file), None, None, problem)]))
                continue
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            results.append(_FileResult(errors=[ScheduleError(str(file), None, None, str(exc))]))
            continue
        results.append(_load_one(text, str(file)))
    return _merge(results, names)


# --- Occurrence identity and jitter ---------------------------------------------------------------


def occurrence_key(job_name: str, scheduled_for: datetime) -> str:
    """`<job name>@<scheduled-for, RFC 3339 UTC>`: the occurrence's `Nats-Msg-Id`."""
    return f"{job_name}@{rfc3339(scheduled_for)}"


def jitter_for(job_name: str, scheduled_for: datetime, jitter: timedelta) -> timedelta:
    """A delay in [0, jitter), fixed per occurrence so every leader picks the same one."""
    span = jitter // timedelta(microseconds=1)
    if span <= 0:
        return timedelta(0)
    digest = blake2b(occurrence_key(job_name, scheduled_for).encode(), digest_size=8).digest()
    return timedelta(microseconds=int.from_bytes(digest, "big") % span)
