"""Dead-letter copies never exceed max_payload: whole when they fit, else cut."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from scheduler.engine.delayed.dead_letters import DeadLetter, copy_of, fits

SUBJECT = "mq.dlq.tasks.work"


def letter(payload: bytes, headers: dict[str, str] | None = None) -> DeadLetter:
    marks = {"Nats-Msg-Id": "dlq:t_1", "Mq-Target": "mq.tasks.work", "Mq-Attempt": "5"}
    return DeadLetter("mq.tasks.work", payload, headers, "publish_failed", "no stream", marks)


def test_a_copy_that_fits_is_whole() -> None:
    """A copy within max_payload carries the bytes, the producer's headers and the reason."""
    doc = json.dumps({"id": "t_1", "data": {"x": 1}}).encode()
    payload, headers = copy_of(letter(doc, {"X-Trace": "t", "mq-attempt": "9"}), SUBJECT, 10_000)
    assert payload == doc
    assert headers["X-Trace"] == "t" and "mq-attempt" not in headers
    assert headers["Mq-Error-Reason"] == "publish_failed" and headers["Mq-Error"] == "no stream"


def test_a_copy_too_large_loses_data_then_everything_but_its_headers() -> None:
    """Too large: the envelope without `data`; still too large: no payload; reason kept."""
    doc = {"id": "t_1", "type": "x", "data": {"blob": "y" * 5000}}
    payload, headers = copy_of(letter(json.dumps(doc).encode()), SUBJECT, 2000)
    assert json.loads(payload) == {"id": "t_1", "type": "x"}
    assert headers["Mq-Error-Reason"] == "publish_failed" and "Mq-Truncated" in headers
    doc["type"] = "z" * 5000
    payload, headers = copy_of(letter(json.dumps(doc).encode()), SUBJECT, 2000)
    assert payload == b"" and headers["Mq-Error-Reason"] == "publish_failed"


@given(
    st.binary(max_size=3000),
    st.dictionaries(st.text(max_size=20), st.text(max_size=300), max_size=5),
    st.integers(1200, 4000),
)
def test_a_copy_never_exceeds_max_payload(
    payload: bytes, headers: dict[str, str], max_payload: int
) -> None:
    """Whatever the bytes and headers, a copy fits max_payload (daemon headers ~1 KiB)."""
    body, out = copy_of(letter(payload, headers), SUBJECT, max_payload)
    assert fits(SUBJECT, out, body, max_payload)
    assert all("\r" not in v and "\n" not in v and "\x00" not in v for v in out.values())
