"""The `hanzo.mq.v1` task envelope: strict validation at the edge, raw bytes kept for delivery.

The daemon delivers the producer's bytes, never a re-serialisation, so unknown top-level fields
pass through untouched. Every broken rule yields one message naming the field, the value and the
rule; all of them are reported at once.

Two decoders, one verdict. `decode_fast` (msgspec, half the cost) returns an envelope only when
the bytes are plainly valid, and None whenever anything needs a closer look; `decode_strict`
(pydantic) then decides and words every error. The fast one accepts a subset of what the strict
one accepts, with the same values: tests/unit/test_envelope.py and test_fuzz.py compare the
two on generated input, valid and invalid.

Duplicate keys. JSON parsers disagree on which of two equal keys wins (ours keep the last, many
workers' the first), so an envelope whose top level names a key twice is refused
(`duplicate_key`, naming the key) by both decoders: the daemon's checks (org rule, id, times)
and the worker must read the same fields. Inside `data` and unknown fields the daemon reads
nothing and delivers the bytes as sent. The fast decoder proves a document free of duplicates
from byte counts alone (`_unique_keys`, no Python object per value); the strict one names the
key (`duplicate_key`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scheduler.errors import EnvelopeError
from scheduler.messages.subjects import org_of

SCHEMA = "hanzo.mq.v1"
HEADER_RESERVE = 4096
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# Every instant a producer gives must lie in this range, and a TTL be at most MAX_TTL_SECONDS:
# far beyond any real use, yet `timestamp + ttl_seconds` and every later step of arithmetic
# stay inside what `datetime` and PostgreSQL can hold (no OverflowError anywhere).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
MAX_TTL_SECONDS = 100 * 365 * 86400 + 25 * 86400  # 100 years
_ID = re.compile(r"[\x21-\x7e]{1,200}")  # always fullmatch: `$` would let a final "\n" in
_TYPE = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_REQUIRED = ("schema", "id", "type", "source", "timestamp", "data")


class EnvelopeModel(BaseModel):
    """The envelope's known fields, validated strictly; unknown fields are allowed."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    schema_: str = Field(alias="schema")
    id: str
    type: str
    source: str
    timestamp: datetime
    priority: int = 5
    org_id: str | None = None
    team_id: str | None = None
    delay_until: datetime | None = None
    ttl_seconds: int | None = None
    data: dict[str, Any]

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: str) -> str:
        if v != SCHEMA:
            raise ValueError(f"must be {SCHEMA!r}")
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not _ID.fullmatch(v):
            raise ValueError(ID_RULE)
        return v

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        if not _TYPE.fullmatch(v):
            raise ValueError("must be a dot-delimited name like inference.chat.request")
        return v

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("timestamp", "delay_until")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        return None if v is None else bounded_instant(v)

    @field_validator("priority")
    @classmethod
    def _priority(cls, v: int) -> int:
        if not 1 <= v <= 10:
            raise ValueError("must be from 1 (highest) to 10 (lowest)")
        return v

    @field_validator("ttl_seconds")
    @classmethod
    def _ttl(cls, v: int | None) -> int | None:
        if v is not None and not 0 < v <= MAX_TTL_SECONDS:
            raise ValueError(f"must be from 1 to {MAX_TTL_SECONDS} (100 years)")
        return v


ID_RULE = "must be 1-200 printable ASCII characters without spaces"


def valid_id(value: object) -> bool:
    """Whether `value` is a task id by the envelope's rule (`_ID`): every verb and API path
    that takes an id checks it with this, so no id is stored or looked up that no envelope
    could carry (no newlines, at most 200 characters)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def bounded_instant(v: datetime) -> datetime:
    """`v` in UTC, if it carries an offset and lies between EARLIEST and LATEST; else a
    ValueError saying which rule it breaks (never an OverflowError)."""
    if v.tzinfo is None:
        raise ValueError("must carry a UTC offset or Z (naive times are rejected)")
    try:
        utc = v.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc < LATEST:
        raise ValueError(
            f"is out of range: must lie between {EARLIEST:%Y-%m-%dT%H:%M:%SZ} "
            f"and {LATEST:%Y-%m-%dT%H:%M:%SZ}"
        )
    return utc


@dataclass(slots=True)  # not frozen: built per task, and frozen init costs 5x
class Envelope:
    """A valid envelope: the fields the daemon acts on, plus the producer's exact bytes."""

    id: str
    type: str
    source: str
    timestamp: datetime
    priority: int
    delay_until: datetime | None
    ttl_seconds: int | None
    org_id: str | None
    team_id: str | None
    raw: bytes

    @property
    def expires_at(self) -> datetime | None:
        if self.ttl_seconds is None:
            return None
        return self.timestamp + timedelta(seconds=self.ttl_seconds)

    def due_at(self, now: datetime) -> datetime:
        """When to deliver: `delay_until`, or now when it is absent or past."""
        if self.delay_until is None or self.delay_until < now:
            return now
        return self.delay_until


@dataclass(frozen=True, slots=True)
class Limits:
    """Limits that depend on the deployment: payload size and how far ahead a task may be due."""

    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_delay: timedelta = timedelta(days=400)

    @property
    def max_envelope_bytes(self) -> int:
        return self.max_payload - HEADER_RESERVE


def check_size(subject: int, headers: int, payload: int, limits: Limits) -> None:
    """Refuse (`too_large`) a task whose delivery, counted as subject + headers + payload
    bytes, passes max_payload minus the room kept for the daemon's own headers."""
    total = subject + headers + payload
    if total > limits.max_envelope_bytes:
        problem = (
            f"the delivery would be {total} bytes (subject {subject} + headers {headers} + "
            f"payload {payload}), over the limit of {limits.max_envelope_bytes} bytes "
            f"(max_payload {limits.max_payload} minus {HEADER_RESERVE} for the daemon's headers)"
        )
        raise EnvelopeError([("message", problem)], "too_large")


def check_org(env: Envelope, target: str) -> None:
    """Refuse (`org_mismatch`) a task whose target names an organisation (`mq.org.<org>.>`)
    unless its `org_id` is exactly that organisation: NATS permissions give each organisation's
    producers their slice of the delay lane, and the envelope may not claim another's."""
    org = org_of(target)
    if org is None or env.org_id == org:
        return
    if env.org_id is None:
        problem = f"is required: the subject names organisation {org!r} ({target})"
    else:
        problem = f"{_show(env.org_id)} disagrees with organisation {org!r} named by {target}"
    raise EnvelopeError([("org_id", problem)], "org_mismatch")


def parse_envelope(raw: bytes, now: datetime, limits: Limits | None = None) -> Envelope:
    """Validate `raw` as a `hanzo.mq.v1` envelope at time `now`; raise EnvelopeError if broken."""
    limits = limits or Limits()
    if len(raw) > limits.max_envelope_bytes:
        problem = f"{len(raw)} bytes exceeds the limit of {limits.max_envelope_bytes} bytes"
        raise EnvelopeError([("payload", problem)], "too_large")
    env = decode_fast(raw) or decode_strict(raw)
    _check_time(env, now, limits)
    return env


class _Plain(msgspec.Struct):
    """The known fields as `decode_fast` reads them: instants as text (parsed by `_instant`),
    `data` left undecoded (only its first byte is looked at), unknown fields skipped."""

    schema: str
    id: str
    type: str
    source: str
    timestamp: str
    data: msgspec.Raw
    priority: int = 5
    org_id: str | None = None
    team_id: str | None = None
    delay_until: str | None = None
    ttl_seconds: int | None = None


_PLAIN = msgspec.json.Decoder(_Plain)
_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])  # the top level's keys, values undecoded
# What the strict parser reads the same way whenever msgspec accepts it: RFC 3339 with `T`,
# 0-6 fraction digits and `Z` or an offset of at most 23:59 (fromisoformat would also take
# `+01:60` and `+01`, pydantic would not)
_INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
# Where msgspec, skipping a value, is laxer than pydantic's JSON reader: nesting (pydantic
# refuses past 201 levels; a document has at least as many brackets as levels) and integers
# (pydantic refuses more than 4,300 digits)
_MAX_BRACKETS = 200
_DIGIT_RUN = 1000
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % _DIGIT_RUN)


def decode_fast(raw: bytes) -> Envelope | None:
    """The envelope in `raw` when it is plainly valid (no time checks), else None: then
    `decode_strict` decides. Never raises."""
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError:  # msgspec does not check the UTF-8 of skipped values
            return None
    if raw.count(b"{") + raw.count(b"[") > _MAX_BRACKETS:
        return None
    if len(raw) >= _DIGIT_RUN and _LONG_NUMBER.search(raw) is not None:
        return None
    try:
        doc = _PLAIN.decode(raw)
        if not _unique_keys(raw):
            return None
    except msgspec.DecodeError:  # NaN, wrong types, broken JSON: the strict path words it
        return None
    ttl = doc.ttl_seconds
    if (
        doc.schema != SCHEMA
        or _ID.fullmatch(doc.id) is None
        or _TYPE.fullmatch(doc.type) is None
        or not doc.source.strip()
        or not 1 <= doc.priority <= 10
        or (ttl is not None and not 0 < ttl <= MAX_TTL_SECONDS)
        or memoryview(doc.data)[0] != 0x7B  # `{`: an object
    ):
        return None
    timestamp = _instant(doc.timestamp)
    delay_until = None if doc.delay_until is None else _instant(doc.delay_until)
    if timestamp is None or (delay_until is None and doc.delay_until is not None):
        return None
    # positional, in field order: a third cheaper than by keyword
    return Envelope(
        doc.id, doc.type, doc.source, timestamp, doc.priority, delay_until, ttl, doc.org_id,
        doc.team_id, raw
    )  # fmt: skip


_WHITESPACE = b" \t\n\r"  # JSON's whitespace


def _unique_keys(raw: bytes) -> bool:
    """True only if `raw`'s top level surely names no key twice, from byte counts alone.

    Written compactly (`{"k":v,...}`), its distinct keys and values (the values as the
    source's own bytes) take `written` bytes; the source is longer by its whitespace between
    top-level tokens, any escape in a key (a character written takes at least one byte) and
    any pair a later one of the same key replaced (at least 4 bytes besides whitespace). The
    whitespace is counted too: all of it, minus what lies inside the kept values and keys.
    So `raw` is exactly as long as `written` plus that whitespace only without a second
    occurrence and without escapes in keys; anything else is False, and the strict decoder
    decides (and names the key)."""
    top = _TOP.decode(raw)
    slack = len(raw) - (1 + 4 * len(top) + sum(map(len, top)) + sum(map(len, top.values())))
    if slack == 0:
        return True
    values = b"".join(top.values())
    spaces = len(raw) - len(raw.translate(None, _WHITESPACE))
    inside = len(values) - len(values.translate(None, _WHITESPACE))
    return slack == spaces - inside - "\x00".join(top).count(" ")


def duplicate_key(raw: bytes | str) -> str | None:
    """The first key named twice at the top level of the JSON object `raw`, else None (also
    for text that is not a JSON object: the parse's own checks report that)."""
    try:
        pairs = json.loads(raw, object_pairs_hook=list)
    except (ValueError, RecursionError):
        return None
    if not isinstance(pairs, list) or not pairs or not isinstance(pairs[0], tuple):
        return None  # a JSON array (or an empty object) decodes to a list too: no keys
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return str(key)
        seen.add(key)
    return None


def refuse_duplicate_key(raw: bytes | str) -> None:
    """EnvelopeError (`duplicate_key`) naming the key `raw` names twice at its top level."""
    key = duplicate_key(raw)
    if key is not None:
        problem = (
            "appears more than once at the top level: JSON keys must be unique (parsers "
            "disagree which one counts)"
        )
        raise EnvelopeError([(key, problem)], "duplicate_key")


def _instant(text: str) -> datetime | None:
    """`text` as a bounded UTC instant when `_INSTANT` matches it and it is in range, else None."""
    if _INSTANT.fullmatch(text) is None:
        return None
    try:
        at = datetime.fromisoformat(text)
        if at.tzinfo is not UTC:  # an offset (`Z` gives UTC itself)
            at = at.astimezone(UTC)
    except (ValueError, OverflowError):  # a day or hour that does not exist; year 1 or 9999
        return None
    return at if EARLIEST <= at < LATEST else None


def decode_strict(raw: bytes) -> Envelope:
    """The envelope in `raw` (no time checks), or EnvelopeError naming every broken rule."""
    refuse_duplicate_key(raw)
    try:
        model = EnvelopeModel.model_validate_json(raw)
    except ValidationError as exc:
        raise EnvelopeError(_problems(raw, exc)) from None
    if b"NaN" in raw or b"Infinity" in raw:  # rare: only then look for them among the values
        _refuse_non_finite(model)
    return Envelope(
        id=model.id,
        type=model.type,
        source=model.source,
        timestamp=model.timestamp,
        priority=model.priority,
        delay_until=model.delay_until,
        ttl_seconds=model.ttl_seconds,
        org_id=model.org_id,
        team_id=model.team_id,
        raw=raw,
    )


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise EnvelopeError([("payload", f"is not UTF-8 ({exc.reason})")], "unparseable") from None
    except json.JSONDecodeError as exc:
        problem = f"is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise EnvelopeError([("payload", problem)], "unparseable") from None
    except (ValueError, RecursionError) as exc:  # numbers too long, nesting too deep
        problem = f"is not JSON we can read: {exc}"
        raise EnvelopeError([("payload", problem)], "unparseable") from None
    if not isinstance(doc, dict):
        kind = type(doc).__name__
        raise EnvelopeError([("payload", f"must be a JSON object, got {kind}")], "unparseable")
    return doc


def _problems(raw: bytes, exc: ValidationError) -> list[tuple[str, str]]:
    for err in exc.errors():
        if err["type"] == "json_invalid":  # numbers out of range, nesting too deep, bad escapes
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                problem = f"is not UTF-8 ({bad.reason} at byte {bad.start})"
                raise EnvelopeError([("payload", problem)], "unparseable") from None
            text = str(err["msg"]).removeprefix("Invalid JSON: ")
            raise EnvelopeError([("payload", f"is not JSON: {text}")], "unparseable")
    doc = _decode(raw)
    problems = [(f, "is required") for f in _REQUIRED if f not in doc]
    seen = {f for f, _ in problems}
    return problems + [p for p in _translate(exc, doc) if p[0] not in seen]


_TYPE_WORDS = {
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "dict_type": "must be a JSON object",
    "datetime_type": "must be an ISO 8601 date-time string",
    "datetime_parsing": "is not an ISO 8601 date-time",
    "datetime_from_date_parsing": "is not an ISO 8601 date-time",
}


def _translate(exc: ValidationError, doc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else "payload"
        field = "schema" if field == "schema_" else field
        if err["type"] == "missing":
            continue  # reported above with the other required fields
        rule = _TYPE_WORDS.get(err["type"]) or str(err["msg"]).removeprefix("Value error, ")
        out.append((field, f"{rule} (got {_show(doc.get(field))})"))
    return out


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_non_finite(model: EnvelopeModel) -> None:
    """NaN and Infinity are not JSON numbers: workers' parsers and PostgreSQL refuse them."""
    fields = {"data": model.data, **(model.model_extra or {})}
    for name, value in fields.items():
        path = _non_finite(value, name)
        if path is not None:
            field = path.split(".", 1)[0].split("[", 1)[0]
            problem = f"holds NaN or Infinity (at {path}), which JSON does not allow"
            raise EnvelopeError([(field, problem)])


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinite number inside `value`, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        items: Any = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub, item in items:
        found = _non_finite(item, sub)
        if found is not None:
            return found
    return None


def _check_time(env: Envelope, now: datetime, limits: Limits) -> None:
    if env.expires_at is not None and env.expires_at <= now:
        problem = f"task expired at {env.expires_at.isoformat()} (timestamp + ttl_seconds)"
        raise EnvelopeError([("ttl_seconds", problem)], "expired")
    if env.delay_until is not None and env.delay_until - now > limits.max_delay:
        days = limits.max_delay.total_seconds() / 86400
        problem = f"{env.delay_until.isoformat()} is more than {days:g} days ahead"
        raise EnvelopeError([("delay_until", problem)], "too_far")
