"""How many intake refusals one organisation (or one subject) may add to `dead_letters`.

Every refusal still goes to the DLQ stream (within that stream's own limits) and is termed on
the lane; this bounds only the rows in PostgreSQL. Each key has a token bucket holding up to
`SCHEDULER_DEAD_LETTER_RATE` refusals, refilled at that many per minute: a burst of one
minute's worth is stored, then one refusal per `60 / rate` seconds. A refusal that finds its
bucket empty is not stored; it is counted in `mq_scheduler_dead_letters_unstored_total`
(labels: organisation, bounded by `SCHEDULER_ORG_METRIC_LABELS`, and reason).

The key is the organisation a target names (`mq.org.<org>.>`, the part NATS permissions give
each organisation's producers), else the target subject, else the lane subject. At most
`MAX_KEYS` buckets are kept (least recently used first out; a bucket that has refilled
completely is the same as a new one). When the oldest bucket has not refilled yet, a new key
shares one overflow bucket instead, so spraying subjects cannot buy fresh bursts.

The buckets live in the leader's memory (only the leader runs the intake): a new leader starts
with full buckets, at most one more burst per key per failover.
"""

from __future__ import annotations

from collections import OrderedDict

from scheduler.clock import Clock
from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.delayed.quota import UNNAMED, OrgLabels
from scheduler.messages.subjects import org_of
from scheduler.settings import Settings

MAX_KEYS = 10_000
OVERFLOW = "\x00overflow"  # no subject or organisation can be this key


def budget_key(target: str | None, subject: str) -> str:
    """What a refusal counts against: its target's organisation, else its subject."""
    if target is not None:
        org = org_of(target)
        return f"org:{org}" if org else f"subject:{target}"
    return f"subject:{subject}"


class DeadLetterBudget:
    """Token buckets per key: `take(key)` says whether one more refusal may be stored."""

    def __init__(
        self,
        per_minute: int,
        clock: Clock,
        events: DelayedEvents,
        labels: OrgLabels,
        max_keys: int,
    ) -> None:
        self.burst = float(per_minute)
        self.per_second = per_minute / 60.0
        self.clock = clock
        self._events = events
        self.labels = labels
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    @classmethod
    def of(cls, settings: Settings, clock: Clock, events: DelayedEvents) -> DeadLetterBudget | None:
        """The budget the settings ask for, or None when `dead_letter_rate` is 0 (no bound)."""
        if settings.dead_letter_rate <= 0:
            return None
        labels = OrgLabels(settings.org_shares, settings.org_metric_labels)
        return cls(settings.dead_letter_rate, clock, events, labels, MAX_KEYS)

    def take(self, key: str) -> bool:
        """Spend one token of `key`'s bucket (or the overflow bucket); False when empty."""
        now = self.clock.monotonic()
        key = self._slot(key, now)
        tokens, then = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.per_second)
        self._buckets[key] = (tokens - 1.0, now) if tokens >= 1.0 else (tokens, now)
        self._buckets.move_to_end(key)
        return tokens >= 1.0

    def dropped(self, target: str | None, reason: str) -> None:
        """Count a refusal that was not stored."""
        org = (org_of(target) if target else None) or UNNAMED
        self._events.dead_letter_unstored(self.labels(org), reason)

    def _slot(self, key: str, now: float) -> str:
        """`key` itself, or the overflow bucket when the table is full of unrefilled buckets."""
        if key in self._buckets or len(self._buckets) < self.max_keys:
            return key
        oldest, (tokens, then) = next(iter(self._buckets.items()))
        if oldest != OVERFLOW and tokens + (now - then) * self.per_second >= self.burst:
            del self._buckets[oldest]  # full again: forgetting it changes nothing
            return key
        return OVERFLOW
