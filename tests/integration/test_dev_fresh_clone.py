"""The README's path for a newcomer, from a fresh clone with nothing set by hand: `scripts/dev`,
then the CLI adds, lists and cancels a delayed task, and Ctrl-C leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.docs_blocks import ROOT

pytestmark = pytest.mark.slow

READY_WITHIN = 300  # a fresh .venv: pip install -e '.[embedded]' (warm cache), then the start
STEP_TIMEOUT = 30


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """`git clone` of this repository's HEAD into a temp dir."""
    target = tmp_path / "mq-scheduler"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(target)],
        check=True,
        timeout=120,
    )
    return target


def user_env() -> dict[str, str]:
    """The caller's environment without any SCHEDULER_* or NATS_URL: nothing set by hand."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SCHEDULER_") and k not in ("NATS_URL", "VIRTUAL_ENV")
    }


@pytest.fixture
def dev(clone: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`scripts/dev` in the clone, in a session of its own as in a terminal; the API and
    metrics on free ports (the defaults may be taken on a shared machine), the embedded
    servers on free ports as always, the data dir in the clone."""
    env = {**user_env(), "SCHEDULER_HTTP_PORT": "0", "SCHEDULER_METRICS_PORT": "0"}
    with open(clone / "dev.out", "wb") as out, open(clone / "dev.err", "wb") as err:
        proc = subprocess.Popen(
            [str(clone / "scripts" / "dev")],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        stop_everything(proc, clone)


def stop_everything(proc: subprocess.Popen[bytes], clone: Path) -> None:
    """After a failure: Ctrl-C (the daemon stops its servers), then end whatever of ours is
    left (the servers run in sessions of their own, out of reach of the group's signals)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    for pid in left_running_pids(clone):
        with contextlib.suppress(psutil.Error):
            leftover = psutil.Process(pid)
            leftover.send_signal(signal.SIGINT)  # postgres: fast shutdown; nats-server: exit
            leftover.wait(30)


def wait_for_banner(proc: subprocess.Popen[bytes], clone: Path) -> str:
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        out = (clone / "dev.out").read_text(errors="replace")
        if "Press Ctrl-C to stop." in out:
            return out
        assert proc.poll() is None, transcript(clone)
        time.sleep(0.2)
    raise AssertionError(f"no banner within {READY_WITHIN}s\n{transcript(clone)}")


def transcript(clone: Path) -> str:
    out = (clone / "dev.out").read_text(errors="replace")
    err = (clone / "dev.err").read_text(errors="replace")
    return f"--- stdout\n{out}\n--- stderr (last 60 lines)\n" + "\n".join(err.splitlines()[-60:])


def cli(clone: Path, *args: str) -> str:
    """`.venv/bin/scheduler ARGS` run from the clone, as the user's second shell would."""
    done = subprocess.run(
        [str(clone / ".venv" / "bin" / "scheduler"), *args],
        cwd=clone,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"scheduler {' '.join(args)}: {done.returncode}\n{done.stderr}"
    return done.stdout


def status_of(listing: str, task_id: str) -> str:
    row = next(line for line in listing.splitlines() if line.startswith(task_id + " "))
    return row.split()[2]  # ID TARGET STATUS ...


def left_running(clone: Path) -> list[str]:
    """Processes whose command line names the clone (daemon, nats-server, PostgreSQL)."""
    return [f"{pid}: {cmdline}" for pid, cmdline in _naming(clone)]


def left_running_pids(clone: Path) -> list[int]:
    return [pid for pid, _ in _naming(clone)]


def _naming(clone: Path) -> list[tuple[int, str]]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(clone) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append((proc.info["pid"], cmdline))
    return found


def test_fresh_clone_dev_mode_add_list_cancel_and_ctrl_c(
    clone: Path, dev: subprocess.Popen[bytes]
) -> None:
    """From a fresh clone: scripts/dev installs (saying so) and starts; the CLI, given nothing,
    finds the daemon and its token, adds a task due in an hour, lists it, cancels it, lists it
    cancelled; Ctrl-C stops the daemon and both servers."""
    started = time.monotonic()
    banner = wait_for_banner(dev, clone)
    ready_after = time.monotonic() - started
    err = (clone / "dev.err").read_text()
    assert "scripts/dev: installing mq-scheduler[embedded] into .venv" in err
    assert "console     http://127.0.0.1:" in banner and "/ui/" in banner
    assert re.search(r"export PATH=\S+ SCHEDULER_API_URL=\S+ SCHEDULER_ADMIN_TOKEN=\S+", banner)
    access = json.loads((clone / ".scheduler-data" / "api.json").read_text())
    assert access["url"] in banner and access["admin_token"] in banner

    added = cli(
        clone, "delayed", "add", "--subject", "mq.tasks.demo", "--in", "1h", "--data", '{"x":1}'
    )
    found = re.match(r"scheduled (\S+) to mq\.tasks\.demo due \S+", added.strip())
    assert found is not None, added
    task_id = found.group(1)
    listing = cli(clone, "delayed", "list")
    assert status_of(listing, task_id) == "pending", listing
    assert cli(clone, "delayed", "cancel", task_id).strip() == f"{task_id}: cancelled"
    listing = cli(clone, "delayed", "list")
    assert status_of(listing, task_id) == "cancelled", listing

    os.killpg(dev.pid, signal.SIGINT)  # Ctrl-C in the terminal
    assert dev.wait(60) == 0, transcript(clone)
    deadline = time.monotonic() + 10
    while left_running(clone) and time.monotonic() < deadline:
        time.sleep(0.1)  # pg_ctl's postmaster exits moments after its stop returns
    assert left_running(clone) == []
    print(
        f"fresh clone: ready after {ready_after:.1f}s, whole test {time.monotonic() - started:.1f}s"
    )
