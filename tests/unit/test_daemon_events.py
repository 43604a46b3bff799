"""The daemon's, the store's, the API's, the operations' and leadership's events as
`scheduler.metrics.Metrics` turns them into instruments."""

from __future__ import annotations

from scheduler.metrics import Metrics


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
