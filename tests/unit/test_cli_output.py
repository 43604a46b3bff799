"""What the operator CLI prints for a person: no `None`, one time format, payloads and headers
of dead letters, states, next runs, YAML errors, and a quiet exit when stdout closes early."""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import ops, render
from scheduler.cli.apiclient import table
from scheduler.cli.main import _parser

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
PROBLEM = {"file": "/etc/jobs/typo.yaml", "line": 7, "job": "report", "message": "cron: bad"}


class FakeApi:
    """Answers each path with a fixed document and records the calls (pure output logic)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, dict[str, Any] | None]] = []

    def call(
        self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None
    ) -> Any:
        self.calls.append((method, path, query))
        return self.answers[path]


def args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


def run(verb: Any, answers: dict[str, Any], *argv: str) -> tuple[Any, str, int]:
    return verb(FakeApi(answers), args(*argv))  # type: ignore[no-any-return]


# Every nullable field of the API's answers set to null (scheduler/api/models.py).
JOB = {
    "name": "report", "subject": "mq.scheduled.report", "cron": "0 2 * * *", "timezone": "UTC",
    "description": "", "active": True, "paused": True, "paused_in_yaml": False,
    "paused_at": None, "paused_by": None, "failed": True, "failed_at": None,
    "failed_reason": None, "failed_error": None, "file": None, "line": None,
    "last_scheduled_for": "2026-11-25T02:00:00Z", "last_fired_at": None, "skipped": 0,
}  # fmt: skip
FIRE = {
    "scheduled_for": "2026-11-25T02:00:00Z", "fired_at": "2026-11-25T02:00:00.003812Z",
    "lateness_ms": 3.812, "attempt": 1, "epoch": 4, "instance": "a", "stream": None,
    "stream_seq": None, "manual": False,
}  # fmt: skip
TASK: dict[str, Any] = {
    "id": "t1", "target": "mq.tasks.x", "status": "fired", "priority": None,
    "due_at": "2026-11-25T02:00:00Z", "scheduled_for": "2026-11-25T02:00:00Z",
    "expires_at": None, "attempts": 1, "created_at": None, "fired_at": None, "stream_seq": None,
    "last_error": None, "claimed_epoch": None, "claimed_at": None,
    "updated_at": "2026-11-25T02:00:00Z", "headers": {}, "envelope": None,
    "deliveries": [{"scheduled_for": "2026-11-25T02:00:00Z", "fired_at": "2026-11-25T02:00:01Z",
                    "attempt": 1, "epoch": 1, "instance": "a", "stream": None,
                    "stream_seq": None}],
}  # fmt: skip
DEAD: dict[str, Any] = {
    "id": "0b0e7c36-3f43-4a8e-9f0e-7d1b0c6f1a11", "original_id": "t1", "subject": "mq.delay.x",
    "target": None, "reason": "invalid_envelope", "stage": "intake", "error": None,
    "attempts": 0, "first_seen": "2026-11-25T02:00:00Z", "last_failed": "2026-11-25T02:00:00Z",
    "resolved": True, "resolved_at": None, "resolved_by": None, "replayed_at": None,
    "raw_size": None, "raw_truncated": False, "payload": None, "headers": {},
    "raw_base64": None,
}  # fmt: skip
STATS = {
    "at": "2026-11-25T02:00:00.5Z", "pending": 0, "pending_by_subject": [], "due": {"1m": 0},
    "lateness_ms": {"window_seconds": 300, "samples": 0, "p50": None, "p99": None},
    "dead_letters_unresolved": 0, "leader": {"instance": "a", "epoch": None, "since": None},
    "epoch": 0, "epoch_taken_by": None, "epoch_taken_at": None, "instance": {},
}  # fmt: skip
RUNNING = {**JOB, "name": "tick", "cron": "* * * * *", "paused": False, "failed": False}
RUNNING["last_fired_at"] = "2026-11-25T02:00:00.003812Z"
SCHEDULES = {"items": [JOB, RUNNING], "next_cursor": None, "problems": []}
ANSWERS: dict[str, Any] = {
    "/v1/stats": STATS,
    "/v1/schedules": SCHEDULES,
    "/v1/schedules/report": {**JOB, "next": [], "fires": [FIRE], "definition": {}},
    "/v1/delayed": {"items": [TASK], "next_cursor": None},
    "/v1/delayed/t1": TASK,
    f"/v1/dead-letters/{DEAD['id']}": DEAD,
    "/v1/dead-letters": {"items": [DEAD], "next_cursor": None},
    "/v1/leader": {
        "instance": "a", "epoch": None, "since": None, "partitions": 1,
        "map": [{"partition": 0, "owner": "a", "epoch": None, "since": None}],
        "engines": [{"instance": "a", "count": 1, "partitions": [0]}], "unowned": [],
        "map_readable": True,
    },
}  # fmt: skip
SHOW = ("schedules", "show", "report")
TEXT_VERBS = [
    (ops._status, ["status"]),
    (ops._schedules_list, ["schedules", "list"]),
    (ops._schedule_show, ["schedules", "show", "report"]),
    (ops._delayed_list, ["delayed", "list"]),
    (ops._delayed_show, ["delayed", "show", "t1"]),
    (ops._dlq_list, ["dlq", "list", "--state", "all"]),
    (ops._dlq_show, ["dlq", "show", DEAD["id"]]),
]


@pytest.mark.parametrize(("verb", "argv"), TEXT_VERBS, ids=lambda v: getattr(v, "__name__", ""))
def test_no_python_none_reaches_text_output(verb: Any, argv: list[str]) -> None:
    """With every nullable field null, no verb prints Python's `None`: a dash or words."""
    _, out, _ = run(verb, ANSWERS, *argv)
    assert "None" not in out, out


@pytest.mark.parametrize(("verb", "argv"), TEXT_VERBS, ids=lambda v: getattr(v, "__name__", ""))
def test_every_time_in_text_output_is_rfc3339_utc_with_milliseconds(
    verb: Any, argv: list[str]
) -> None:
    """Times print as 2026-11-25T02:00:00.000Z whatever precision the API sent (seconds, µs)."""
    _, out, _ = run(verb, ANSWERS, *argv)
    stamps = re.findall(r"\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d)?", out)
    assert stamps and all(TIME.fullmatch(s) for s in stamps), stamps


def test_schedule_show_says_never_fired_and_formats_times_and_lateness() -> None:
    """`schedules show` says `never fired` (with the cursor it counts from, if any) instead of
    `fired None`, `-` for a missing file, and lateness with one decimal, right-aligned."""
    _, out, _ = run(ops._schedule_show, ANSWERS, *SHOW)
    assert "last           never fired (occurrences after 2026-11-25T02:00:00.000Z)" in out
    assert "paused         by - at -" in out
    fires = out.splitlines()[-2:]
    assert fires[0].split()[:3] == ["SCHEDULED", "FOR", "FIRED"]
    assert "2026-11-25T02:00:00.003Z      3.8  no" in fires[1]
    never = {**ANSWERS["/v1/schedules/report"], "last_scheduled_for": None}
    _, out, _ = run(ops._schedule_show, {"/v1/schedules/report": never}, *SHOW)
    assert "\nlast           never fired\n" in out and "\ndefined at     -\n" in out
    placed = {**never, "file": "jobs.yaml", "line": None}
    _, out, _ = run(ops._schedule_show, {"/v1/schedules/report": placed}, *SHOW)
    assert "\ndefined at     jobs.yaml\n" in out
    fired = {**ANSWERS["/v1/schedules/report"], "last_fired_at": "2026-11-25T02:00:00.0035Z"}
    _, out, _ = run(ops._schedule_show, {"/v1/schedules/report": fired}, *SHOW)
    assert "\nlast           2026-11-25T02:00:00.000Z (fired 2026-11-25T02:00:00.003Z)\n" in out


def test_render_when_and_ms() -> None:
    """One time format (UTC, ms, Z) from any offset or precision; durations with one decimal."""
    assert render.when("2026-11-26T15:05:00.123456+01:00") == "2026-11-26T14:05:00.123Z"
    assert render.when(datetime(2026, 11, 26, 14, 5, tzinfo=UTC)) == "2026-11-26T14:05:00.000Z"
    assert render.when(None) == "-" and render.when("soon\x1b[2J") == "soon\\x1b[2J"
    assert render.ms(7341.04) == "7341.0 ms" and render.ms(0.7) == "0.7 ms"
    assert render.ms(None) == "-"


def test_table_right_aligns_numbers_and_escapes_control_characters() -> None:
    """Columns of numbers are right-aligned, others left; a cell cannot carry a terminal
    escape or a newline into the table."""
    lines = table([("a", 7, 3.25), ("bb\x1b[31m", 1200, None)], ["X", "N", "MS"]).splitlines()
    assert lines == [
        "X              N   MS",
        "a              7  3.2",
        "bb\\x1b[31m  1200    -",
    ]


# -- dead letters ------------------------------------------------------------------------------
def _dead(raw: bytes | None, **extra: Any) -> dict[str, Any]:
    encoded = base64.b64encode(raw).decode() if raw is not None else None
    return {**DEAD, "raw_base64": encoded, "raw_size": len(raw or b""), **extra}


def _show(dead: dict[str, Any]) -> str:
    answers = {f"/v1/dead-letters/{DEAD['id']}": dead}
    return str(run(ops._dlq_show, answers, "dlq", "show", DEAD["id"])[1])


def test_dlq_show_prints_headers_and_the_payload_as_received() -> None:
    """`dlq show` prints the headers and the payload's bytes as text (key order as published,
    not as the database re-ordered them)."""
    raw = b'{"z": 1, "a": "caf\xc3\xa9"}'
    out = _show(_dead(raw, headers={"Mq-Error": "bad envelope", "Nats-Msg-Id": "t1"}))
    assert "\nheaders:\n  Mq-Error: bad envelope\n  Nats-Msg-Id: t1\n" in out
    assert out.endswith('\npayload:\n  {"z": 1, "a": "café"}')
    assert "state          resolved" in out


def test_dlq_show_prints_binary_as_base64_and_escapes_terminal_controls() -> None:
    """Bytes that are not UTF-8 print as base64 with a note; text with escape sequences prints
    them escaped, so a payload cannot drive the operator's terminal."""
    binary = b"\xff\xfe\x00binary"
    out = _show(_dead(binary))
    assert f"  {base64.b64encode(binary).decode()}\n" in out
    assert "(not UTF-8: 9 bytes as base64)" in out
    out = _show(_dead(b"line1\n\x1b]0;owned\x07line2", headers={"X": "\x1b[2J"}))
    assert "  line1\n  \\x1b]0;owned\\x07line2" in out and "X: \\x1b[2J" in out
    assert "\x1b" not in out


def test_dlq_show_bounds_a_long_payload_and_says_so() -> None:
    """A payload longer than the bound prints its start and a note with both lengths; a stored
    prefix cut inside a UTF-8 character still prints as text, with a note that it was cut."""
    out = _show(_dead(b"x" * 10_000))
    assert "x" * render.PAYLOAD_SHOWN in out and "x" * (render.PAYLOAD_SHOWN + 1) not in out
    assert f"... ({render.PAYLOAD_SHOWN} of 10000 characters shown; --json has it all)" in out
    out = _show(_dead("é".encode() * 3 + b"\xc3", raw_truncated=True))
    assert "\n  ééé\n" in out and "MQ_DLQ stream holds it whole" in out


def test_dlq_list_shows_unresolved_ones_by_default_with_a_state_column() -> None:
    """`dlq list` asks the API for unresolved dead letters unless `--state`/`--resolved` says
    otherwise, and prints each one's state (replayed, resolved, unresolved)."""
    wanted = {"unresolved": False, "resolved": True, "all": None}
    for argv, state in (([], "unresolved"), (["--resolved"], "resolved"),
                        (["--state", "all"], "all"), (["--unresolved"], "unresolved")):  # fmt: skip
        api = FakeApi(ANSWERS)
        ops._dlq_list(api, args("dlq", "list", *argv))  # type: ignore[arg-type]
        assert api.calls[0][2] is not None and api.calls[0][2]["resolved"] is wanted[state]
    items = [
        {**DEAD, "resolved": False},
        {**DEAD, "replayed_at": "2026-11-25T03:00:00Z"},
        DEAD,
    ]
    listing = {"/v1/dead-letters": {"items": items, "next_cursor": None}}
    _, out, _ = run(ops._dlq_list, listing, "dlq", "list", "--state", "all")
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["ID", "STATE", "STAGE"]
    assert [r.split()[1] for r in rows[1:]] == ["unresolved", "replayed", "resolved"]
    empty: dict[str, Any] = {"/v1/dead-letters": {"items": [], "next_cursor": None}}
    _, out, _ = run(ops._dlq_list, empty, "dlq", "list")
    assert out == "no unresolved dead letters (--state all lists every one)"


# -- schedules ---------------------------------------------------------------------------------
def test_next_run_from_cron_and_zone_or_why_not() -> None:
    """The next run of a listed job comes from its cron in its zone, after its last handled
    occurrence; a paused, failed or removed job has none."""
    now = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    job = {**JOB, "paused": False, "failed": False, "last_scheduled_for": None}
    berlin = {**job, "cron": "30 2 * * *", "timezone": "Europe/Berlin"}
    assert render.next_run(berlin, now) == "2026-07-02T00:30:00.000Z"  # 02:30 CEST
    ahead = {**job, "cron": "0 * * * *", "last_scheduled_for": "2026-07-01T15:00:00Z"}
    assert render.next_run(ahead, now) == "2026-07-01T16:00:00.000Z"
    assert render.next_run({**job, "paused": True}, now) == "-"
    assert render.next_run({**job, "failed": True}, now) == "-"
    assert render.next_run({**job, "active": False}, now) == "-"


def test_schedules_list_has_state_and_next_run_columns() -> None:
    """`schedules list` prints each job's state and next run (a time, or `-` when it will not
    fire on its own)."""
    page = {"items": [RUNNING, JOB], "next_cursor": None, "problems": []}
    _, out, code = run(ops._schedules_list, {"/v1/schedules": page}, "schedules", "list")
    header, tick, report = out.splitlines()
    assert re.split(r"\s{2,}", header) == [
        "NAME", "CRON", "TZ", "SUBJECT", "STATE", "NEXT RUN", "LAST FIRED",
    ]  # fmt: skip
    assert TIME.search(tick) and " active " in tick and code == 0
    assert " failed  -  " in report
    _, out, _ = run(ops._schedules_list, {"/v1/schedules": {**page, "items": [
        {**JOB, "failed_reason": "too_large"}, {**RUNNING, "paused": True},
        {**RUNNING, "active": False}]}}, "schedules", "list")  # fmt: skip
    assert [re.split(r"\s{2,}", line)[4:6] for line in out.splitlines()[1:]] == [
        ["failed (too_large)", "-"], ["paused", "-"], ["removed", "-"],
    ]  # fmt: skip


def test_empty_lists_say_so() -> None:
    """A list with nothing in it says what is missing instead of printing a bare header."""
    empty: dict[str, Any] = {"items": [], "next_cursor": None, "problems": []}
    got = run(ops._schedules_list, {"/v1/schedules": empty}, "schedules", "list")[1]
    assert got == "no cron jobs loaded"
    got = run(ops._schedules_list, {"/v1/schedules": empty}, "schedules", "list", "--removed")[1]
    assert got == "no removed cron jobs"
    got = run(ops._delayed_list, {"/v1/delayed": empty}, "delayed", "list")[1]
    assert got == "no delayed tasks match"


def test_schedule_yaml_problems_show_in_schedules_list_and_fail_status() -> None:
    """The daemon's YAML errors print as `file:line: job: message` under `schedules list` and
    `status`; `status` then exits 1 (as `scheduler validate`), and its JSON carries them."""
    page = {**SCHEDULES, "problems": [PROBLEM, {**PROBLEM, "line": None, "job": None}]}
    answers = {**ANSWERS, "/v1/schedules": page}
    line = "  /etc/jobs/typo.yaml:7: job report: cron: bad"
    _, out, code = run(ops._schedules_list, answers, "schedules", "list")
    assert code == 0 and f"not loaded and do not fire:\n{line}\n" in out
    assert out.endswith("\n  /etc/jobs/typo.yaml: cron: bad")
    doc, out, code = run(ops._status, answers, "status")
    assert code == 1 and doc["problems"] == page["problems"]
    assert "schedule YAML  2 errors (below)" in out and line in out
    doc, out, code = run(
        ops._status, {**answers, "/v1/schedules": {**page, "problems": [PROBLEM]}}, "status"
    )
    assert code == 1 and "schedule YAML  1 error (below)" in out
    doc, out, code = run(ops._status, ANSWERS, "status")
    assert code == 0 and doc["problems"] == [] and "schedule YAML  ok" in out


# -- a closed stdout ---------------------------------------------------------------------------
class _Stub(BaseHTTPRequestHandler):
    """A management API that answers every GET with a long page of dead letters."""

    page = json.dumps(
        {
            "items": [{**DEAD, "id": f"{i:08d}-3f43-4a8e-9f0e-7d1b0c6f1a11"} for i in range(3000)],
            "next_cursor": None,
        }
    ).encode()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def stub_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.parametrize(
    "argv",
    [["dlq", "list", "--json", "--state", "all"], ["dlq", "list"], ["next", "--count", "5000"]],
    ids=" ".join,
)
def test_a_closed_stdout_ends_the_command_quietly(
    argv: list[str], stub_api: str, tmp_path: Path
) -> None:
    """`scheduler dlq list --json | head -1`: once the reader has gone the command stops with
    status 141 (128 + SIGPIPE, as a tool SIGPIPE stopped) and writes nothing to stderr."""
    (tmp_path / "jobs.yaml").write_text(
        'scheduled_jobs:\n  - {name: tick, subject: mq.scheduled.t, cron: "* * * * *"}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env |= {"SCHEDULER_API_URL": stub_api, "SCHEDULER_SCHEDULES_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline()  # the output is far larger than the pipe's 64 KiB buffer
    proc.stdout.close()  # as `head -1` exits
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err.decode()
    assert err == b""
