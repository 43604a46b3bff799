"""The console's pure parts: signed sessions, audit folder confinement, heartbeats as listed,
how values are shown, where a sign-in may send the browser."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler.console.console import safe_next
from scheduler.console.display import ago, in_zone, ms, seg, when
from scheduler.console.session import Signer
from scheduler.leadership.heartbeat import STALE_AFTER
from scheduler.operations.audits import AuditReports, AuditUnreadableError
from scheduler.operations.instances import instance_record
from scheduler.operations.records import AuditRuns
from scheduler.settings import Settings

NOW = 1_800_000_000.0


def signer(**tokens: object) -> Signer:
    values = {"admin_token": "admin-token", "read_token": "read-token", **tokens}
    return Signer(Settings(**values, ui_session_ttl="1h"))  # type: ignore[arg-type]


def test_a_session_round_trips_and_keeps_no_token() -> None:
    """A signed session reads back as signed in with its kind and form token; the cookie
    carries neither token."""
    made, cookie = signer().new_session("read", NOW)
    assert signer().session(cookie, NOW + 10) == made
    assert "admin-token" not in cookie and "read-token" not in cookie


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"admin_token": "rotated"}, "the admin token changed"),
        ({"read_token": "rotated"}, "the read token changed"),
        ({"read_token": None}, "the read token was removed"),
    ],
)
def test_a_token_change_ends_every_session(change: dict[str, Any], why: str) -> None:
    """Sessions signed under the old tokens are refused once any token changes."""
    _, cookie = signer().new_session("admin", NOW)
    assert signer(**change).session(cookie, NOW) is None, why


def test_an_altered_expired_or_foreign_cookie_is_refused() -> None:
    """Changing any byte, outliving SCHEDULER_UI_SESSION_TTL, a cookie from the future, a flash
    cookie offered as a session, or garbage: none signs anyone in."""
    s = signer()
    _, cookie = s.new_session("read", NOW)
    body, mac = cookie.split(".")
    swapped = body[:-1] + ("A" if body[-1] != "A" else "B")
    assert s.session(f"{swapped}.{mac}", NOW) is None
    assert s.session(cookie, NOW + 3600) is None
    assert s.session(cookie, NOW - 5) is None
    assert s.session(s.flash("ok", "hi"), NOW) is None
    assert s.session("not.a-cookie", NOW) is None and s.session(None, NOW) is None


def test_flash_messages_round_trip_bounded() -> None:
    """A flash message reads back once signed, cut to a cookie's size."""
    s = signer()
    flash = s.read_flash(s.flash("error", "x" * 5000))
    assert flash is not None and flash.kind == "error" and len(flash.message) == 700


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/schedules?cursor=abc", "/ui/schedules?cursor=abc"),
        ("//evil.example/ui/", "/ui/"),
        ("https://evil.example/ui/", "/ui/"),
        ("/ui\\..\\x", "/ui/"),
        ("/docs", "/ui/"),
        ("", "/ui/"),
    ],
)
def test_sign_in_only_sends_the_browser_to_console_pages(target: str, expected: str) -> None:
    """`next` after signing in is a console path, never another site."""
    assert safe_next(target) == expected


def write_run(root: Path, name: str, summary: object = None, report: bool = True) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary or {"date": name}))
    if report:
        (run / "report.html").write_text("<p>report</p>")
    return run


def test_audit_runs_are_listed_newest_day_first(tmp_path: Path) -> None:
    """Runs are folders with a summary.json, newest day first; a folder named otherwise takes
    the day it was written; folders without a summary and odd names are not runs."""
    write_run(tmp_path, "2026-11-20")
    write_run(tmp_path, "2026-11-22", report=False)
    manual = write_run(tmp_path, "manual") / "summary.json"
    written = datetime(2026, 11, 21, 12, tzinfo=UTC).timestamp()
    os.utime(manual, (written, written))
    (tmp_path / "2026-11-23").mkdir()  # still running: no summary yet
    write_run(tmp_path, ".hidden")
    listing = AuditReports(tmp_path).listing(10)
    assert listing.configured and listing.problem is None
    runs = [(r.run, r.day, r.has_report) for r in listing.items]
    assert runs == [
        ("2026-11-22", "2026-11-22", False),
        ("manual", "2026-11-21", True),
        ("2026-11-20", "2026-11-20", True),
    ]
    assert [r.run for r in AuditReports(tmp_path).listing(2).items] == runs_first_two(runs)
    assert AuditReports(None).listing(10) == AuditRuns(configured=False, problem=None, items=[])
    assert "not a readable folder" in str(AuditReports(tmp_path / "no").listing(10).problem)


def runs_first_two(runs: list[tuple[str, str, bool]]) -> list[str]:
    return [run for run, _, _ in runs[:2]]


def test_audit_files_never_come_from_outside_the_folder(tmp_path: Path) -> None:
    """Names with a path in them, parents, and links pointing out of the folder are no runs;
    a summary that is not JSON is reported as unreadable."""
    root = tmp_path / "audit"
    write_run(root, "2026-11-21", {"date": "2026-11-21", "slo": {"ok": True}})
    outside = write_run(tmp_path, "secret")
    os.symlink(outside, root / "linked")
    os.symlink(outside / "report.html", root / "2026-11-21" / "other.html")
    reports = AuditReports(root)
    assert reports.summary("2026-11-21") == {"date": "2026-11-21", "slo": {"ok": True}}
    assert reports.report("2026-11-21") == b"<p>report</p>"
    for name in ("linked", "..", "../secret", "2026-11-21/../../secret", "/etc", ""):
        assert reports.summary(name) is None and reports.report(name) is None, name
    assert [r.run for r in reports.listing(10).items] == ["2026-11-21"]
    (root / "2026-11-21" / "summary.json").write_text("{not json")
    with pytest.raises(AuditUnreadableError, match="not JSON"):
        reports.summary("2026-11-21")


def test_heartbeats_list_role_since_and_staleness() -> None:
    """A heartbeat lists its instance, role, epoch and since when; one silent for 15 s is
    stale, one silent for an hour is left out, and what is not a heartbeat is ignored."""
    now = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    beat = {"instance": "a", "role": "leader", "epoch": 3, "since": "2026-11-25T09:00:00Z"}
    seen = json.dumps({**beat, "at": "2026-11-25T09:59:58Z"}).encode()
    fresh = instance_record("a", seen, now, STALE_AFTER)
    assert fresh is not None and fresh.role == "leader" and fresh.epoch == 3
    assert fresh.since == datetime(2026, 11, 25, 9, tzinfo=UTC) and not fresh.stale
    old = json.dumps({"role": "standby", "epoch": None, "at": "2026-11-25T09:59:30Z"}).encode()
    stale = instance_record("b", old, now, STALE_AFTER)
    assert stale is not None and stale.stale and stale.instance == "b"
    assert stale.since is None
    gone = json.dumps({**beat, "at": "2026-11-25T08:59:00Z"}).encode()
    assert instance_record("a", gone, now, STALE_AFTER) is None
    assert instance_record("c", b"not json", now, STALE_AFTER) is None
    naive = b'{"at": "2026-11-25T09:59:58"}'
    assert instance_record("c", naive, now, STALE_AFTER) is None  # naive time


def test_values_show_in_utc_in_the_jobs_zone_and_as_ages() -> None:
    """Instants show in UTC and on a zone's wall clock (DST included), ages both ways,
    milliseconds rounded, unreadable values as they came, ids quoted for a URL."""
    at = "2026-07-01T00:30:00.250Z"
    assert when(at) == "2026-07-01 00:30:00.250 UTC"
    assert in_zone(at, "Europe/Berlin") == "2026-07-01 02:30:00 CEST"
    assert in_zone("2026-12-01T00:30:00Z", "Europe/Berlin") == "2026-12-01 01:30:00 CET"
    now = datetime(2026, 7, 1, 0, 30, tzinfo=UTC)
    assert ago(now - timedelta(seconds=12), now) == "12 s ago"
    assert ago(now + timedelta(minutes=3), now) == "in 3 min"
    assert ago(now - timedelta(hours=2), now) == "2 h ago"
    assert (ms(2.345), ms(1204.4), ms(None)) == ("2.3 ms", "1,204 ms", "—")
    assert when("yesterday") == "yesterday" and when(None) == "—"
    assert seg("a/b?c#d e") == "a%2Fb%3Fc%23d%20e"
