"""The command line: every verb has help; errors are one line with the right exit status."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import pytest

from scheduler import __version__
from scheduler.cli import ops
from scheduler.cli.main import main

VERBS = ["run", "migrate", "validate", "next", "audit", "export-log"]
VERBS += ["status", "schedules", "delayed", "dlq"]  # the management API's CLI


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler VERB --help` prints usage and exits 0."""
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    assert f"usage: scheduler {verb}" in capsys.readouterr().out


def test_no_verb_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a verb the command prints its help and exits 2."""
    assert main([]) == 2
    assert "commands" in capsys.readouterr().out


def test_run_without_urls_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    """`scheduler run` with no NATS URL and no --embedded fails naming SCHEDULER_NATS_URL."""
    monkeypatch.delenv("SCHEDULER_NATS_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_HTTP_PORT", "0")
    monkeypatch.setenv("SCHEDULER_METRICS_PORT", "0")
    assert main(["run"]) == 2
    assert "SCHEDULER_NATS_URL: not set" in capsys.readouterr().err


def test_bad_setting_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong value makes the command exit 2 with the variable named, no traceback."""
    monkeypatch.setenv("SCHEDULER_LEASE_TTL", "zero")
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert "SCHEDULER_LEASE_TTL" in err and "Traceback" not in err


def test_top_level_help_is_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler --help` says what the tool is, lists the verbs and where to read more."""
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "cron-style scheduler and delayed-delivery timer" in out
    for verb in ("run", "migrate", "validate", "next"):
        assert f"    {verb} " in out
    assert "scheduler run --embedded" in out and "docs/" in out and "README" in out
    assert "configures logging" not in out  # the module docstring is for developers


def test_audit_verbs_do_not_import_pyspark() -> None:
    """Building the command line and importing the daemon leave PySpark unimported: only the
    audit itself loads it."""
    import subprocess
    import sys

    code = (
        "import sys, scheduler.cli.main as c, scheduler.daemon.lifecycle, scheduler.audit.cli; "
        "c._parser(); "
        "sys.exit(1 if any(m.split('.')[0] in ('pyspark', 'py4j') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


class _Api:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def call(self, method: str, path: str) -> dict[str, Any]:
        return self.doc


def test_schedule_show_prints_a_failed_jobs_reason_and_error() -> None:
    """`scheduler schedules show` prints a stopped job's reason, time and error (naming the
    field), and `no` for a job that is not failed."""
    doc = {
        "name": "big", "cron": "* * * * *", "timezone": "UTC", "subject": "mq.scheduled.big",
        "file": "jobs.yaml", "line": 2, "paused": False, "last_scheduled_for": None,
        "last_fired_at": None, "next": [], "fires": [], "failed": True,
        "failed_reason": "too_large", "failed_at": "2026-11-25T15:00:00Z",
        "failed_error": "data: envelope of 2000000 bytes (...) does not fit",
    }  # fmt: skip
    args = argparse.Namespace(name="big")
    _, text, code = ops._schedule_show(_Api(doc), args)  # type: ignore[arg-type]
    assert code == 0
    assert "failed         too_large at 2026-11-25T15:00:00.000Z: data: envelope of 2000000" in text
    _, text, _ = ops._schedule_show(_Api({**doc, "failed": False}), args)  # type: ignore[arg-type]
    assert "\nfailed         no\n" in text


def test_the_command_leaves_its_objects_to_the_end_of_the_process() -> None:
    """`python -m scheduler` freezes what it made before the interpreter's teardown (whose
    last collection over every imported module took 0.9 s after the daemon had stopped),
    also when argparse leaves by SystemExit (--version)."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['scheduler', '--version']\n"
        "import runpy\n"
        "runpy.run_module('scheduler', run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"mq-scheduler {__version__}", "frozen True"]
