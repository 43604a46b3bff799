"""Target derivation and the trust boundary of docs/security.md ("Threat model")."""

from __future__ import annotations

import pytest

from scheduler.errors import TargetRefusedError
from scheduler.messages.subjects import (
    check_target,
    delay_lane_prefix,
    dlq_subject,
    matches,
    target_from_rest,
)


def test_delay_lane_maps_to_target() -> None:
    """`mq.delay.<rest>` is delivered to `mq.<rest>` (as the intake maps it: the lane's prefix
    off, `mq.` on)."""
    lane = delay_lane_prefix("mq.delay.>")
    assert lane == "mq.delay."
    assert target_from_rest("mq.delay.inference.chat"[len(lane) :]) == "mq.inference.chat"


@pytest.mark.parametrize(
    ("target", "dlq"),
    [
        ("mq.inference.chat", "mq.dlq.inference.chat"),
        ("jobs.x", "mq.dlq.jobs.x"),
        ("mq.*", "mq.dlq._invalid"),
        ("mq.a\x00b", "mq.dlq._invalid"),
        ("mq..a", "mq.dlq._invalid"),
        (None, "mq.dlq._invalid"),
        ("mq." + "a" * 1022, "mq.dlq._invalid"),
    ],
)
def test_dead_letter_subject(target: str | None, dlq: str) -> None:
    """The DLQ subject drops the `mq.` prefix; other targets keep their whole name; a target
    that is not a literal subject (or none) gets `mq.dlq._invalid`, never a wildcard."""
    assert dlq_subject(target) == dlq


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("mq.>", "mq.a", True),
        ("mq.>", "mq", False),
        ("mq.*", "mq.a", True),
        ("mq.*", "mq.a.b", False),
        ("mq.a.b", "mq.a.b", True),
        ("mq.*.c", "mq.b.c", True),
    ],
)
def test_subject_matching(pattern: str, subject: str, expected: bool) -> None:
    """`*` matches one token and `>` one or more, as in NATS."""
    assert matches(pattern, subject) is expected


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("mq.delay.loop", "mq.delay."),
        ("mq.dlq.x", "mq.dlq."),
        ("$JS.API.STREAM.DELETE.X", "$JS."),
        ("$KV.bucket.key", "$KV."),
        ("$SYS.REQ.SERVER.PING", "$SYS."),
        ("_INBOX.abc", "_INBOX."),
        ("mq.*", "wildcards"),
        ("mq.a.>", "wildcards"),
        ("mq..a", "wildcards, empty tokens"),
        ("", "not a literal subject"),
        ("mq.", "not a literal subject"),
        ("mq.a\x00b", "control characters"),
        ("mq.a\x7f", "control characters"),
        ("mq." + "a" * 1022, "longer than 1024 bytes"),
        ("mq.org.\u0430cme.work", "non-ASCII"),
        ("mq.tasks.caf\u00e9", "non-ASCII"),
        ("mq.tasks\u2024work", "non-ASCII"),  # a one-dot leader that looks like a dot
        ("other.subject", "outside the allow-list"),
    ],
)
def test_refused_targets(target: str, why: str) -> None:
    """Loops, system subjects, wildcards and subjects outside the allow-list are refused."""
    allow = ["mq.>", "$JS.>", "$KV.>", "$SYS.>", "_INBOX.>"]
    with pytest.raises(TargetRefusedError, match=why.replace("$", r"\$").replace(".", r"\.")):
        check_target(target, allow)


def test_allowed_target_passes() -> None:
    """A literal subject inside the allow-list is accepted."""
    assert check_target("mq.inference.chat", ["mq.inference.>"]) == "mq.inference.chat"
