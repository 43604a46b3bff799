"""The misfire planner: what a cron job fires after downtime, with a fixed clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.cron.jobs import Job, load_text
from scheduler.cron.misfire import MAX_CATCHUP, fire_time, next_fire, plan

NOW = datetime(2026, 11, 22, 12, 0, 0, 200_000, tzinfo=UTC)


def job(cron: str = "* * * * *", **extra: str) -> Job:
    lines = "".join(f"    {k}: {v}\n" for k, v in extra.items())
    text = f'scheduled_jobs:\n  - name: j\n    subject: mq.scheduled.j\n    cron: "{cron}"\n{lines}'
    loaded = load_text(text, "t.yaml")
    assert loaded.ok, loaded.errors
    return loaded.jobs[0]


def test_on_time_occurrence_fires_and_moves_the_cursor() -> None:
    """An occurrence that just came fires under every policy."""
    for policy in ("skip", "fire_once", "fire_all"):
        p = plan(job(misfire=policy), NOW - timedelta(minutes=1), NOW)
        assert p.fire == (datetime(2026, 11, 22, 12, 0, tzinfo=UTC),)
        assert p.cursor == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
        assert p.skipped == 0


def test_nothing_due_keeps_the_cursor() -> None:
    """Before the next occurrence nothing fires and the cursor stays."""
    cursor = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    p = plan(job(), cursor, NOW)
    assert p.fire == () and p.cursor == cursor and p.skipped == 0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", []),
        ("fire_once", [datetime(2026, 11, 22, 11, 59, tzinfo=UTC)]),
        ("fire_all", [datetime(2026, 11, 22, 11, m, tzinfo=UTC) for m in range(55, 60)]),
    ],
)
def test_downtime_policies(policy: str, expected: list[datetime]) -> None:
    """10 minutes down, a 5-minute window: skip none, fire the latest once, or all inside."""
    j = job(misfire=policy, catchup_window="5m")
    now = datetime(2026, 11, 22, 11, 59, 30, tzinfo=UTC)
    p = plan(j, now - timedelta(minutes=10), now)
    assert list(p.fire) == expected
    assert p.cursor == datetime(2026, 11, 22, 11, 59, tzinfo=UTC)
    assert p.skipped + len(p.fire) == 10


def test_fire_all_is_capped() -> None:
    """After three days down an every-second job fires at most MAX_CATCHUP catch-ups."""
    j = job("* * * * * *", misfire="fire_all", catchup_window="1h")
    p = plan(j, NOW - timedelta(days=3), NOW)
    assert len(p.fire) == MAX_CATCHUP
    assert p.fire[-1] == NOW.replace(microsecond=0)
    assert p.cursor == NOW.replace(microsecond=0)


def test_occurrences_older_than_the_window_never_fire() -> None:
    """A daily job missed yesterday is not fired today with a 1 h window."""
    j = job("0 2 * * *", misfire="fire_once", catchup_window="1h")
    p = plan(j, datetime(2026, 11, 21, 2, tzinfo=UTC), NOW)
    assert p.fire == ()
    assert p.skipped == 1
    assert p.cursor >= datetime(2026, 11, 22, 2, tzinfo=UTC)


def test_jitter_delays_each_occurrence_by_a_fixed_amount() -> None:
    """With jitter an occurrence fires at occurrence + a fixed offset below the jitter."""
    j = job("0 * * * *", jitter="10m")
    occurrence = datetime(2026, 11, 22, 12, tzinfo=UTC)
    at = fire_time(j, occurrence)
    assert occurrence <= at < occurrence + timedelta(minutes=10)
    assert fire_time(j, occurrence) == at
    assert plan(j, occurrence - timedelta(hours=1), at - timedelta(milliseconds=1)).fire == ()
    assert plan(j, occurrence - timedelta(hours=1), at).fire == (occurrence,)
    assert next_fire(j, occurrence - timedelta(hours=1)) == at
