"""The HTTP edge's pace (scheduler/api/pace.py): reads past the rate wait their turn, in order."""

from __future__ import annotations

import pytest

from scheduler.api.pace import Pace


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_a_tenth_of_a_second_goes_at_once_and_the_rest_waits_in_line() -> None:
    clock = Clock()
    pace = Pace(1000, clock)
    assert [pace.reserve() for _ in range(100)] == [0.0] * 100
    waits = [pace.reserve() for _ in range(3)]
    assert waits == pytest.approx([0.001, 0.002, 0.003])


def test_the_bucket_refills_at_the_rate_and_holds_no_more_than_its_burst() -> None:
    clock = Clock()
    pace = Pace(1000, clock)
    for _ in range(100):
        pace.reserve()
    clock.now += 0.05  # 50 reads' worth
    assert [pace.reserve() for _ in range(50)] == pytest.approx([0.0] * 50, abs=1e-9)
    assert pace.reserve() == pytest.approx(0.001)
    clock.now += 60  # idle for a minute: still one burst
    assert sum(1 for _ in range(200) if pace.reserve() == 0.0) == 100


def test_a_pace_of_zero_never_waits() -> None:
    pace = Pace(0, Clock())
    assert {pace.reserve() for _ in range(10_000)} == {0.0}


def test_a_burst_of_a_whole_second_for_the_nats_verbs() -> None:
    """The verbs' bucket holds a second of the rate: a client's burst of cancels goes through."""
    pace = Pace(1000, Clock(), burst=1.0)
    assert sum(1 for _ in range(1500) if pace.reserve() == 0.0) == 1000


def test_take_drops_past_the_pace_without_taking_a_place_in_line() -> None:
    clock = Clock()
    pace = Pace(10, clock, burst=0.5)  # five at once
    assert [pace.take() for _ in range(8)] == [True] * 5 + [False] * 3
    clock.now += 0.15  # a token and a half: the refused ones left no debt behind
    assert pace.take() and not pace.take()
