"""The management API's rows budget (`scheduler.api.gate.RowBudget`), on a moved clock."""

from __future__ import annotations

import pytest

from scheduler.api.gate import OutOfBudget, RowBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_full_bucket_pays_one_page_then_refuses_with_the_wait() -> None:
    """At 1000 rows/s the bucket pays one 500-row page at once, refuses the next with
    Retry-After 1 s, and pays it once half a second has passed."""
    clock = Clock()
    budget = RowBudget(1000, 500, clock)
    budget.take(500)
    with pytest.raises(OutOfBudget) as refused:
        budget.take(500)
    assert (refused.value.per_second, refused.value.retry_after) == (1000, 1)
    clock.now += 0.5
    budget.take(500)
    with pytest.raises(OutOfBudget):
        budget.take(1)


def test_the_wait_covers_the_whole_deficit_and_the_bucket_holds_one_page() -> None:
    """At 100 rows/s the bucket still holds one 500-row page; the next page waits 5 s, and an
    idle hour refills the bucket only to one page."""
    clock = Clock()
    budget = RowBudget(100, 500, clock)
    budget.take(500)
    with pytest.raises(OutOfBudget) as refused:
        budget.take(500)
    assert refused.value.retry_after == 5
    clock.now += 3600
    budget.take(500)
    with pytest.raises(OutOfBudget):
        budget.take(100)


def test_zero_turns_the_budget_off() -> None:
    """0 rows/s admits every page."""
    budget = RowBudget(0, 500, Clock())
    for _ in range(1000):
        budget.take(500)
