"""Durations as people write them in settings and YAML: `500ms`, `0.5s`, `5m`, `1h30m`, `2d`."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """Parse a duration; a bare number is seconds. Raises ValueError with the reason."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    elif isinstance(value, int | float):
        seconds = float(value)
    else:
        seconds = _parse_text(str(value).strip())
    if seconds < 0:
        raise ValueError(f"{value!r} is negative")
    return timedelta(seconds=seconds)


def _parse_text(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{text!r} is not a duration (examples: 500ms, 10s, 5m, 1h30m, 2d)")
    return total


def format_duration(td: timedelta) -> str:
    """The shortest exact spelling of a duration, for messages and docs."""
    seconds = td.total_seconds()
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = [], seconds
    for unit in ("d", "h", "m"):
        n, rest = divmod(rest, _UNITS[unit])
        if n:
            out.append(f"{int(n)}{unit}")
    if rest:
        out.append(f"{rest:g}s")
    return "".join(out)
