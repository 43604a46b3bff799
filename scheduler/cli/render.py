"""How the operator CLI writes values for a person: one time format, one duration format, no
`None`, no terminal control characters, and payloads bounded.

Times are RFC 3339 UTC with milliseconds (`2026-11-26T14:05:00.123Z`) whatever precision the
API sent; durations and lateness are milliseconds with one decimal (`3.8 ms`); a missing value
is `-`. Text that came from producers or YAML (payloads, headers, errors, subjects) is shown
with its control characters escaped, so a message cannot move the cursor or recolour the
operator's terminal.
"""

from __future__ import annotations

import base64
import binascii
import re
import textwrap
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from scheduler.clock import to_rfc3339
from scheduler.cron.expression import CronExpr, occurrences

PAYLOAD_SHOWN = 4096  # characters of a payload printed by `dlq show` (all of it with --json)
NONE = "-"
# C0 and C1 controls, DEL, and the bidirectional overrides/isolates ("Trojan Source").
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_KEEP_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def when(value: str | datetime | None) -> str:
    """An instant as RFC 3339 UTC with milliseconds; `-` for none; text that is not an aware
    time is shown as it came (escaped), never dropped."""
    if value is None:
        return NONE
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return printable(value)
    else:
        parsed = value
    if parsed.tzinfo is None:
        return printable(str(value))
    return to_rfc3339(parsed.astimezone(UTC))


def ms(value: float | None) -> str:
    """A duration in milliseconds with one decimal (`3.8 ms`), `-` for none."""
    return NONE if value is None else f"{value:.1f} ms"


def text(value: Any) -> str:
    """Any value on one line: `-` for None, yes/no for booleans, controls escaped."""
    if value is None:
        return NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return printable(str(value))


def printable(value: str, keep_lines: bool = False) -> str:
    """`value` with control characters as `\\xNN`/`\\uNNNN` escapes (newlines and tabs kept
    with `keep_lines`)."""
    pattern = _CONTROL_KEEP_LINES if keep_lines else _CONTROL
    return pattern.sub(_escape, value)


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def fields(pairs: Iterable[tuple[str, Any]], width: int = 15) -> list[str]:
    """`label  value` lines with the values in one column (at `width`, or further right when
    a label is longer); labels' underscores as spaces."""
    rows = [(label.replace("_", " "), value) for label, value in pairs]
    width = max([width, *(len(label) + 2 for label, _ in rows)])
    return [f"{label:<{width}}{value}".rstrip() for label, value in rows]


def next_run(item: Mapping[str, Any], now: datetime) -> str:
    """When a listed cron job fires next, from its cron and zone with the daemon's own cron
    code (the list answer carries no next run; `schedules show` gives it with jitter); `-`
    for a job that will not fire on its own (removed, paused or failed)."""
    if not item.get("active", True) or item.get("paused") or item.get("failed"):
        return NONE
    try:
        cron, zone = CronExpr.parse(item["cron"]), ZoneInfo(item["timezone"])
        after = max(now, _aware(item.get("last_scheduled_for")) or now)
        return when(next(occurrences(cron, after, zone)))
    except (ValueError, KeyError, StopIteration):  # a spec this CLI cannot read: say so
        return "?"


def _aware(value: str | None) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value) if value else None
    except ValueError:
        return None
    return parsed if parsed is not None and parsed.tzinfo is not None else None


def problems_block(problems: list[dict[str, Any]]) -> list[str]:
    """The YAML errors the daemon reports, one `file:line: job: message` line each (as
    `scheduler validate` prints them); nothing when there are none."""
    if not problems:
        return []
    count = plural(len(problems), "error")
    lines = [f"schedule YAML: {count}; the jobs named are not loaded and do not fire:"]
    for p in problems:
        where = p["file"] if p.get("line") is None else f"{p['file']}:{p['line']}"
        job = f"job {p['job']}: " if p.get("job") else ""
        lines.append(printable(f"  {where}: {job}{p['message']}"))
    return lines


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def payload_lines(
    raw_base64: str | None, payload: Any, cut: bool, limit: int = PAYLOAD_SHOWN
) -> list[str]:
    """A dead letter's message as it was received: its text when it is UTF-8, else base64;
    at most `limit` characters, with a note saying what is left out and where to find it."""
    raw = _decoded(raw_base64)
    if raw is None:
        if payload is None:
            return ["(not stored)"]
        shown, note = _bounded(printable(str(payload), keep_lines=True), limit, "characters")
        return [*shown.splitlines(), *note, "(as JSON: the raw bytes are not stored)"]
    body = _utf8(raw, cut)
    if body is None:
        shown, note = _bounded(base64.b64encode(raw).decode(), limit, "base64 characters")
        lines = [*textwrap.wrap(shown, 76), *note, f"(not UTF-8: {len(raw)} bytes as base64)"]
    else:
        shown, note = _bounded(printable(body, keep_lines=True), limit, "characters")
        lines = [*(shown.splitlines() or ["(empty)"]), *note]
    if cut:
        lines.append("(the table kept only these first bytes: the MQ_DLQ stream holds it whole)")
    return lines


def _decoded(raw_base64: str | None) -> bytes | None:
    if raw_base64 is None:
        return None
    try:
        return base64.b64decode(raw_base64, validate=True)
    except (binascii.Error, ValueError):
        return None


def _utf8(raw: bytes, cut: bool) -> str | None:
    """The text of `raw`; a stored prefix may end inside a character, so up to 3 bytes of a
    cut message are dropped before giving up on UTF-8."""
    for drop in range(4 if cut else 1):
        try:
            return raw[: len(raw) - drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def _bounded(body: str, limit: int, unit: str) -> tuple[str, list[str]]:
    """The first `limit` characters of `body`, and a note when that is not all of it."""
    if len(body) <= limit:
        return body, []
    return body[:limit], [f"... ({limit} of {len(body)} {unit} shown; --json has it all)"]


def header_lines(headers: Mapping[str, Any]) -> list[str]:
    """`Name: value` per header, escaped; `(none)` when there are none."""
    if not headers:
        return ["(none)"]
    return [f"{printable(str(k))}: {text(v)}" for k, v in headers.items()]
