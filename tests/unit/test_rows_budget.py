"""The management API's rows budget (`scheduler.api.gate.RowBudget`), on a moved clock."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

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


def test_refusal_says_what_reserve_would_refuse_and_takes_nothing() -> None:
    """`refusal(n)` is None while `reserve(n)` would pay (within its wait), else the
    Retry-After it would refuse with; asking takes nothing from the bucket."""
    clock = Clock()
    budget = RowBudget(100, 500, clock)
    assert budget.refusal(500) is None
    assert budget.reserve(500) == 0.0
    assert budget.refusal(50) is None  # half a second's wait: it would pay
    assert budget.refusal(500) == 5
    assert budget.refusal(500) == 5  # asked again: nothing was taken
    clock.now += 4.5
    assert budget.refusal(500) is None


async def test_a_listing_the_budget_cannot_pay_is_refused_before_routing() -> None:
    """With the budget spent, `GET /v1/delayed?limit=500` is answered 503 `overloaded` with
    Retry-After by the edge itself: the app behind it is never called (it was, and routed
    every such refusal: seen failing); a listing the budget can pay, and any other path,
    reach the app."""
    from scheduler.api.gate import QueryGate
    from scheduler.api.refusals import EarlyRefusal
    from scheduler.settings import Settings

    called: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    clock = Clock()
    budget = RowBudget(100, 500, clock)
    budget.reserve(500)
    edge = EarlyRefusal(app, lambda: Settings(), QueryGate(8), budget)

    async def get(path: str, query: str) -> tuple[int, dict[bytes, bytes]]:
        scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode(),
                 "headers": [], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}  # fmt: skip
        sent: list[MutableMapping[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        await edge(scope, receive, send)
        return sent[0]["status"], dict(sent[0].get("headers", []))

    status, headers = await get("/v1/delayed", "limit=500")
    assert (status, headers.get(b"retry-after")) == (503, b"5"), headers
    assert called == []
    assert (await get("/v1/delayed", "limit=10"))[0] == 200
    assert (await get("/v1/stats", ""))[0] == 200
    assert called == ["/v1/delayed", "/v1/stats"]
