"""`scheduler run --embedded` as a user runs it: a real process, real servers, Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest

from tests.support.processes import cli_env, scheduler

DEFAULT_PORTS = (8055, 9090)


def ready(api: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"{api}/readyz", timeout=1) as resp:
            return dict(json.loads(resp.read()))
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.fixture
def default_ports_taken() -> Iterator[set[int]]:
    """Hold 8055 and 9090 where they are free (where they are not, someone else holds them);
    yields the ports this test holds."""
    held: set[int] = set()
    with ExitStack() as stack:
        for port in DEFAULT_PORTS:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen(1)
                held.add(port)
            except OSError:
                pass
        yield held


def assert_cli_finds_the_moved_api(env: dict[str, str]) -> None:
    """The operator CLI, given no URL or token, reaches the daemon on the port it moved to
    (from DATA_DIR/api.json), not whatever holds 8055, and writes with the dev admin token
    (a cancel of an unknown id is a 404, not a 403)."""
    for args, code, text in ((["status"], 0, "leader"), (["delayed", "cancel", "x"], 1, "404:")):
        done = subprocess.run(
            [sys.executable, "-m", "scheduler", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == code and text in done.stdout + done.stderr, done


@pytest.mark.slow
def test_run_embedded_with_default_ports_taken_prints_urls_and_ctrl_c_leaves_nothing(
    tmp_path: Path, default_ports_taken: set[int]
) -> None:
    """With 8055 and 9090 taken, `run --embedded` listens on free ports and prints the NATS
    URL, API and metrics a producer needs, and the CLI finds the moved API by itself; the
    second start on the same data dir keeps the NATS port; Ctrl-C stops every process and a
    normal shutdown logs no warning."""
    env = cli_env(tmp_path, SCHEDULER_HTTP_PORT=None, SCHEDULER_METRICS_PORT=None)
    nats_urls = []
    for _ in range(2):  # the second start reuses the data dir
        with scheduler(["run", "--embedded", "--data-dir", str(tmp_path / "data")], env) as proc:
            exports = proc.wait_for(r"^  export ", within=30, stream="out")
            found = re.search(
                r"SCHEDULER_API_URL=(\S+) .*NATS_URL=(nats://127\.0\.0\.1:\d+)", exports
            )
            assert found is not None, exports
            nats_urls.append(found.group(2))
            api = found.group(1)
            metrics = proc.wait_for(r"^  metrics ", within=1, stream="out").split()[-1]
            for url in (api, metrics):
                assert int(url.split(":")[-1].split("/")[0]) not in default_ports_taken
            doc = ready(api)
            assert doc is not None and doc["ready"] is True, proc.transcript()
            assert_cli_finds_the_moved_api(env)
            with urllib.request.urlopen(metrics, timeout=2) as resp:
                assert b"mq_scheduler_build_info" in resp.read()
            children = psutil.Process(proc.pid).children(recursive=True)
            assert any(c.name() == "nats-server" for c in children)
            proc.signal(signal.SIGINT)
            code = proc.wait_exit(within=30)
        assert code == 0, proc.transcript()
        assert "(embedded)" in "\n".join(proc.out)
        assert not [line for line in proc.err if " WARNING " in line], proc.transcript()
        # the edge ends before the embedded servers it uses stop (it saw PostgreSQL go and
        # logged the pool's reconnect warnings when they stopped first)
        order = [
            i
            for marker in ("daemon.stopped role=edge", "embedded.postgres_stopping")
            for i, line in enumerate(proc.err)
            if marker in line
        ]
        assert len(order) == 2 and order[0] < order[1], proc.transcript()
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]
        assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()
    assert nats_urls[0] == nats_urls[1]
