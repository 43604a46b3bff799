"""Every envelope rule of docs/producers.md ("The envelope"), fed a bad value, checked by its
message."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler.errors import EnvelopeError
from scheduler.messages.envelope import (
    HEADER_RESERVE,
    Limits,
    check_org,
    check_size,
    decode_fast,
    decode_strict,
    parse_envelope,
)
from scheduler.messages.headers import block_size
from scheduler.messages.subjects import org_of

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def envelope(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": "task_01HQ3X7K8M2N4P5R6S7T8U9V0W",
        "type": "inference.chat.request",
        "source": "cloud-api",
        "timestamp": "2026-11-22T11:59:59.000Z",
        "priority": 5,
        "org_id": "org_hanzo",
        "team_id": "team_abc123",
        "delay_until": "2026-11-22T12:00:10Z",
        "ttl_seconds": 300,
        "data": {"k": 1},
    }
    for key, value in changes.items():
        if value is _DROP:
            doc.pop(key)
        else:
            doc[key] = value
    return doc


_DROP = object()


def raw(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def problems(doc: dict[str, Any] | bytes, limits: Limits | None = None) -> EnvelopeError:
    data = doc if isinstance(doc, bytes) else raw(doc)
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(data, NOW, limits)
    return info.value


def test_valid_envelope_keeps_the_producer_bytes_and_unknown_fields() -> None:
    """A valid envelope is accepted and its raw bytes, unknown fields included, are kept."""
    data = b'{"schema":"hanzo.mq.v1", "id":"a1","type":"t.x","source":"s",' + (
        b'"timestamp":"2026-11-22T11:00:00Z","data":{},"x-custom":[1,2]}'
    )
    env = parse_envelope(data, NOW)
    assert env.raw == data
    assert env.priority == 5
    assert env.delay_until is None
    assert env.due_at(NOW) == NOW


def test_delay_until_with_offset_is_normalised_to_utc() -> None:
    """`delay_until` with a +01:00 offset is the same instant in UTC."""
    env = parse_envelope(raw(envelope(delay_until="2026-11-22T13:00:05+01:00")), NOW)
    assert env.delay_until == datetime(2026, 11, 22, 12, 0, 5, tzinfo=UTC)
    assert env.due_at(NOW) == env.delay_until


def test_past_delay_until_is_due_now() -> None:
    """A task whose `delay_until` has passed is due at once."""
    env = parse_envelope(raw(envelope(delay_until="2026-11-22T11:00:00Z")), NOW)
    assert env.due_at(NOW) == NOW


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("schema", "hanzo.mq.v2", "schema: must be 'hanzo.mq.v1'"),
        ("schema", 1, "schema: must be a string"),
        ("id", "", "id: must be 1-200 printable ASCII characters"),
        ("id", "has space", "id: must be 1-200 printable ASCII characters"),
        ("id", "x" * 201, "id: must be 1-200 printable ASCII characters"),
        ("id", 42, "id: must be a string (got 42)"),
        ("type", "a..b", "type: must be a dot-delimited name"),
        ("type", None, "type: must be a string (got null)"),
        ("source", " ", "source: must not be empty"),
        ("timestamp", "yesterday", "timestamp: is not an ISO 8601 date-time"),
        ("timestamp", "2026-11-22T11:00:00", "timestamp: must carry a UTC offset or Z"),
        ("priority", 0, "priority: must be from 1 (highest) to 10 (lowest) (got 0)"),
        ("priority", 11, "priority: must be from 1 (highest) to 10 (lowest) (got 11)"),
        ("priority", "1", 'priority: must be an integer (got "1")'),
        ("priority", True, "priority: must be an integer (got true)"),
        ("priority", 2.5, "priority: must be an integer (got 2.5)"),
        ("org_id", 7, "org_id: must be a string (got 7)"),
        ("team_id", [], "team_id: must be a string (got [])"),
        ("delay_until", "2026-11-22T12:00:10", "delay_until: must carry a UTC offset or Z"),
        ("delay_until", 1764000000, "delay_until: must be an ISO 8601 date-time string"),
        ("delay_until", "soon", "delay_until: is not an ISO 8601 date-time"),
        ("ttl_seconds", 0, "ttl_seconds: must be from 1 to 3155760000 (100 years) (got 0)"),
        ("ttl_seconds", -5, "ttl_seconds: must be from 1 to 3155760000 (100 years) (got -5)"),
        ("ttl_seconds", "60", 'ttl_seconds: must be an integer (got "60")'),
        ("data", [1], "data: must be a JSON object (got [1])"),
        ("data", "x", 'data: must be a JSON object (got "x")'),
    ],
)
def test_each_bad_field_is_named_with_its_rule(field: str, value: Any, expected: str) -> None:
    """A bad value in one field gives one message naming that field, the rule and the value."""
    err = problems(envelope(**{field: value}))
    assert str(err).startswith(expected), str(err)
    assert err.field == field
    assert err.reason == "invalid_envelope"
    assert len(err.problems) == 1


@pytest.mark.parametrize("field", ["schema", "id", "type", "source", "timestamp", "data"])
def test_required_fields_are_required(field: str) -> None:
    """Dropping a required field names it."""
    err = problems(envelope(**{field: _DROP}))
    assert err.problems == [(field, "is required")]


@pytest.mark.parametrize("field", ["priority", "org_id", "team_id", "delay_until", "ttl_seconds"])
def test_optional_fields_may_be_absent(field: str) -> None:
    """Optional fields may be left out."""
    assert parse_envelope(raw(envelope(**{field: _DROP})), NOW).id


def test_all_broken_fields_are_reported_at_once() -> None:
    """Several broken fields give several messages, in one error."""
    err = problems(envelope(priority=99, ttl_seconds=0, data=None))
    assert [f for f, _ in err.problems] == ["priority", "ttl_seconds", "data"]


def test_unparseable_payloads() -> None:
    """Non-JSON, non-UTF-8 and non-object payloads are `unparseable`."""
    assert problems(b"{not json").reason == "unparseable"
    assert "is not JSON" in str(problems(b"{not json"))
    assert "is not UTF-8" in str(problems(b"\xff\xfe"))
    assert "must be a JSON object, got list" in str(problems(b"[1, 2]"))


def test_oversize_payload_is_refused_before_parsing() -> None:
    """A payload above max_payload minus the header reserve is `too_large`."""
    limits = Limits(max_payload=HEADER_RESERVE + 200)
    doc = envelope(data={"blob": "x" * 300})
    err = problems(doc, limits)
    assert err.reason == "too_large"
    assert f"exceeds the limit of {limits.max_envelope_bytes} bytes" in str(err)


def test_expired_task_is_refused() -> None:
    """A task past `timestamp + ttl_seconds` is `expired`."""
    err = problems(envelope(timestamp="2026-11-22T11:00:00Z", ttl_seconds=60))
    assert err.reason == "expired"
    assert err.field == "ttl_seconds"


def test_delay_beyond_max_delay_is_refused() -> None:
    """`delay_until` more than max_delay ahead is `too_far`; exactly at the limit is fine."""
    limits = Limits(max_delay=timedelta(days=400))
    at_limit = (NOW + timedelta(days=400)).isoformat()
    assert parse_envelope(raw(envelope(delay_until=at_limit, ttl_seconds=_DROP)), NOW, limits)
    beyond = (NOW + timedelta(days=400, seconds=1)).isoformat()
    err = problems(envelope(delay_until=beyond, ttl_seconds=_DROP), limits)
    assert err.reason == "too_far"
    assert "more than 400 days ahead" in str(err)


def test_expiry_is_timestamp_plus_ttl() -> None:
    """`expires_at` is `timestamp + ttl_seconds`."""
    env = parse_envelope(raw(envelope()), NOW)
    assert env.expires_at == datetime(2026, 11, 22, 12, 4, 59, tzinfo=UTC)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("ttl_seconds", 300_000_000_000, "ttl_seconds: must be from 1 to 3155760000"),
        ("ttl_seconds", 10**40, "ttl_seconds: must be from 1 to 3155760000"),
        ("delay_until", "0001-01-01T00:00:00+01:00", "delay_until: is out of range"),
        ("delay_until", "9999-12-31T23:59:59-01:00", "delay_until: is out of range"),
        ("delay_until", "1969-12-31T23:59:59Z", "delay_until: is out of range"),
        ("timestamp", "0001-01-01T00:00:00+01:00", "timestamp: is out of range"),
        ("timestamp", "9000-01-01T00:00:00Z", "timestamp: is out of range"),
        ("id", "task\n", "id: must be 1-200 printable ASCII characters"),
        ("id", "\ntask", "id: must be 1-200 printable ASCII characters"),
        ("type", "a.b\n", "type: must be a dot-delimited name"),
    ],
)
def test_values_out_of_range_are_named_never_overflow(
    field: str, value: Any, expected: str
) -> None:
    """Times, TTLs and ids beyond what the daemon computes with fail with the field named."""
    err = problems(envelope(**{field: value}))
    assert str(err).startswith(expected), str(err)
    assert err.reason == "invalid_envelope"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"data": {"n": ' + b"9" * 5000 + b"}}", "payload: is not JSON: number out of range"),
        (b'{"data": ' + b"[" * 5000 + b"]" * 5000 + b"}", "payload: is not JSON: recursion"),
        (b'{"id": "\\ud800"}', "payload: is not JSON: unexpected end of hex escape"),
        (b'{"id": "\\udc00"}', "payload: is not JSON: lone leading surrogate"),
    ],
)
def test_json_beyond_what_parsers_take_is_unparseable(payload: bytes, expected: str) -> None:
    """Numbers too long, nesting too deep and lone surrogates are `unparseable`, not a crash."""
    err = problems(payload)
    assert err.reason == "unparseable"
    assert str(err).startswith(expected), str(err)


@pytest.mark.parametrize(
    ("value", "path"),
    [("NaN", "data.n"), ("-Infinity", "data.n"), ('[1, {"x": Infinity}]', "data.n[1].x")],
)
def test_nan_and_infinity_are_refused_with_their_path(value: str, path: str) -> None:
    """NaN and Infinity are not JSON: refused naming where they are."""
    text = json.dumps(envelope(data={"n": 0})).replace('"n": 0', f'"n": {value}')
    err = problems(text.encode())
    assert err.field == "data" and path in str(err)


def test_nan_inside_a_string_and_a_nul_escape_are_fine() -> None:
    """The words NaN and Infinity inside strings, and a NUL escape, are valid JSON."""
    env = parse_envelope(raw(envelope(data={"s": "NaN Infinity \u0000"})), NOW)
    assert env.id


def test_delivery_size_counts_subject_and_headers() -> None:
    """A delivery whose subject + headers + payload pass the limit is `too_large`."""
    limits = Limits(max_payload=HEADER_RESERVE + 1000)
    check_size(10, 490, 500, limits)  # exactly at the limit
    with pytest.raises(EnvelopeError) as err:
        check_size(10, 491, 500, limits)
    assert err.value.reason == "too_large"
    assert "subject 10 + headers 491 + payload 500" in str(err.value)


def test_the_header_reserve_holds_the_daemons_largest_delivery_headers() -> None:
    """The daemon's own delivery headers at their largest (a 200-byte id, a 10-digit attempt)
    fit in the room intake keeps for them, with the frame's control line."""
    headers = {
        "Nats-Msg-Id": "x" * 200,
        "Mq-Scheduled-For": "2026-11-22T12:00:10.000Z",
        "Mq-Fired-At": "2026-11-22T12:00:10.000Z",
        "Mq-Attempt": "9" * 10,
    }
    assert block_size(headers) + 200 < HEADER_RESERVE


@pytest.mark.parametrize(
    ("target", "org"),
    [
        ("mq.org.acme.billing.run", "acme"),
        ("mq.org.acme", "acme"),
        ("mq.inference.chat", None),
        ("mq.org", None),
        ("mq.orgs.acme.x", None),
        ("other.org.acme.x", None),
    ],
)
def test_org_of_reads_the_token_after_mq_org(target: str, org: str | None) -> None:
    """Only targets under `mq.org.<org>` name an organisation, and it is the third token."""
    assert org_of(target) == org


def test_an_org_id_that_disagrees_with_the_subject_is_refused_as_org_mismatch() -> None:
    """`org_id` must be the organisation the target names; the error quotes both."""
    env = parse_envelope(raw(envelope(org_id="globex")), NOW)
    with pytest.raises(EnvelopeError) as info:
        check_org(env, "mq.org.acme.work")
    assert info.value.reason == "org_mismatch" and info.value.field == "org_id"
    assert str(info.value) == (
        "org_id: \"globex\" disagrees with organisation 'acme' named by mq.org.acme.work"
    )


def test_a_missing_org_id_on_an_org_subject_is_refused_and_elsewhere_is_free() -> None:
    """An org subject needs `org_id`; a subject that names no org accepts any or none."""
    env = parse_envelope(raw(envelope(org_id=_DROP)), NOW)
    with pytest.raises(EnvelopeError, match=r"org_id: is required: the subject names"):
        check_org(env, "mq.org.acme.work")
    check_org(env, "mq.inference.chat")
    check_org(parse_envelope(raw(envelope(org_id="globex")), NOW), "mq.inference.chat")
    check_org(parse_envelope(raw(envelope(org_id="acme")), NOW), "mq.org.acme.work")


def test_a_delay_until_decades_past_is_due_now() -> None:
    """A `delay_until` at the start of the accepted range (1970) is simply due at once."""
    env = parse_envelope(raw(envelope(delay_until="1970-01-01T00:00:00Z")), NOW)
    assert env.due_at(NOW) == NOW


def test_a_plain_envelope_takes_the_fast_path_with_the_strict_values() -> None:
    """A producer's ordinary envelope is read by the fast decoder, to the same values as the
    strict one (offsets normalised to UTC, fractions kept to the microsecond)."""
    for doc in (
        envelope(),
        envelope(delay_until="2026-11-22T13:00:05.123456+01:00", ttl_seconds=_DROP),
        envelope(priority=_DROP, org_id=None, team_id=_DROP, delay_until=None, x=[1, {"y": 2}]),
        envelope(data={"s": "caf\u00e9 \u2603 NaN", "n": 1e300, "m": -0.5, "z": None}),
    ):
        data = json.dumps(doc, ensure_ascii=False).encode()
        fast = decode_fast(data)
        assert fast is not None, doc
        assert fast == decode_strict(data)
        assert fast.timestamp.tzinfo is UTC


# Input where msgspec alone would be laxer than pydantic, or reads differently: the fast
# decoder must step aside (None) or agree, and parse_envelope keep the strict verdict.
_TRICKY = [
    b'{"x": "\xff", ' + raw(envelope())[1:],  # not UTF-8 in an unknown field
    b'{"x": ' + b"9" * 4301 + b", " + raw(envelope())[1:],  # pydantic: number out of range
    b'{"x": -' + b"9" * 4400 + b".5, " + raw(envelope())[1:],
    b'{"x": ' + b"[" * 201 + b"]" * 201 + b", " + raw(envelope())[1:],  # recursion limit
    b'{"x": ' + b"[" * 150 + b"]" * 150 + b", " + raw(envelope())[1:],  # within it
    b'{"x": NaN, ' + raw(envelope())[1:],
    b'{"x": "\\ud800", ' + raw(envelope())[1:],
    b'{"data": [], ' + raw(envelope())[1:],  # a repeated key: the last one counts
    raw(envelope())[:-1] + b', "data": []}',
    raw(envelope())[:-1] + b', "priority": 11}',
    raw(envelope())[:-1] + b', "\\u0069d": "has space"}',  # an escaped key is the same key
    raw(envelope())[:-1] + b', "schema_": "x"}',
    raw(envelope()) + b"  \n\t\r",  # whitespace after the document is fine
    raw(envelope()) + b"\x0c",
]
_INSTANTS = [
    "2026-11-22T11:59:59.1234567Z",
    "2026-11-22t11:59:59z",
    "2026-11-22 11:59:59Z",
    "2026-11-22T11:59:59+01:60",
    "2026-11-22T11:59:59+01",
    "2026-11-22T11:59:59+0100",
    "2026-11-22T11:59:59,5Z",
    "2026-11-22T11:59Z",
    "2026-11-22T11:59:59.Z",
    "2026-11-22T11:59:60Z",
    "2026-11-22T24:00:00Z",
    "2026-02-29T00:00:00Z",
    "2026-11-22T11:59:59+23:59",
    "2026-11-22T11:59:59-00:00",
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "1969-12-31T23:59:59.999999Z",
    "1970-01-01T00:00:00Z",
    "8999-12-31T23:59:59.999999Z",
    "9000-01-01T00:00:00Z",
    "2026-11-22T11:59:59.000001+14:00",
]


def _verdict(data: bytes) -> object:
    """What the strict decoder makes of `data`: the envelope or the error's problems."""
    try:
        return decode_strict(data)
    except EnvelopeError as exc:
        return (exc.reason, exc.problems)


@pytest.mark.parametrize(
    "data",
    _TRICKY
    + [raw(envelope(timestamp=t, ttl_seconds=_DROP)) for t in _INSTANTS]
    + [raw(envelope(delay_until=t)) for t in _INSTANTS],
)
def test_the_fast_decoder_accepts_only_what_the_strict_one_accepts(data: bytes) -> None:
    """Where the two JSON readers differ (UTF-8 in skipped values, long numbers, nesting,
    repeated or escaped keys, instant formats), the fast decoder steps aside or agrees."""
    fast = decode_fast(data)
    strict = _verdict(data)
    assert fast is None or fast == strict, (fast, strict)
    try:
        got: object = parse_envelope(data, NOW, Limits(max_delay=timedelta(days=10**6)))
    except EnvelopeError as exc:
        got = (exc.reason, exc.problems)
    if isinstance(strict, tuple):
        assert got == strict


_COMPACT = json.dumps(envelope(), separators=(",", ":")).encode()
_SPACED = json.dumps(envelope(), indent=2).encode()


@pytest.mark.parametrize(
    "raw",
    [
        _COMPACT[:-1] + b',"org_id":"evil"}',
        _SPACED[:-2] + b',\n  "org_id" : "evil"\n}',
        _COMPACT.replace(b'"org_id"', b'"\\u006frg_id"')[:-1] + b',"org_id":"evil"}',
        _COMPACT.replace(b'"org_id":"org_hanzo",', b"")[:-1] + b',"org_id":"a","org_id":"a"}',
    ],
    ids=["compact", "spaced", "escaped", "equal-values"],
)
def test_a_key_named_twice_at_the_top_level_is_refused_by_both_decoders(raw: bytes) -> None:
    """`org_id` twice (however written) is `duplicate_key` naming it: the fast decoder
    declines and the strict one refuses, so no check reads another value than a worker."""
    assert decode_fast(raw) is None
    with pytest.raises(EnvelopeError) as err:
        parse_envelope(raw, NOW)
    assert err.value.reason == "duplicate_key"
    assert err.value.problems[0][0] == "org_id"


@pytest.mark.parametrize("raw", [_COMPACT, _SPACED, b" " + _COMPACT + b"\n"])
def test_unique_keys_keep_the_fast_path_and_nested_duplicates_pass_as_sent(raw: bytes) -> None:
    """Compact or spaced, an envelope naming each key once takes the fast path; a key named
    twice inside `data` (the daemon reads nothing there) is delivered byte for byte."""
    assert decode_fast(raw) is not None
    nested = raw.replace(b'"k"', b'"k": 0, "k"')
    assert parse_envelope(nested, NOW).raw == nested
