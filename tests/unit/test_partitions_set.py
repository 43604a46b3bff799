"""`scheduler partitions set`: its arguments, its words, and the signs of a running engine in
words (the move itself: tests/integration/test_repartition.py)."""

from __future__ import annotations

import argparse

import pytest

from scheduler.cli.main import main
from scheduler.cli.partitions import count_arg, summary
from scheduler.leadership.liveness import describe
from scheduler.store.postgres.repartition import Repartition, TableMove


def test_the_command_has_help_naming_the_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler partitions set --help` prints its usage, the refusal and the steps."""
    with pytest.raises(SystemExit) as info:
        main(["partitions", "set", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "usage: scheduler partitions set" in out
    for option in ("--count N", "--dry-run", "--force", "--config"):
        assert option in out
    assert "stop every engine" in out and "SCHEDULER_PARTITIONS=N" in out


@pytest.mark.parametrize(
    "argv", [["partitions"], ["partitions", "set"], ["partitions", "set", "--count", "0"]]
)
def test_a_missing_verb_or_count_exits_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No verb, no count or a count out of range: argparse's usage error, status 2."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: scheduler partitions" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0", "-1", "4097", "eight", "2.5"])
def test_counts_outside_1_to_4096_are_refused(text: str) -> None:
    """The count's bound is SCHEDULER_PARTITIONS' own."""
    with pytest.raises(argparse.ArgumentTypeError):
        count_arg(text)


def test_counts_inside_the_bound_pass() -> None:
    """1, 64 and 4096 are counts."""
    assert [count_arg(t) for t in ("1", "64", "4096")] == [1, 64, 4096]


def test_without_a_nats_url_the_command_names_it_and_force(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The liveness check needs NATS: without SCHEDULER_NATS_URL the command exits 2 naming
    it and `--force`, before it connects to anything."""
    monkeypatch.delenv("SCHEDULER_NATS_URL", raising=False)
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
    assert main(["partitions", "set", "--count", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SCHEDULER_NATS_URL: not set" in err[0] and "--force" in err[0]


def test_no_sign_is_none_and_each_sign_is_named() -> None:
    """No key and no fresh heartbeat: None; each kind of sign in words, joined, the
    partitions as runs and the instances sorted."""
    assert describe(False, [], []) is None
    assert describe(True, [], []) == "lease key leader held"
    assert describe(False, [0, 1, 2, 3, 7], ["b", "a"]) == (
        "lease keys of partitions 0-3, 7 held; heartbeats of a, b within 15 s"
    )


def _result(needed: bool, dry_run: bool, engines: str | None = None) -> Repartition:
    tables = (TableMove("delayed_messages", 900, 1000, 0.5), TableMove("schedules", 3, 4, 0.0))
    return Repartition(8, 64, tables, 8, 41, needed, dry_run, engines)


def test_the_summary_says_what_was_written_or_would_be() -> None:
    """A move: the offices (count and new epoch above the old highest), the time, the rate
    (over the statements' own time) and the setting to start with; a dry run: that nothing
    was written, and the engines that look alive; a count in place: nothing to do."""
    assert summary(_result(True, False), 2.0) == [
        "partition_offices: 8 -> 64 rows, each at epoch 42 (the old rows' highest: 41)",
        "partition count 8 -> 64 in 2.00 s (903 rows moved, 1,806 rows/s): start the engines "
        "with SCHEDULER_PARTITIONS=64",
    ]
    assert summary(_result(True, True), 2.0)[-1] == (
        "dry run: nothing written (partition count 8 -> 64)"
    )
    assert summary(_result(True, True, "lease key leader held"), 2.0)[-1] == (
        "engines look alive (lease key leader held): stop every engine before the run"
    )
    assert summary(_result(False, False), 0.1) == [
        "partition count 64 already, every row in place: nothing to do"
    ]
