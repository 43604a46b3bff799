"""The per-organisation (or subject) budget of stored intake refusals, on a fake clock."""

from __future__ import annotations

from scheduler.clock import FakeClock
from scheduler.engine.delayed.dead_budget import OVERFLOW, DeadLetterBudget, budget_key
from scheduler.engine.delayed.quota import OrgLabels
from scheduler.metrics import Metrics
from scheduler.settings import Settings


def _budget(per_minute: int, max_keys: int = 100) -> tuple[DeadLetterBudget, FakeClock]:
    clock = FakeClock()
    labels = OrgLabels((), 2)
    return DeadLetterBudget(per_minute, clock, Metrics(), labels, max_keys), clock


def test_a_key_gets_a_minutes_burst_then_its_rate() -> None:
    """6 a minute: six at once, then one every 10 s (not before), and never more than six
    banked however long the key stays quiet."""
    budget, clock = _budget(6)
    assert [budget.take("org:acme") for _ in range(7)] == [True] * 6 + [False]
    clock.advance(9.9)
    assert not budget.take("org:acme")
    clock.advance(0.2)
    assert budget.take("org:acme") and not budget.take("org:acme")
    clock.advance(3600)
    assert [budget.take("org:acme") for _ in range(7)] == [True] * 6 + [False]


def test_keys_have_their_own_buckets() -> None:
    """One organisation past its budget leaves another's untouched."""
    budget, _ = _budget(1)
    assert budget.take("org:acme") and not budget.take("org:acme")
    assert budget.take("org:beta")


def test_new_keys_share_the_overflow_bucket_when_the_table_is_full() -> None:
    """With every slot held by a bucket still refilling, new subjects share one overflow
    bucket (spraying subjects buys no fresh bursts); once the oldest has refilled, a new key
    takes its slot."""
    budget, clock = _budget(1, max_keys=2)
    assert budget.take("subject:a") and budget.take("subject:b")
    assert budget.take("subject:c")  # the overflow bucket's one token
    assert not budget.take("subject:d") and not budget.take("subject:e")
    assert len(budget._buckets) == 3 and OVERFLOW in budget._buckets
    clock.advance(61)
    assert budget.take("subject:f") and "subject:f" in budget._buckets


def test_the_key_is_the_targets_organisation_else_its_subject() -> None:
    assert budget_key("mq.org.acme.billing.run", "mq.delay.org.acme.billing.run") == "org:acme"
    assert budget_key("mq.tasks.work", "mq.delay.tasks.work") == "subject:mq.tasks.work"
    assert budget_key(None, "mq.delay.\x00") == "subject:mq.delay.\x00"


def test_dropped_refusals_are_counted_with_bounded_org_labels() -> None:
    """Past SCHEDULER_ORG_METRIC_LABELS organisations the label is `other`; no org is ''."""
    metrics = Metrics()
    budget = DeadLetterBudget(1, FakeClock(), metrics, OrgLabels((), 2), 100)
    for org in ("a", "b", "c"):
        budget.dropped(f"mq.org.{org}.x", "unparseable")
    budget.dropped("mq.tasks.work", "unparseable")
    counter = metrics.dead_letters_unstored
    (family,) = counter.collect()
    got = {s.labels["org"]: s.value for s in family.samples if "_total" in s.name}
    assert got == {"a": 1.0, "b": 1.0, "other": 2.0}


def test_a_rate_of_zero_turns_the_bound_off() -> None:
    assert DeadLetterBudget.of(Settings(dead_letter_rate=0), FakeClock(), Metrics()) is None
    assert DeadLetterBudget.of(Settings(), FakeClock(), Metrics()) is not None
