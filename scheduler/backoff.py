"""Retry waits: exponential from a first wait, capped, with jitter so retries do not align."""

from __future__ import annotations

import random

MAX_BACKOFF = 60.0
JITTER = 0.2


def backoff_seconds(first: float, attempt: int, cap: float = MAX_BACKOFF) -> float:
    """The wait before retry number `attempt` (1 for the first retry): `first` doubling per
    attempt up to `cap`, then +-20 % jitter."""
    base = min(first * 2 ** max(attempt - 1, 0), cap)
    return base * random.uniform(1 - JITTER, 1 + JITTER)
