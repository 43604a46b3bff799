"""Production's server versions: what the daemon refuses below its NATS floor (the rest of the
compatibility run is the `[compat]` variant of the server-backed tests where a version can
change the answer: tests/conftest.py's COMPAT_RUN)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.bus.nats.connection import MIN_SERVER_VERSION
from scheduler.daemon.embedded import free_port
from tests.support.compat import NatsServerOf

OLD_NATS = os.environ.get("SCHEDULER_COMPAT_OLD_NATS_SERVER", "/usr/sbin/nats-server")


def _version(binary: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    found = re.search(r"v?(\d+)\.(\d+)\.(\d+)", out.stdout + out.stderr)
    return tuple(int(p) for p in found.groups()) if found else None


@pytest.mark.compat
def test_a_nats_server_below_the_floor_is_refused_at_start_naming_the_version(
    tmp_path: Path,
) -> None:
    """`scheduler run` against a real nats-server older than 2.10.23 (Debian's 2.9) exits at
    start with one line naming the version needed and the override."""
    version = _version(OLD_NATS)
    if version is None or version >= MIN_SERVER_VERSION:
        pytest.skip(
            f"no nats-server older than 2.10.23 at {OLD_NATS} "
            "(set SCHEDULER_COMPAT_OLD_NATS_SERVER)"
        )
    server = NatsServerOf(tmp_path / "nats", OLD_NATS).start()
    try:
        env = {
            **os.environ,
            "SCHEDULER_NATS_URL": server.url,
            "SCHEDULER_DATABASE_URL": f"postgresql://nobody@127.0.0.1:{free_port()}/none",
            "SCHEDULER_HTTP_PORT": "0",
            "SCHEDULER_METRICS_PORT": "0",
            "SCHEDULER_SCHEDULES_DIR": str(tmp_path),
        }
        proc = subprocess.run(
            [sys.executable, "-m", "scheduler", "run"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.stop()
    assert proc.returncode != 0
    floor = ".".join(map(str, MIN_SERVER_VERSION))
    errors = [ln for ln in proc.stderr.splitlines() if floor in ln]
    assert errors, proc.stderr
    assert "SCHEDULER_ALLOW_UNSAFE_NATS" in errors[-1]
    assert ".".join(map(str, version)) in errors[-1]
