"""`scheduler run --embedded` as a user runs it: a real process, real servers, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from scheduler.embedded import free_port


def ready(port: int) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return dict(json.loads(resp.read()))
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


@pytest.mark.slow
def test_run_embedded_is_ready_fast_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    """The daemon is ready within 20 s, prints where it listens, and Ctrl-C stops every process."""
    http, metrics = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env.update(SCHEDULER_HTTP_PORT=str(http), SCHEDULER_METRICS_PORT=str(metrics))
    cmd = [sys.executable, "-m", "scheduler", "run", "--embedded", "--data-dir", str(tmp_path)]
    for _ in range(2):  # the second start reuses the data dir
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 20
            while (doc := ready(http)) is None and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                time.sleep(0.1)
            assert doc is not None and doc["ready"] is True
            children = psutil.Process(proc.pid).children(recursive=True)
            assert any(c.name() == "nats-server" for c in children)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err.decode()
        assert f"API         http://127.0.0.1:{http}" in out.decode()
        assert "(embedded)" in out.decode()
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]
        assert not (tmp_path / "postgres" / "postmaster.pid").exists()
