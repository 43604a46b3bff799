"""The management API's rows budget (`scheduler.api.gate.RowBudget`), on a moved clock."""

from __future__ import annotations

import pytest

from scheduler.api.gate import OutOfBudget, RowBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pages_wait_their_turn_and_one_past_a_second_is_refused() -> None:
    """At 1000 rows/s the bucket pays one 500-row page at once; the next two wait 0.5 and 1 s
    (served back to back at the rate), the fourth would wait 1.5 s and is refused with
    Retry-After 2 s, taking nothing; half a second later a page waits 0.5 s again."""
    clock = Clock()
    budget = RowBudget(1000, 500, clock)
    assert [budget.reserve(500) for _ in range(3)] == [0.0, 0.5, 1.0]
    with pytest.raises(OutOfBudget) as refused:
        budget.reserve(500)
    assert (refused.value.per_second, refused.value.retry_after) == (1000, 2)
    clock.now += 1.0
    assert budget.reserve(500) == pytest.approx(0.5)


def test_the_bucket_holds_one_page_however_long_it_idles() -> None:
    """At 100 rows/s an idle hour refills the bucket to one 500-row page only: the next page
    is free, a 50-row one then waits half a second, a second 500-row one is refused."""
    clock = Clock()
    budget = RowBudget(100, 500, clock)
    clock.now += 3600
    assert budget.reserve(500) == 0.0
    assert budget.reserve(50) == pytest.approx(0.5)
    with pytest.raises(OutOfBudget) as refused:
        budget.reserve(500)
    assert refused.value.retry_after == 6


def test_zero_turns_the_budget_off() -> None:
    """0 rows/s admits every page at once."""
    budget = RowBudget(0, 500, Clock())
    assert {budget.reserve(500) for _ in range(1000)} == {0.0}


def test_a_page_pays_for_its_time_beyond_the_rows_it_paid() -> None:
    """A `limit=1` page whose query ran 200 ms pays the 16,000 rows that time is worth at
    WORK_ROWS_PER_SECOND (80,000) beyond its one row, so at 10,000 rows/s the next page is
    refused; a full page as quick as its rows pays nothing more."""
    clock = Clock()
    budget = RowBudget(10_000, 500, clock)
    assert budget.reserve(500) == 0.0
    assert budget.settle(500, 0.005) == 0  # 400 rows' worth of time: the 500 it paid cover it
    clock.now += 0.05
    assert budget.reserve(1) == 0.0
    assert budget.settle(1, 0.2) == 15_999
    with pytest.raises(OutOfBudget) as refused:
        budget.reserve(1)
    assert refused.value.retry_after == 2  # 15,500 rows of debt at 10,000 rows/s
