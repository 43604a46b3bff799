"""The shared options before the command (`scheduler --token x delayed list`), and the logging
the CLI sets up for the daemon's terminal."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from scheduler.cli.global_options import hoist
from scheduler.cli.main import _parser, configure_logging, main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--token", "x", "delayed", "list"], ["delayed", "list", "--token", "x"]),
        (["--json", "--url=http://h", "status"], ["status", "--json", "--url=http://h"]),
        (["--token", "x", "dlq", "replay", "a", "--", "-b"],
         ["dlq", "replay", "a", "--token", "x", "--", "-b"]),
        (["delayed", "list", "--token", "x"], ["delayed", "list", "--token", "x"]),
        (["--config", "c.yaml", "run", "--embedded"], ["run", "--embedded", "--config", "c.yaml"]),
        (["--version"], ["--version"]),
        (["--bogus", "status"], ["--bogus", "status"]),
        (["--token"], ["--token"]),  # no value: left for argparse to refuse
    ],
)  # fmt: skip
def test_hoist_moves_the_shared_options_that_precede_the_command(
    argv: list[str], expected: list[str]
) -> None:
    """Shared options before the command go after it (before a `--`); the rest stay put."""
    assert hoist(argv) == expected


def test_options_before_and_after_the_verb_mean_the_same() -> None:
    """`--token`, `--url` and `--json` parse the same written before or after the verb."""
    before = ["--token", "t", "--json", "--url", "http://h:1", "delayed", "list", "--limit", "5"]
    after = ["delayed", "list", "--limit", "5", "--token", "t", "--json", "--url", "http://h:1"]
    ours = vars(_parser().parse_args(hoist(before)))
    theirs = vars(_parser().parse_args(after))
    assert ours.pop("func").__qualname__ == theirs.pop("func").__qualname__
    assert ours == theirs
    assert (ours["token"], ours["json"], ours["url"]) == ("t", True, "http://h:1")


def test_a_global_token_reaches_the_verb(capsys: pytest.CaptureFixture[str]) -> None:
    """`scheduler --token x delayed list` runs the verb (here: no daemon, exit 3), not an
    argparse error about `x`."""
    assert main(["--token", "x", "delayed", "list", "--url", "http://127.0.0.1:1"]) == 3
    assert "cannot reach http://127.0.0.1:1" in capsys.readouterr().err


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root, httpx = logging.getLogger(), logging.getLogger("httpx")
    handlers, level, httpx_level = root.handlers[:], root.level, httpx.level
    yield
    root.handlers[:], root.level = handlers, level
    httpx.setLevel(httpx_level)


@pytest.mark.usefixtures("restored_logging")
def test_httpx_request_lines_stay_out_of_the_daemons_terminal() -> None:
    """The CLI's logging drops httpx's per-request INFO lines (the console's API calls) and
    keeps its warnings, as it does for nats-py's and uvicorn's."""
    configure_logging("INFO")
    httpx = logging.getLogger("httpx")
    assert not httpx.isEnabledFor(logging.INFO) and httpx.isEnabledFor(logging.WARNING)
    assert logging.getLogger("scheduler").isEnabledFor(logging.INFO)
