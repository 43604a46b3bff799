"""Producer headers: which are delivered with a task, the rules they follow, their size on the wire.

A header block is `NATS/1.0\\r\\n`, one `Name: Value\\r\\n` line per header, and `\\r\\n`. Names
are printable ASCII without spaces or `:` (what the protocol and nats-py accept); values are
text without CR, LF or NUL (a line break would cut the frame, a NUL cannot be stored in
PostgreSQL). Names are case-insensitive: `Nats-*` (the server's own) and `Mq-*` (the daemon's)
are never taken from a producer, whatever their case.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from scheduler.errors import EnvelopeError

RESERVED_PREFIXES = ("nats-", "mq-")
BLOCK_OVERHEAD = len(b"NATS/1.0\r\n") + len(b"\r\n")
_NAME = re.compile(r"[!-9;-~]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\ud800-\udfff]")


_RESERVED, _VALID, _INVALID = 0, 1, 2
_KINDS: dict[str, int] = {}  # header name -> kind; a deployment sees few distinct names


def _kind(name: str) -> int:
    kind = _KINDS.get(name)
    if kind is None:
        if name.lower().startswith(RESERVED_PREFIXES):
            kind = _RESERVED
        else:
            kind = _VALID if _NAME.fullmatch(name) is not None else _INVALID
        if len(_KINDS) < 10_000:
            _KINDS[name] = kind
    return kind


def split_producer_headers(
    headers: Mapping[str, str] | None,
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(the headers to forward, the problems of those that break a rule); reserved ones are
    dropped silently."""
    kept: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for name, value in (headers or {}).items():
        kind = _kind(name)
        if kind == _RESERVED:
            continue
        if kind == _INVALID:
            rule = "name must be printable ASCII without spaces or ':'"
            problems.append((f"header {printable(name, 100)!r}", rule))
        elif _BAD_VALUE.search(value) is not None:
            problems.append((f"header {name}", "value must not contain CR, LF or NUL"))
        else:
            kept[name] = value
    return kept, problems


def forwarded(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The producer headers delivered with a task; EnvelopeError (`invalid_header`) naming
    each header that breaks a rule."""
    kept, problems = split_producer_headers(headers)
    if problems:
        raise EnvelopeError(problems, "invalid_header")
    return kept


def producer_msg_id(headers: Mapping[str, str] | None) -> str | None:
    """The `Nats-Msg-Id` a producer set on a message, if any."""
    return (headers or {}).get("Nats-Msg-Id")


def block_size(headers: Mapping[str, str]) -> int:
    """Bytes of the header block that carries `headers` (none: no block)."""
    if not headers:
        return 0
    return BLOCK_OVERHEAD + sum(len(k) + len(v.encode()) + 4 for k, v in headers.items())


def printable(text: str, limit: int | None = None) -> str:
    """`text` safe as a header value and as PostgreSQL text: control characters (but tab) and
    lone surrogates as backslash escapes, cut to `limit` UTF-8 bytes on a character boundary."""
    if _UNSAFE.search(text) is not None:
        text = _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
    if limit is not None and len(text) > limit // 4:
        cut = text.encode()[:limit]
        text = cut.decode("utf-8", "ignore")
    return text
