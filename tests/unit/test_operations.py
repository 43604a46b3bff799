"""Pure parts of the operations surface: cursors, the forecast's top-N, tokens, outcome ->
problem mapping, the CLI's exit codes, manual trigger envelopes, operator pauses."""

from __future__ import annotations

import io
import json
import urllib.error
from datetime import UTC, datetime
from email.message import Message
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.api.auth import identify
from scheduler.api.problems import from_outcome
from scheduler.cli.apiclient import _failure, table
from scheduler.cron.jobs import job_from_definition, load_text
from scheduler.daemon.refresher import top_subjects
from scheduler.engine.cron.catalog import operator_paused
from scheduler.errors import RequestError
from scheduler.operations import Outcome
from scheduler.operations.cron_jobs import manual_envelope
from scheduler.operations.paging import decode, encode, from_us, page, us
from scheduler.settings import Settings

JOBS = load_text(
    """
scheduled_jobs:
  - name: report
    subject: mq.scheduled.report
    cron: "0 2 * * *"
    timezone: Europe/Berlin
    jitter: 30s
    data: {a: 1}
  - name: ping
    subject: mq.scheduled.ping
    cron: "*/5 * * * *"
    data: {}
"""
).jobs


@given(st.integers(min_value=0, max_value=2**62), st.integers(1, 10), st.integers(0, 2**62))
def test_cursors_round_trip(micros: int, priority: int, seq: int) -> None:
    """A cursor gives back exactly the key it was made from."""
    assert decode("delayed", encode("delayed", [micros, priority, seq]), (int, int, int)) == [
        micros,
        priority,
        seq,
    ]


@pytest.mark.parametrize(
    "cursor",
    [
        encode("dead-letters", [1, "x"]),  # another list's
        encode("delayed", [1, 2]),  # too short
        encode("delayed", ["1", 2, 3]),  # wrong type
        "not-base64-json",
        "",
    ],
    # named, not shown: the cursors' MACs use the process's random key, and pytest-xdist's
    # workers must collect the same test ids
    ids=["another-list", "too-short", "wrong-type", "not-base64-json", "empty"],
)
def test_foreign_or_edited_cursors_are_refused(cursor: str) -> None:
    """A cursor of another list, of another shape or not ours at all names `cursor`."""
    with pytest.raises(RequestError) as info:
        decode("delayed", cursor, (int, int, int))
    assert info.value.code == "bad_cursor" and info.value.field == "cursor"


def test_page_keeps_the_limit_and_points_after_its_last_row() -> None:
    """With one row more than the limit, the page has `limit` rows and a cursor after the last."""
    rows = [{"n": i} for i in range(4)]
    got = page(rows, 3, lambda r: (r["n"],), "x")
    assert got.items == rows[:3] and decode("x", got.next_cursor, (int,)) == [2]
    assert page(rows[:3], 3, lambda r: (r["n"],), "x").next_cursor is None
    instant = datetime(2026, 11, 25, 10, 0, 0, 123456, tzinfo=UTC)
    assert from_us(us(instant)) == instant


def test_top_subjects_bound_the_labels_and_fold_the_rest_into_other() -> None:
    """The top N by the widest window stay, ties by name; the rest are summed per window."""
    forecast = {
        "mq.a": [0, 1, 2, 3],
        "mq.b": [1, 1, 1, 5],
        "mq.c": [0, 0, 1, 3],
        "mq.d": [2, 2, 2, 2],
    }
    assert top_subjects(forecast, 2) == {
        "mq.b": [1, 1, 1, 5],
        "mq.a": [0, 1, 2, 3],
        "other": [2, 2, 3, 5],
    }
    assert top_subjects(forecast, 4) == forecast
    assert top_subjects({}, 3) == {}


class _Req:
    def __init__(self, header: str | None) -> None:
        self.headers = {"authorization": header} if header is not None else {}
        self.client = None


@pytest.mark.parametrize(
    ("header", "kind"),
    [
        ("Bearer adm", "admin"),
        ("bearer rd", "read"),
        ("Bearer  rd ", "read"),
        ("Bearer other", None),
        ("Basic adm", None),
        ("adm", None),
        (None, None),
        ("Bearer ", None),
    ],
)
def test_identify_knows_both_tokens_and_nothing_else(header: str | None, kind: str | None) -> None:
    """Only `Bearer <token>` with a configured token identifies a caller."""
    settings = Settings(admin_token="adm", read_token="rd")
    caller = identify(_Req(header), settings)  # type: ignore[arg-type]
    assert (caller.kind if caller else None) == kind


@pytest.mark.parametrize(
    ("status", "http", "code"),
    [
        ("not_found", 404, "not_found"),
        ("too_late", 409, "too_late"),
        ("in_flight", 409, "in_flight"),
        ("publish_failed", 503, "publish_failed"),
        ("some_future_status", 409, "some_future_status"),
    ],
)
def test_outcomes_map_to_problems_and_unknown_statuses_flow_through(
    status: str, http: int, code: str
) -> None:
    """Any status the store answers becomes a problem with that status as its code."""
    problem = from_outcome(Outcome(status, "t1", "why"), "task")
    assert (problem.status, problem.code, problem.detail) == (http, code, "why")
    assert problem.extra["id"] == "t1"


def _http_error(status: int, body: dict[str, Any]) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(
        "http://x", status, "reason", Message(), io.BytesIO(json.dumps(body).encode())
    )


@pytest.mark.parametrize(
    ("status", "method", "code", "words"),
    [
        (401, "POST", 1, "set SCHEDULER_ADMIN_TOKEN or pass --token"),
        (401, "GET", 1, "set SCHEDULER_READ_TOKEN"),
        (403, "POST", 1, "403: nope"),
        (404, "GET", 1, "404: nope"),
        (409, "DELETE", 1, "409: nope"),
        (400, "GET", 2, "400: nope"),
        (422, "PATCH", 2, "422: nope"),
        (503, "GET", 3, "503: nope"),
    ],
)
def test_cli_exit_codes_follow_the_answer(status: int, method: str, code: int, words: str) -> None:
    """Refused or missing: 1; bad input: 2; the daemon failing: 3; the message says what to do."""
    failure = _failure(_http_error(status, {"detail": "nope"}), method)
    assert failure.exit_code == code and words in str(failure)


def test_table_aligns_and_prints_none_as_dash() -> None:
    """Columns are as wide as their widest cell (numbers right-aligned); None is '-' and
    booleans yes/no."""
    assert table([("a", None, True), ("bbb", 12, False)], ["X", "Y", "Z"]).splitlines() == [
        "X     Y  Z",
        "a     -  yes",
        "bbb  12  no",
    ]


def test_manual_envelope_has_its_own_id_and_marks_itself() -> None:
    """A manual trigger's envelope and Nats-Msg-Id are the manual key; the rest as cron's."""
    job = JOBS[0]  # sorted by name: ping, report
    now = datetime(2026, 11, 25, 10, 0, 0, 250000, tzinfo=UTC)
    body, headers = manual_envelope(job, now, "ping@manual-2026-11-25T10:00:00.250Z")
    doc = json.loads(body)
    assert doc["id"] == headers["Nats-Msg-Id"] == "ping@manual-2026-11-25T10:00:00.250Z"
    assert doc["type"] == "scheduled.ping" and doc["source"] == "scheduler"
    assert headers["Mq-Manual"] == "true" and headers["Mq-Schedule"] == "ping"


def test_jobs_read_back_from_their_stored_definition_are_equal() -> None:
    """What the API reads from PostgreSQL is the job the daemon runs (cron, zone, jitter)."""
    for job in JOBS:
        assert job_from_definition(job.definition(), job.file, job.line) == job


def test_operator_pauses_mark_only_the_named_jobs() -> None:
    """An operator's pause sets `paused` on that job and leaves the others as YAML says."""
    marked = operator_paused(JOBS, frozenset({"ping"}))
    assert [(j.name, j.paused) for j in marked] == [("ping", True), ("report", False)]
    assert operator_paused(JOBS, frozenset()) == JOBS


@pytest.mark.parametrize("raw", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_new_due_time_out_of_range_is_a_bad_request_naming_the_field(raw: str) -> None:
    """A reschedule to a time PostgreSQL cannot hold is refused naming `delay_until`, not a
    database error."""
    from datetime import UTC, datetime

    from scheduler.clock import FakeClock
    from scheduler.errors import RequestError
    from scheduler.operations.tasks import TaskOperations, parse_due
    from scheduler.settings import Settings

    ops = TaskOperations.__new__(TaskOperations)  # check_due reads clock and settings only
    ops.clock = FakeClock(datetime(2026, 11, 25, tzinfo=UTC))
    ops.settings = Settings()
    with pytest.raises(RequestError, match=r"delay_until: is out of range"):
        ops.check_due(parse_due(raw))
