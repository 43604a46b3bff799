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
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.docs_blocks import ROOT

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


class DevRun:
    """One `scripts/dev` in the clone, its output in `<name>.out` / `<name>.err` there."""

    def __init__(self, clone: Path, name: str) -> None:
        self.clone, self.name = clone, name
        # In a session of its own as in a terminal; the API and metrics on free ports (the
        # defaults may be taken on a shared machine); the embedded servers always pick free
        # ports; the data dir is the clone's .scheduler-data.
        env = {**user_env(), "SCHEDULER_HTTP_PORT": "0", "SCHEDULER_METRICS_PORT": "0"}
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [str(clone / "scripts" / "dev")],
                cwd=clone,
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        self.started = time.monotonic()

    @property
    def out_path(self) -> Path:
        return self.clone / f"{self.name}.out"

    @property
    def err_path(self) -> Path:
        return self.clone / f"{self.name}.err"

    def banner(self, within: float) -> str:
        """The banner, once printed (the daemon is ready then); fails after `within` s."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            out = self.out_path.read_text(errors="replace")
            if "Press Ctrl-C to stop." in out:
                return out
            assert self.proc.poll() is None, self.transcript()
            time.sleep(0.2)
        raise AssertionError(f"no banner within {within}s\n{self.transcript()}")

    def transcript(self) -> str:
        out = self.out_path.read_text(errors="replace")
        err = self.err_path.read_text(errors="replace").splitlines()
        return f"--- stdout\n{out}\n--- stderr (last 60 lines)\n" + "\n".join(err[-60:])

    def ctrl_c(self) -> None:
        """Ctrl-C in the terminal: exit 0, and no process of the clone's left."""
        os.killpg(self.proc.pid, signal.SIGINT)
        assert self.proc.wait(60) == 0, self.transcript()
        deadline = time.monotonic() + 10
        while left_running(self.clone) and time.monotonic() < deadline:
            time.sleep(0.1)  # pg_ctl's postmaster exits moments after its stop returns
        assert left_running(self.clone) == []


@pytest.fixture
def dev(clone: Path) -> Iterator[Callable[[str], DevRun]]:
    """Starts `scripts/dev` runs in the clone; whatever is left running is stopped at the end."""
    runs: list[DevRun] = []

    def start(name: str) -> DevRun:
        runs.append(DevRun(clone, name))
        return runs[-1]

    try:
        yield start
    finally:
        for run in runs:
            stop_everything(run.proc, clone)


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
    clone: Path, dev: Callable[[str], DevRun]
) -> None:
    """From a fresh clone: scripts/dev installs (saying so) and starts; Ctrl-C leaves nothing;
    the second start skips the install; the CLI, given nothing, finds the daemon and its token,
    adds a task due in an hour, lists it, cancels it, lists it cancelled; Ctrl-C again."""
    first = dev("first")
    banner = first.banner(within=READY_WITHIN)
    first_ready = time.monotonic() - first.started
    assert "scripts/dev: installing mq-scheduler[embedded] into .venv" in first.err_path.read_text()
    assert "console     http://127.0.0.1:" in banner and "/ui/" in banner
    assert re.search(r"export PATH=\S+ SCHEDULER_API_URL=\S+ SCHEDULER_ADMIN_TOKEN=\S+", banner)
    first.ctrl_c()

    second = dev("second")
    banner = second.banner(within=60)
    second_ready = time.monotonic() - second.started
    said = [line for line in second.err_path.read_text().splitlines() if "scripts/dev:" in line]
    assert said and not [line for line in said if "install" in line or "updating" in line], said
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
    second.ctrl_c()
    print(f"fresh clone: first start ready in {first_ready:.1f}s, second in {second_ready:.1f}s")
