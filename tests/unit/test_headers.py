"""Producer headers: forwarding rules, sizes, and strict decoding of raw header blocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client

from scheduler.bus.nats.wire import message_of, parse_header_block
from scheduler.errors import EnvelopeError
from scheduler.messages.headers import block_size, forwarded, printable


def test_reserved_headers_are_dropped_in_any_case() -> None:
    """`Nats-*` and `Mq-*` headers never pass from a producer, whatever their case."""
    got = forwarded(
        {"mq-attempt": "9", "MQ-SCHEDULED-FOR": "x", "nAtS-Msg-Id": "y", "X-Trace": "t"}
    )
    assert got == {"X-Trace": "t"}


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("X-Cr", "a\rb", "header X-Cr: value must not contain CR, LF or NUL"),
        ("X-Lf", "a\nb", "header X-Lf: value must not contain CR, LF or NUL"),
        ("X-Nul", "a\x00b", "header X-Nul: value must not contain CR, LF or NUL"),
        ("X Space", "v", "header 'X Space': name must be printable ASCII"),
        ("X:Colon", "v", "header 'X:Colon': name must be printable ASCII"),
        ("X-É", "v", "header 'X-É': name must be printable ASCII"),
    ],
)
def test_header_rules_name_the_header(name: str, value: str, problem: str) -> None:
    """A header that could not be delivered intact is refused `invalid_header`, by name."""
    with pytest.raises(EnvelopeError) as err:
        forwarded({name: value, "X-Ok": "fine"})
    assert err.value.reason == "invalid_header"
    assert str(err.value).startswith(problem)


@given(st.dictionaries(st.from_regex(r"[!-9;-~]{1,20}", fullmatch=True), st.text(max_size=30)))
def test_block_size_is_the_size_of_the_block_on_the_wire(headers: dict[str, str]) -> None:
    """`block_size` counts exactly the bytes of the `NATS/1.0` block carrying the headers."""
    block = b"NATS/1.0\r\n" + b"".join(
        k.encode() + b": " + v.encode() + b"\r\n" for k, v in headers.items()
    )
    assert block_size(headers) == (len(block) + 2 if headers else 0)


@given(st.text(max_size=200), st.integers(1, 300))
def test_printable_is_safe_for_headers_and_postgres(text: str, limit: int) -> None:
    """`printable` leaves no CR, LF, NUL or lone surrogate and cuts on a character boundary."""
    out = printable(text, limit)
    assert not any(c in out for c in "\r\n\x00")
    assert len(out.encode()) <= limit  # encodes: no lone surrogate left


def test_a_valid_block_parses_as_nats_py_parses_it() -> None:
    """Strict parsing gives nats-py's result for a well-formed block."""
    block = b"NATS/1.0\r\nA: 1\r\nB:2\r\nC:  spaced  \r\nA: last\r\nD: \xc3\xa9\r\n\r\n"
    headers, defect = parse_header_block(block)
    assert defect is None
    assert headers == Client._parse_header_lines(block[len(b"NATS/1.0\r\n") :])


@pytest.mark.parametrize(
    ("block", "field"),
    [
        (b"NATS/1.0\r\nX: \xff\r\n\r\n", "header X"),
        (b"NATS/1.0\r\nX\xff: v\r\n\r\n", "header X\\xff"),
        (b"NATS/1.0\r\nno colon here\r\n\r\n", "headers"),
        (b"garbage\r\n\r\n", "headers"),
    ],
)
def test_a_block_that_does_not_decode_is_a_defect(block: bytes, field: str) -> None:
    """Non-UTF-8 names or values, lines without a colon and a missing `NATS/1.0` line are
    reported, not skipped or replaced."""
    _, defect = parse_header_block(block)
    assert defect is not None and defect[0] == field


@given(st.binary(max_size=60), st.binary(max_size=200))
def test_message_of_never_raises(subject: bytes, hdr: bytes) -> None:
    """Whatever bytes a delivery carries, decoding it gives a message (with a defect when
    something did not decode), never an exception in the client's read loop."""
    msg = message_of(Client(), b"mq.delay." + subject, b"$JS.ACK.x", b"{}", hdr or None)
    assert msg.subject.startswith("mq.delay.")
    try:
        subject.decode()
    except UnicodeDecodeError:
        assert msg.defect is not None and msg.defect[0] == "subject"
