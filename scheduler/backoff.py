"""Retry waits: exponential from a first wait, capped, with jitter so retries do not align."""

from __future__ import annotations

import random

MAX_BACKOFF = 60.0
JITTER = 0.2


def backoff_seconds(first: float, attempt: int, cap: float = MAX_BACKOFF) -> float:
    """The wait before retry number `attempt` (1 for the first retry): `first` doubling per
    attempt up to `cap`, then +-20 % jitter."""
    # The exponent is bounded: 2.0 ** 1024 overflows, and a cron target may fail for days.
    base = min(first * 2.0 ** min(max(attempt - 1, 0), 64), cap)
    return base * random.uniform(1 - JITTER, 1 + JITTER)
