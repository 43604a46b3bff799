"""How the console shows values: instants in UTC and in a job's zone, ages, milliseconds, JSON.

The API answers with RFC 3339 text; these filters take that text (or a datetime) and never fail
on a value they cannot read: they show it as it came. Everything they return is plain text that
the templates escape.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from markupsafe import Markup

from scheduler.console.cron_words import describe
from scheduler.partitions import spans

NONE = "—"


def instant(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def when(value: Any) -> str:
    """`2026-11-25 10:00:03 UTC` (milliseconds when there are any)."""
    at = instant(value)
    if at is None:
        return NONE if value in (None, "") else str(value)
    at = at.astimezone(UTC)
    text = at.strftime("%Y-%m-%d %H:%M:%S")
    if at.microsecond:
        text += f".{at.microsecond // 1000:03d}"
    return text + " UTC"


def in_zone(value: Any, zone: str) -> str:
    """The instant on the wall clock of `zone`: `2026-11-25 11:00:03 CET`."""
    at = instant(value)
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return when(value)
    if at is None:
        return NONE
    local = at.astimezone(tz)
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or zone)


def ago(value: Any, now: datetime | None = None) -> str:
    """`12 s ago`, `in 3 min`, `2 h ago`."""
    at = instant(value)
    if at is None:
        return NONE
    seconds = ((now or datetime.now(UTC)) - at).total_seconds()
    span = _span(abs(seconds))
    if span == "now":
        return "just now" if seconds >= 0 else "in under 1 s"
    return f"{span} ago" if seconds >= 0 else f"in {span}"


def _span(seconds: float) -> str:
    if seconds < 1:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}" if size > 60 else f"{seconds // size:.0f} {unit}"
    return f"{seconds:.0f} s"


def ms(value: Any) -> str:
    """Milliseconds: `3.2 ms`, `1,204 ms`, or a dash."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return NONE
    return f"{value:,.1f} ms" if abs(value) < 100 else f"{value:,.0f} ms"


def jitter(fire_at: Any, scheduled_for: Any) -> str:
    """How long after its occurrence a job fires (its fixed jitter): `+0 ms`, `+1.250 s`."""
    fire, due = instant(fire_at), instant(scheduled_for)
    if fire is None or due is None:
        return NONE
    seconds = (fire - due).total_seconds()
    return f"+{seconds * 1000:.0f} ms" if abs(seconds) < 1 else f"+{seconds:,.3f} s"


def raw_text(value: Any) -> str | None:
    """A dead letter's stored bytes (`raw_base64`) as the UTF-8 text that was published, byte
    for byte (key order and spacing kept); None when there are none or they are not UTF-8. A
    cut message may end inside a character: that last partial character shows as U+FFFD."""
    if not isinstance(value, dict) or not isinstance(value.get("raw_base64"), str):
        return None
    try:
        raw = base64.b64decode(value["raw_base64"], validate=True)
    except ValueError:
        return None
    cut = 4 if value.get("raw_truncated") else 1  # a cut may split the last character
    for drop in range(cut):
        try:
            return raw[: len(raw) - drop].decode("utf-8") + "\ufffd" * (drop > 0)
        except UnicodeDecodeError:
            continue
    return None


def pretty(value: Any) -> str:
    """JSON, indented, for a <pre>: the templates escape it, so markup shows as text."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def short(value: Any, length: int = 8) -> str:
    text = str(value)
    return text if len(text) <= length else text[:length] + "…"


def seg(value: Any) -> str:
    """A value quoted for one URL path segment or query value (`/`, `?`, `#` included)."""
    return quote(str(value), safe="")


def subject_breaks(value: Any) -> Markup:
    """A NATS subject that a narrow column wraps between its tokens, never inside one (a
    hyphen is no break either): each token with its dot is an unbreakable box (`span.tok`,
    console.css), broken inside only when it alone is wider than the column."""
    parts = str(value).split(".")
    tokens = [part + "." for part in parts[:-1]] + parts[-1:]
    return Markup("<wbr>").join(
        Markup('<span class="tok">{}</span>').format(token) for token in tokens
    )


def count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else NONE


def partition_spans(value: Any) -> str:
    """A list of partitions as runs (`0-3, 7`); anything else as it came."""
    if isinstance(value, list) and all(type(p) is int for p in value):
        return spans(value) or NONE
    return str(value)


FILTERS = {
    "cron_words": describe,
    "jitter": jitter,
    "raw_text": raw_text,
    "subject_breaks": subject_breaks,
    "when": when,
    "in_zone": in_zone,
    "ago": ago,
    "ms": ms,
    "pretty": pretty,
    "short": short,
    "count": count,
    "seg": seg,
    "spans": partition_spans,
}
