"""Subject rules: deriving a task's target from the delay lane, and the trust boundary.

A task published to `mq.delay.<rest>` is delivered to `mq.<rest>`; NATS permissions on the delay
lane therefore bound what a producer can make the daemon publish. The target is also checked
against the daemon's own allow-list and a fixed list of refused prefixes (docs/security.md,
"Threat model").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from scheduler.errors import TargetRefusedError

REFUSED_PREFIXES = ("mq.delay.", "mq.dlq.", "$JS.", "$KV.", "$SYS.", "_INBOX.")
_TOKEN = re.compile(r"[^\s.*>\x00-\x1f\x7f]+")
# Tenancy (docs/security.md, "Subject scheme"): `mq.org.<org>.<rest>` is organisation <org>'s
# slice; its delay lane is `mq.delay.org.<org>.<rest>`. Other targets name no organisation.
ORG_TOKEN = "org"
_ORG_PREFIX = f"mq.{ORG_TOKEN}."
INVALID = "_invalid"  # the DLQ subject's tail for a task without a usable target
# A subject goes into a frame's control line with a reply inbox and two sizes, and the server
# closes a connection whose control line passes its max_control_line (4 KiB by default).
MAX_SUBJECT_BYTES = 1024


def delay_lane_prefix(intake_subject: str) -> str:
    """`mq.delay.>` -> `mq.delay.`: the prefix every delay-lane subject starts with."""
    if not intake_subject.endswith(".>"):
        raise ValueError(f"intake subject {intake_subject!r} must end in '.>'")
    return intake_subject[:-1]


def target_from_rest(rest: str) -> str:
    """The `<rest>` of a delay-lane or API subject (`mq.delay.<rest>`,
    `scheduler.v1.cancel.<rest>`) -> the target `mq.<rest>`."""
    return "mq." + rest


def delay_subject(target: str, lane_prefix: str = "mq.delay.") -> str:
    """`mq.inference.chat` -> `mq.delay.inference.chat`: where a task for `target` is sent."""
    return lane_prefix + target[len("mq.") :]


def org_of(target: str) -> str | None:
    """The organisation a target names (`mq.org.acme.billing.run` -> `acme`), or None."""
    if not target.startswith(_ORG_PREFIX):  # the intake's hot path: most targets stop here
        return None
    org = target[len(_ORG_PREFIX) :].split(".", 1)[0]
    return org or None


def dlq_subject(target: str | None, prefix: str = "mq.dlq") -> str:
    """`mq.inference.chat` -> `mq.dlq.inference.chat`; a target outside `mq.` keeps its name.
    No target, or one that is not a literal subject (wildcards, control characters, empty
    tokens), gives `mq.dlq._invalid`: a copy is never published to such a subject."""
    if target is None or not is_literal(target) or len(target.encode()) > MAX_SUBJECT_BYTES:
        return f"{prefix}.{INVALID}"
    rest = target[3:] if target.startswith("mq.") else target
    return f"{prefix}.{rest}"


def is_literal(subject: str) -> bool:
    """True when `subject` is a valid literal subject: non-empty tokens, no wildcards."""
    return bool(subject) and all(_TOKEN.fullmatch(tok) for tok in subject.split("."))


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` matches one token, a final `>` one or more."""
    ptoks, stoks = pattern.split("."), subject.split(".")
    for i, ptok in enumerate(ptoks):
        if ptok == ">":
            return len(stoks) > i
        if i >= len(stoks) or (ptok != "*" and ptok != stoks[i]):
            return False
    return len(ptoks) == len(stoks)


def check_target(subject: str, allow: Sequence[str]) -> str:
    """Return `subject` if the daemon may publish a task there, else raise TargetRefusedError."""
    refusal = _refusal(subject, tuple(allow))
    if refusal is not None:
        raise TargetRefusedError(subject, refusal)
    return subject


@functools.lru_cache(maxsize=4096)
def _refusal(subject: str, allow: tuple[str, ...]) -> str | None:
    """Why `subject` is refused, or None (cached: a deployment has few distinct targets)."""
    if len(subject.encode()) > MAX_SUBJECT_BYTES:
        return f"is longer than {MAX_SUBJECT_BYTES} bytes"
    if not is_literal(subject):
        return "is not a literal subject (wildcards, empty tokens or control characters)"
    if not subject.isascii():  # a Cyrillic letter can pass for a Latin one
        return "holds non-ASCII characters (subjects are dotted ASCII names)"
    for prefix in REFUSED_PREFIXES:
        if subject.startswith(prefix):
            return f"targets under {prefix} are always refused"
    if not any(matches(pattern, subject) for pattern in allow):
        return f"is outside the allow-list ({', '.join(allow)})"
    return None
