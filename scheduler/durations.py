"""Durations as people write them in settings and YAML: `500ms`, `0.5s`, `5m`, `1h30m`, `2d`."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from scheduler.errors import DurationError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Far beyond any real setting or jitter, yet `now + duration` stays a valid datetime.
MAX_DURATION = timedelta(days=36500)
_EXAMPLES = "(examples: 500ms, 10s, 5m, 1h30m, 2d)"
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """Parse a duration; a bare number is seconds. Raises DurationError (a ValueError) with the
    reason: not a duration, negative, or longer than MAX_DURATION (100 years)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise DurationError(value, "is not a duration")
    elif isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range
            seconds = math.inf
    else:
        seconds = _parse_text(str(value).strip())
    if math.isnan(seconds):
        raise DurationError(value, f"is not a duration {_EXAMPLES}")
    if seconds < 0:
        raise DurationError(value, "is negative")
    if seconds > MAX_DURATION.total_seconds():
        raise DurationError(value, "is longer than 100 years")
    return timedelta(seconds=seconds)


def _parse_text(text: str) -> float:
    try:
        return float(text)
    except (ValueError, OverflowError):
        pass
    pos, total = 0, 0.0
    while pos < len(text):  # anchored matches: a long bad text costs linear time, not quadratic
        match = _PART.match(text, pos)
        if match is None:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise DurationError(text, f"is not a duration {_EXAMPLES}")
    return total
