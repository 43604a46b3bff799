"""Fuzzing the parsers that read untrusted input: envelopes, subjects, durations, cron, YAML.

Each property feeds generated input and allows only the project's typed errors: no other
exception, and (hypothesis' `deadline`) no example slower than a second. The example counts
keep the whole file under 30 s on the 2-core test host, so it runs in the normal test command.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cron.expression import CronExpr, CronSyntaxError
from scheduler.cron.jobs import ScheduleError, load_text
from scheduler.durations import MAX_DURATION, parse_duration
from scheduler.errors import DurationError, EnvelopeError, TargetRefusedError
from scheduler.messages.envelope import (
    EARLIEST,
    LATEST,
    Envelope,
    Limits,
    check_org,
    decode_fast,
    decode_strict,
    parse_envelope,
)
from scheduler.messages.subjects import (
    MAX_SUBJECT_BYTES,
    REFUSED_PREFIXES,
    check_target,
    dlq_subject,
    is_literal,
    matches,
    org_of,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LIMITS = Limits(max_payload=64 * 1024)
FUZZ = settings(
    max_examples=300,
    deadline=timedelta(seconds=1),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)

# -- strategies ------------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
instants = st.one_of(
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat()),  # naive
    st.sampled_from(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00+14:00", "soon", "", "Z"]),
    st.text(max_size=30),
    st.integers(),
)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "schema": st.one_of(st.just("hanzo.mq.v1"), json_values),
    "id": st.one_of(st.text(max_size=210), st.uuids().map(str), json_values),
    "type": st.one_of(st.just("a.b"), st.text(max_size=20), json_values),
    "source": st.one_of(st.just("tests"), json_values),
    "timestamp": instants,
    "priority": st.one_of(st.integers(min_value=-5, max_value=15), json_values),
    "org_id": st.one_of(st.none(), st.sampled_from(["acme", "globex"]), json_values),
    "team_id": json_values,
    "delay_until": instants,
    "ttl_seconds": st.one_of(st.integers(), json_values),
    "data": json_values,
}


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """A valid envelope with a few fields replaced, dropped or added."""
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": "t_1",
        "type": "test.work",
        "source": "tests",
        "timestamp": "2026-11-22T11:59:00Z",
        "data": {},
    }
    for name in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=4, unique=True)):
        if draw(st.booleans()):
            doc[name] = draw(FIELD_VALUES[name])
        else:
            doc.pop(name, None)
    doc.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
    text = json.dumps(doc)
    if draw(st.integers(0, 5)) == 0:  # a cut or a stray byte: JSON that does not parse
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.text(max_size=3))
    return text.encode("utf-8", "surrogatepass")


# Instants in the formats producers write and near them: offsets, fractions, separators, cuts.
def _written(at: datetime, offset: int, spec: str, z: str, sep: str, cut: int) -> str:
    local = at.replace(tzinfo=UTC).astimezone(timezone(timedelta(minutes=offset)))
    text = local.isoformat(sep=sep, timespec=spec).replace("+00:00", z)
    return text[: len(text) - cut]


written_instants = st.builds(
    _written,
    st.datetimes(min_value=datetime(1960, 1, 1), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-1439, max_value=1439) | st.just(0),
    st.sampled_from(["seconds", "milliseconds", "microseconds", "minutes", "auto"]),
    st.sampled_from(["Z", "Z", "z", "+00:00", "-00:00"]),
    st.sampled_from(["T", "T", "t", " "]),
    st.sampled_from([0, 0, 0, 0, 1, 2, 3]),
)
MUTATIONS = st.sampled_from(
    [b"\\", b'"', b"\\u", b"\\ud800", b"\xff", b"\xc3\xa9", b"[", b"{", b"]", b"}", b",",
     b":", b"NaN", b"-", b".", b"e", b"9" * 50, b" ", b"\x00", b"\t", b'"data":[]', b'"id":1,']
)  # fmt: skip


@st.composite
def near_valid(draw: st.DrawFn) -> bytes:
    """A valid envelope (instants in many written forms, unknown fields, odd spacing), then
    maybe a few bytes spliced in: mostly plain input, the fast decoder's home ground."""
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": draw(st.from_regex(r"[\x21-\x7e]{1,12}", fullmatch=True)),
        "type": "test.work",
        "source": draw(st.sampled_from(["tests", " x", "\u00e9"])),
        "timestamp": draw(written_instants),
        "data": draw(st.dictionaries(st.text(max_size=4), json_values, max_size=3)),
    }
    for name in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=3, unique=True)):
        doc[name] = draw(st.one_of(written_instants, FIELD_VALUES[name]))
    doc.update(draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
    text = json.dumps(
        doc, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1]))
    )
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(MUTATIONS) + data[at:]
    return data


subjects = st.one_of(
    st.text(max_size=60),
    st.lists(
        st.one_of(
            st.sampled_from(["mq", "delay", "org", "acme", "dlq", "*", ">", "", "$JS", "_INBOX"]),
            st.text(min_size=0, max_size=6),
        ),
        max_size=8,
    ).map(".".join),
    st.just("mq." + "a" * MAX_SUBJECT_BYTES),
)


@st.composite
def yaml_documents(draw: st.DrawFn) -> str:
    """A schedules file: generated jobs dumped as YAML, then maybe cut or spliced with YAML
    syntax (tags, anchors, aliases, merges, flow brackets)."""
    jobs = draw(
        st.lists(
            st.dictionaries(
                st.sampled_from(
                    ["name", "subject", "cron", "data", "jitter", "priority", "timezone", "x"]
                ),
                st.one_of(
                    json_values,
                    st.sampled_from(["a", "mq.scheduled.a", "@daily", "*/5 * * * *", "1e20"]),
                ),
                max_size=6,
            ),
            max_size=3,
        )
    )
    text = yaml.safe_dump({"scheduled_jobs": jobs}, allow_unicode=True)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        splice = draw(
            st.one_of(
                st.sampled_from(
                    [
                        "&a ",
                        "*a",
                        "<<: *a\n",
                        "!!python/object:os.system ",
                        "!!binary ",
                        "[",
                        "{",
                        "]",
                        "}",
                        ": ",
                        "\n- ",
                        "!!set ",
                        "!!timestamp ",
                        "? ",
                        "%YAML 1.1\n",
                        "---\n",
                    ]
                ),
                st.text(max_size=8),
            )
        )
        text = text[:at] + splice + text[at:]
    return text


# -- properties ------------------------------------------------------------------------------------


@FUZZ
@given(raw=st.one_of(st.binary(max_size=400), envelopes()), target=subjects)
def test_the_envelope_parser_raises_only_envelope_error(raw: bytes, target: str) -> None:
    """Any bytes: a valid envelope whose instants lie in range, or EnvelopeError naming a
    field; the org check on any target likewise."""
    try:
        env = parse_envelope(raw, NOW, LIMITS)
    except EnvelopeError as exc:
        assert exc.problems and exc.reason and str(exc)
        return
    assert EARLIEST <= env.timestamp < LATEST and env.raw == raw
    assert env.delay_until is None or env.delay_until.tzinfo is not None
    try:
        check_org(env, target)
    except EnvelopeError as exc:
        assert exc.reason == "org_mismatch" and exc.field == "org_id"


def _strict_or_error(raw: bytes) -> Envelope | EnvelopeError:
    try:
        return decode_strict(raw)
    except EnvelopeError as exc:
        return exc


@settings(FUZZ, max_examples=1500)
@given(raw=st.one_of(near_valid(), envelopes(), st.binary(max_size=200)))
def test_the_fast_decoder_agrees_with_the_strict_one(raw: bytes) -> None:
    """Any bytes: the fast decoder (msgspec) returns an envelope only where the strict one
    (pydantic) accepts, with the same values; elsewhere it steps aside, and the strict
    decoder's verdict, error messages included, is what parse_envelope gives."""
    fast = decode_fast(raw)
    strict = _strict_or_error(raw)
    if fast is not None:
        assert isinstance(strict, Envelope), (raw, strict)
        assert fast == strict and fast.timestamp.tzinfo is UTC
        assert fast.delay_until is None or fast.delay_until.tzinfo is UTC
    limits = Limits(max_payload=64 * 1024, max_delay=timedelta(days=10**6))
    try:
        got: Envelope | tuple[str, list[tuple[str, str]]] = parse_envelope(raw, NOW, limits)
    except EnvelopeError as exc:
        got = (exc.reason, exc.problems)
    if isinstance(strict, EnvelopeError) and len(raw) <= limits.max_envelope_bytes:
        assert got == (strict.reason, strict.problems)


@FUZZ
@given(subject=subjects, allow=st.lists(subjects, min_size=1, max_size=3))
def test_subject_checks_raise_only_target_refused_error(subject: str, allow: list[str]) -> None:
    """check_target passes only ASCII literal subjects within the allow-list, the length
    limit and outside the refused prefixes; everything else is TargetRefusedError."""
    try:
        assert check_target(subject, allow) == subject
    except TargetRefusedError as exc:
        assert exc.subject == subject
    else:
        assert subject.isascii() and is_literal(subject)
        assert len(subject.encode()) <= MAX_SUBJECT_BYTES
        assert not subject.startswith(REFUSED_PREFIXES)
        assert any(matches(pattern, subject) for pattern in allow)
    assert is_literal(dlq_subject(subject)) or not subject
    org = org_of(subject)
    assert org is None or subject.startswith(f"mq.org.{org}")


@FUZZ
@given(
    value=st.one_of(
        st.text(max_size=40),
        st.from_regex(r"\A(\d{1,30}(\.\d{1,5})?(ms|s|m|h|d|w)){1,4}\Z"),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.floats(),
        st.booleans(),
    )
)
def test_the_duration_parser_raises_only_duration_error(value: Any) -> None:
    """Any text or number: a duration from 0 to 100 years, or DurationError."""
    try:
        got = parse_duration(value)
    except DurationError as exc:
        assert isinstance(exc, ValueError) and len(str(exc)) < 200
    else:
        assert timedelta(0) <= got <= MAX_DURATION


@FUZZ
@given(
    text=st.one_of(st.text(max_size=60), st.lists(st.text(max_size=8), max_size=7).map(" ".join))
)
def test_the_cron_parser_raises_only_cron_syntax_error(text: str) -> None:
    """Any text: a cron expression or CronSyntaxError."""
    try:
        CronExpr.parse(text)
    except CronSyntaxError as exc:
        assert str(exc)


@settings(FUZZ, max_examples=200)
@given(text=st.one_of(yaml_documents(), st.text(max_size=200)))
def test_the_yaml_loader_never_raises(text: str) -> None:
    """Any text: valid jobs and file:line errors, never an exception."""
    found = load_text(text, "s.yaml")
    assert all(isinstance(e, ScheduleError) and e.message for e in found.errors)
    assert all(job.name and job.subject for job in found.jobs)
