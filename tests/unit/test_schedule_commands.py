"""`scheduler validate` and `scheduler next`, called through their argparse handlers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scheduler.cli.cron_yaml import cmd_next, cmd_validate, configure_next, configure_validate

GOOD = """\
scheduled_jobs:
  - name: usage-report
    subject: mq.scheduled.report
    cron: "0 2 * * *"
  - name: ny-open
    subject: mq.scheduled.open
    cron: "30 9 * * mon-fri"
    timezone: America/New_York
    paused: true
"""
BAD = """\
scheduled_jobs:
  - name: broken
    subject: mq.scheduled.>
    cron: "0 2 * * *"
  - name: fine
    subject: mq.scheduled.fine
    cron: "@hourly"
"""


def run_validate(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    configure_validate(parser)
    return cmd_validate(parser.parse_args(argv))


def run_next(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    configure_next(parser)
    return cmd_next(parser.parse_args(argv))


@pytest.fixture
def good_dir(tmp_path: Path) -> Path:
    (tmp_path / "jobs.yaml").write_text(GOOD, encoding="utf-8")
    return tmp_path


@pytest.fixture
def bad_dir(tmp_path: Path) -> Path:
    (tmp_path / "bad.yaml").write_text(BAD, encoding="utf-8")
    return tmp_path


def test_validate_ok(good_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Valid files exit 0 with a one-line summary on stdout."""
    assert run_validate(str(good_dir)) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("2 jobs OK in 1 file\n", "")


def test_validate_errors(bad_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Errors go to stderr as `file:line: job: message` plus a summary, and exit 1."""
    assert run_validate(str(bad_dir)) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{bad_dir / 'bad.yaml'}:3: broken: subject: 'mq.scheduled.>' contains a wildcard; "
        "a job fires to one literal subject",
        "1 error in 1 file",
    ]


def test_validate_default_dir_from_environment(
    good_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without DIR, validate reads SCHEDULER_SCHEDULES_DIR."""
    monkeypatch.setenv("SCHEDULER_SCHEDULES_DIR", str(good_dir))
    assert run_validate() == 0
    assert capsys.readouterr().out == "2 jobs OK in 1 file\n"


def test_validate_default_dir_is_schedules(
    good_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without DIR or the variable, validate reads ./schedules."""
    monkeypatch.delenv("SCHEDULER_SCHEDULES_DIR", raising=False)
    monkeypatch.chdir(good_dir)
    (good_dir / "schedules").mkdir()
    (good_dir / "jobs.yaml").rename(good_dir / "schedules" / "jobs.yaml")
    assert run_validate() == 0
    assert capsys.readouterr().out == "2 jobs OK in 1 file\n"


def test_validate_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder that does not exist exits 2 with a message naming it."""
    assert run_validate(str(tmp_path / "nope")) == 2
    assert "nope' does not exist" in capsys.readouterr().err


def test_next_json(good_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json maps each job to its next occurrences as RFC 3339 UTC instants."""
    args = ("--after", "2026-11-20T12:00:00Z", "--count", "3", "--json")
    assert run_next(str(good_dir), *args) == 0
    assert json.loads(capsys.readouterr().out) == {
        "ny-open": ["2026-11-20T14:30:00Z", "2026-11-23T14:30:00Z", "2026-11-24T14:30:00Z"],
        "usage-report": ["2026-11-21T02:00:00Z", "2026-11-22T02:00:00Z", "2026-11-23T02:00:00Z"],
    }


def test_next_plain_shows_local_and_utc(good_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plain form lists each job with its local and UTC times and marks paused jobs."""
    assert run_next(str(good_dir), "--name", "ny-open", "--after", "2026-11-20T12:00Z") == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0] == "ny-open  30 9 * * mon-fri  (America/New_York) -> mq.scheduled.open  [paused]"
    )
    assert lines[1] == "  2026-11-20 09:30:00 EST (-0500)   2026-11-20T14:30:00.000Z"
    assert len(lines) == 6


def test_next_default_count_is_five(good_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --count, five occurrences are shown per job."""
    assert run_next(str(good_dir), "--json", "--after", "2026-11-20T12:00+01:00") == 0
    assert [len(v) for v in json.loads(capsys.readouterr().out).values()] == [5, 5]


def test_next_defaults_to_now(good_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --after, occurrences start from the current time."""
    assert run_next(str(good_dir), "--json", "--count", "1") == 0
    assert set(json.loads(capsys.readouterr().out)) == {"ny-open", "usage-report"}


def test_next_unknown_name(good_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --name exits 2 and lists the known names."""
    assert run_next(str(good_dir), "--name", "nope") == 2
    assert "no valid job named 'nope' (known: ny-open, usage-report)" in capsys.readouterr().err


def test_next_with_errors_still_previews(bad_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With errors in the files, next previews the valid jobs, reports the errors, and exits 1."""
    assert run_next(str(bad_dir), "--json", "--count", "1", "--after", "2026-01-01T00:00Z") == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"fine": ["2026-01-01T01:00:00Z"]}
    assert "broken: subject:" in err


@pytest.mark.parametrize(
    "argv",
    [["--after", "2026-11-20T12:00"], ["--after", "tomorrow"], ["--count", "0"]],
)
def test_next_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A naive or malformed --after, or a count below 1, is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        run_next(*argv)
    assert exited.value.code == 2
    assert "error: argument" in capsys.readouterr().err
