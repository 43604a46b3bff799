"""The cron cursor book's fold (`scheduler.engine.cron.cursors.CursorBook`): what a tick's
publish outcomes make of the cursors and the fire log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from scheduler.clock import FakeClock
from scheduler.cron.jobs import load_text
from scheduler.engine.cron.cursors import CursorBook, Result
from scheduler.metrics import Metrics
from scheduler.records import Advance, PubAck, PublishError
from scheduler.settings import Settings
from scheduler.store.memory import MemoryScheduleStore

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
JOB = load_text(
    "scheduled_jobs:\n  - name: a\n    subject: mq.scheduled.a\n    cron: '* * * * *'\n"
).jobs[0]


def book() -> CursorBook:
    return CursorBook(Settings(), MemoryScheduleStore(), FakeClock(T0), Metrics(), mirror=False)


def test_a_catch_up_of_three_occurrences_logs_each_of_them() -> None:
    """Three occurrences of one job acknowledged in one tick (a catch-up after a takeover):
    the move stands at the last and carries the two before it, each with its own occurrence
    and stream sequence, so the fire log gets three deliveries (it got only the last: the
    drift audit counted the others missed; seen failing)."""
    minutes = [T0 - timedelta(minutes=m) for m in (3, 2, 1)]
    moves = {"a": Advance("a", JOB.subject, minutes[0])}
    results = [(JOB, at, PubAck("S", i + 1, False)) for i, at in enumerate(minutes)]
    book().fold(results, moves)
    move = moves["a"]
    assert move.scheduled_for == minutes[2] and move.stream_seq == 3
    logged = [(d.scheduled_for, d.stream_seq) for d in move.deliveries()]
    assert logged == [(minutes[0], 1), (minutes[1], 2), (minutes[2], 3)]


def test_a_failure_keeps_what_was_delivered_before_it_and_logs_nothing_after() -> None:
    """The second of three occurrences fails: the cursor stays at the first, which alone is
    logged; the third (acknowledged after the failure) is published again later."""
    minutes = [T0 - timedelta(minutes=m) for m in (3, 2, 1)]
    moves = {"a": Advance("a", JOB.subject, minutes[0])}
    results: list[Result] = [
        (JOB, minutes[0], PubAck("S", 1, False)),
        (JOB, minutes[1], PublishError(JOB.subject, "timeout")),
        (JOB, minutes[2], PubAck("S", 3, False)),
    ]
    book().fold(results, moves)
    move = moves["a"]
    assert move.scheduled_for == minutes[0]
    assert [(d.scheduled_for, d.stream_seq) for d in move.deliveries()] == [(minutes[0], 1)]
