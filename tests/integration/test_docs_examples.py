"""Every example in README.md and docs/ works as written: each page's code blocks run in
order, in a scratch directory holding a copy of `schedules/`, against a daemon started as
`scripts/dev` starts it, with the variables of its banner's `export` line set (NATS_URL,
SCHEDULER_API_URL, SCHEDULER_ADMIN_TOKEN) and `scheduler` on PATH."""

from __future__ import annotations

import doctest
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from scheduler.cron.jobs import load_dir
from scheduler.messages.envelope import parse_envelope
from tests.support.docs_blocks import ROOT, Block, blocks, console_steps, pages
from tests.support.processes import cli_env, scheduler

pytestmark = pytest.mark.slow

BLOCK_TIMEOUT = 60
STEP_END = "__docs_step_end__"

# The test environment has no natscli; this stands in for its `pub` and `req`, so the
# subjects, headers and bodies of the docs' `nats` examples meet the daemon (natscli's own
# flags are not checked).
NATS_SHIM = """\
import argparse, asyncio, os, sys
import nats

def parse(argv):
    parser = argparse.ArgumentParser(prog="nats")
    parser.add_argument("-s", "--server", default=os.environ.get("NATS_URL"))
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb in ("pub", "req"):
        cmd = verbs.add_parser(verb)
        cmd.add_argument("subject")
        cmd.add_argument("body", nargs="?", default="")
        cmd.add_argument("-H", "--header", action="append", default=[])
        cmd.add_argument("--jetstream", action="store_true")
        cmd.add_argument("--raw", action="store_true")
    return parser.parse_args(argv)

async def main(args):
    nc = await nats.connect(args.server)
    headers = dict(h.split(":", 1) for h in args.header) or None
    body = args.body.encode()
    if args.verb == "pub" and args.jetstream:
        ack = await nc.jetstream().publish(args.subject, body, headers=headers)
        print(f'Published {len(body)} bytes to "{args.subject}": {ack.stream} #{ack.seq}')
    elif args.verb == "pub":
        await nc.publish(args.subject, body, headers=headers)
        print(f'Published {len(body)} bytes to "{args.subject}"')
    else:  # as with --raw: the reply's body only
        reply = await nc.request(args.subject, body, timeout=5, headers=headers)
        print(reply.data.decode())
    await nc.close()

asyncio.run(main(parse(sys.argv[1:])))
"""


@pytest.fixture(scope="module")
def dev_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`scheduler run --embedded` with the repo's schedules, as scripts/dev runs it; yields the
    variables its banner tells the user to export (PATH aside: `_env` sets it)."""
    workdir = tmp_path_factory.mktemp("dev")
    env = cli_env(workdir, SCHEDULER_SCHEDULES_DIR=str(ROOT / "schedules"))
    with scheduler(["run", "--embedded"], env, cwd=workdir) as proc:
        line = proc.wait_for(r"^  export ", within=60, stream="out")
        exported = dict(re.findall(r"(\w+)=(\S+)", line))
        exported.pop("PATH", None)
        assert {"NATS_URL", "SCHEDULER_API_URL", "SCHEDULER_ADMIN_TOKEN"} <= set(exported), line
        yield exported
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(within=30) == 0, proc.transcript()


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_work_as_written(
    page: Path, dev_daemon: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every block of the page runs and does what the page says (skip-marked blocks aside)."""
    shutil.copytree(ROOT / "schedules", tmp_path / "schedules")
    env = _env(dev_daemon, tmp_path)
    monkeypatch.chdir(tmp_path)
    for block in blocks(page):
        if block.marker in ("skip", "region") or block.lang == "text":
            continue
        if block.marker == "file":
            (tmp_path / block.argument).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / block.argument).write_text(block.text)
            continue
        RUNNERS[block.lang](block, env, tmp_path)


def _env(daemon: dict[str, str], scratch: Path) -> dict[str, str]:
    shim_dir = scratch / ".bin"
    shim_dir.mkdir()
    shim = shim_dir / "nats"
    shim.write_text(f"#!{sys.executable}\n{NATS_SHIM}")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    path = os.pathsep.join([str(shim_dir), str(Path(sys.executable).parent), env["PATH"]])
    return {**env, **daemon, "PATH": path, "PYTHONUNBUFFERED": "1"}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )


def _succeeds(args: list[str], block: Block, env: dict[str, str], cwd: Path) -> None:
    done = _run(args, env, cwd)
    assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stdout}"


def run_shell(block: Block, env: dict[str, str], cwd: Path) -> None:
    _succeeds(["bash", "-euo", "pipefail", "-c", block.text], block, env, cwd)


def run_console(block: Block, env: dict[str, str], cwd: Path) -> None:
    """The `$ ` lines run in one bash session, in order; each one's output must match the
    lines under it, where `...` stands for any text."""
    steps = console_steps(block.text)
    script = "".join(f"{command}\nprintf '\\n%s\\n' {STEP_END}\n" for command, _ in steps)
    outputs = _run(["bash", "-c", script], env, cwd).stdout.split(f"\n{STEP_END}\n")
    for (command, expected), got in zip(steps, outputs, strict=False):
        got = "\n".join(line.rstrip() for line in got.strip("\n").splitlines())
        pattern = ".*".join(re.escape(part) for part in expected.split("..."))
        assert re.fullmatch(pattern, got, re.DOTALL), (
            f"{block.where}: `{command}` printed\n{got}\nnot\n{expected}"
        )
    assert len(outputs) == len(steps) + 1, f"{block.where}: stopped early\n{outputs}"


def run_python(block: Block, env: dict[str, str], cwd: Path) -> None:
    script = cwd / f"example_{block.line}.py"
    script.write_text(block.text)
    _succeeds([sys.executable, str(script)], block, env, cwd)


def run_pycon(block: Block, env: dict[str, str], cwd: Path) -> None:
    test = doctest.DocTestParser().get_doctest(block.text, {}, block.where, str(block.page), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out: list[str] = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, f"{block.where}:\n" + "".join(out)


def run_json(block: Block, env: dict[str, str], cwd: Path) -> None:
    doc = json.loads(block.text)
    if isinstance(doc, dict) and doc.get("schema") == "hanzo.mq.v1":
        when = datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00"))
        parse_envelope(block.text.encode(), when)  # an envelope example is a valid envelope


def run_yaml(block: Block, env: dict[str, str], cwd: Path) -> None:
    folder = cwd / f"jobs_{block.line}"
    folder.mkdir()
    (folder / "jobs.yaml").write_text(block.text)
    found = load_dir(folder)
    assert not found.errors, f"{block.where}: {found.errors}"


RUNNERS = {
    "sh": run_shell,
    "bash": run_shell,
    "console": run_console,
    "python": run_python,
    "pycon": run_pycon,
    "json": run_json,
    "yaml": run_yaml,
}
