"""The command line: every verb has help; unfinished verbs say so and exit non-zero."""

from __future__ import annotations

import pytest

from scheduler.cli import OPEN_ISSUES, main

VERBS = ["run", "migrate", "validate", "next", "audit", "export-log"]
VERBS += ["status", "schedules", "delayed", "dlq"]  # the management API's CLI


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_has_help(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler VERB --help` prints usage and exits 0."""
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    assert f"usage: scheduler {verb}" in capsys.readouterr().out


@pytest.mark.parametrize("verb", sorted(OPEN_ISSUES))
def test_unfinished_verbs_say_so(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A verb whose issue is still open explains that and exits non-zero."""
    assert main([verb]) != 0
    assert "not implemented yet" in capsys.readouterr().err


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
