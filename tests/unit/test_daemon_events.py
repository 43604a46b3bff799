"""The daemon's, the store's, the API's, the operations' and leadership's events as
`scheduler.metrics.Metrics` turns them into instruments."""

from __future__ import annotations

import ast
from pathlib import Path

from scheduler.metrics import Metrics

PACKAGE = Path(__file__).resolve().parents[2] / "scheduler"


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(f"mq_scheduler_{name}", labels)


def test_the_leaders_gauges_are_replaced_at_once_and_cleared() -> None:
    """A refresh replaces every forecast series (a subject gone is gone), keeps the backlog
    when it is unknown, and clearing zeroes them all."""
    m = Metrics()
    m.leader_gauges_refreshed({("a", "1m"): 3, ("b", "1m"): 1}, 2, 7)
    m.leader_gauges_refreshed({("a", "1m"): 4}, 1, None)
    assert value(m, "due_tasks", subject="a", within="1m") == 4
    assert value(m, "due_tasks", subject="b", within="1m") is None
    assert (value(m, "dead_letters_unresolved"), value(m, "intake_backlog")) == (1, 7)
    m.leader_gauges_cleared()
    assert value(m, "due_tasks", subject="a", within="1m") is None
    assert (value(m, "dead_letters_unresolved"), value(m, "intake_backlog")) == (0, 0)


def test_daemon_store_and_api_events_feed_their_instruments() -> None:
    """Each event updates the instrument its name promises."""
    m = Metrics()
    m.daemon_started("1.2.3", "i-1")
    m.postgres_connected()
    m.dead_letters_deleted(5)
    m.activity_deleted(2)
    m.loop_lag_measured(0.002)
    m.statement_timed("claim", 0.001)
    m.action_unrecorded()
    assert value(m, "build_info", version="1.2.3", instance="i-1") == 1
    assert value(m, "connected", service="postgres") == 1
    assert value(m, "dead_letters_pruned_total") == 5
    assert value(m, "activity_pruned_total") == 2
    assert value(m, "event_loop_lag_seconds_count") == 1
    assert value(m, "db_seconds_count", op="claim") == 1
    assert value(m, "activity_unrecorded_total") == 1


def test_leadership_events_feed_the_lease_and_clock_instruments() -> None:
    """A renew is timed; a clock check sets the skew and whether it is beyond the bound;
    standing by is not leading."""
    m = Metrics()
    m.took_office(3)
    m.standing_by()
    m.renewed(0.004)
    m.clock_checked(-0.25, True)
    assert value(m, "is_leader") == 0
    assert value(m, "lease_renew_seconds_count") == 1
    assert (value(m, "clock_skew_seconds"), value(m, "clock_skew_exceeded")) == (-0.25, 1)
    m.clock_checked(0.01, False)
    assert value(m, "clock_skew_exceeded") == 0


def test_a_request_served_counts_by_route_method_and_status() -> None:
    m = Metrics()
    m.request_served("/v1/schedules", "GET", 200)
    m.request_served("/v1/schedules", "GET", 200)
    assert value(m, "api_requests_total", route="/v1/schedules", method="GET", status="200") == 2


def _instrument_names() -> set[str]:
    """The attributes `_Instruments.__init__` assigns (every Prometheus instrument)."""
    tree = ast.parse((PACKAGE / "metrics.py").read_text())
    init = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "_Instruments"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "__init__"
    )
    return {
        n.attr
        for n in ast.walk(init)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    } - {"registry"}


def _metrics_object(node: ast.expr) -> bool:
    """`metrics`, `self.metrics`, `x._metrics`, `self.metrics_of_term`...: a name that says it
    holds the metrics."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return "metrics" in name.lower()


def instrument_updates(source: str, instruments: set[str]) -> list[int]:
    """Lines that reach an instrument through the metrics object (`x.metrics.fired.labels(...)`)
    or observe a histogram themselves (`observe_many`)."""
    tree = ast.parse(source)
    reached = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr in instruments and _metrics_object(n.value)
    ]
    observed = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "observe_many"
    ]
    return sorted(reached + observed)


def test_metrics_are_fed_from_events_only() -> None:
    """No module but scheduler/metrics.py touches an instrument: parts report events through
    their Protocols and `Metrics` turns them into instruments (docs/development.md)."""
    instruments = _instrument_names()
    assert {"fired", "lateness", "api_requests", "is_leader"} <= instruments
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "metrics.py" or path.parent != PACKAGE
        for line in instrument_updates(path.read_text(), instruments)
    ]
    assert offenders == []


def test_the_check_sees_an_instrument_reached_from_a_part() -> None:
    source = "def f(self):\n    self.metrics.fired.labels('delayed').inc(3)\n"
    assert instrument_updates(source, {"fired"}) == [2]
    assert instrument_updates("def f(e):\n    e.task_fired(3)\n", {"fired"}) == []
    assert instrument_updates("def f(e):\n    e.fired.add(3)\n", {"fired"}) == []  # not metrics
    assert instrument_updates("observe_many(h, 0.1, 3)\n", set()) == [1]
