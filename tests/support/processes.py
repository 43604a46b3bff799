"""`python -m scheduler ...` as a real child process, its output read line by line as it comes.

The start-up tests wait for a line (bounded), send a signal, and time the exit, so the output
is collected by reader threads rather than read once at the end.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cli_env(workdir: Path, **settings: str | None) -> dict[str, str]:
    """The environment without any SCHEDULER_* of the caller's, plus `settings`: free ports,
    an empty schedules folder and a data dir under `workdir` unless given (None drops one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    (workdir / "schedules").mkdir(parents=True, exist_ok=True)
    env.update(
        SCHEDULER_HTTP_PORT="0",
        SCHEDULER_METRICS_PORT="0",
        SCHEDULER_SCHEDULES_DIR=str(workdir / "schedules"),
        SCHEDULER_DATA_DIR=str(workdir / "data"),
        PYTHONUNBUFFERED="1",
    )
    merged: dict[str, str | None] = {**env, **settings}
    return {k: v for k, v in merged.items() if v is not None}


class CliProcess:
    """One `python -m scheduler ARGS` process; stdout and stderr lines are kept as they come."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a process group of its own, as a shell's job has
        )
        self.started = time.monotonic()
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: object, lines: list[str]) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            with self._changed:
                lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, pattern: str, within: float, stream: str = "err") -> str:
        """The first line of `stream` matching the regex `pattern`; fails after `within` s."""
        lines = self.err if stream == "err" else self.out
        regex = re.compile(pattern)
        deadline = time.monotonic() + within
        with self._changed:
            while True:
                found = next((line for line in lines if regex.search(line)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reading()):
                    raise AssertionError(
                        f"no line matching {pattern!r} within {within:g}s "
                        f"(exit {self.proc.poll()}):\n{self.transcript()}"
                    )
                self._changed.wait(min(left, 0.05))

    def _reading(self) -> bool:
        return any(reader.is_alive() for reader in self._readers)

    def signal(self, sig: int = signal.SIGTERM) -> float:
        """Send `sig` to the process (as kill, systemd or Kubernetes do); returns the monotonic
        time it was sent. SIGINT goes to the whole process group, as a Ctrl-C in a terminal
        does (the children the process started in its group get it too)."""
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        return time.monotonic()

    def wait_exit(self, within: float) -> int:
        """The exit status; fails (and kills the process) when it runs past `within` s."""
        try:
            code = self.proc.wait(within)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"still running after {within:g}s; killed:\n{self.transcript()}"
            ) from None
        self._close_pipes()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for reader in self._readers:
            reader.join(5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def last_err_line(self) -> str:
        return self.err[-1] if self.err else ""

    def transcript(self) -> str:
        return "--- stdout ---\n" + "\n".join(self.out) + "\n--- stderr ---\n" + "\n".join(self.err)


@contextmanager
def scheduler(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> Iterator[CliProcess]:
    """A CliProcess killed at the end of the block if it still runs."""
    proc = CliProcess(args, env, cwd)
    try:
        yield proc
    finally:
        proc.kill()


class SilentServer:
    """A loopback TCP port that accepts connections and never says a word (a hung server)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def wait_for_client(self, within: float) -> None:
        deadline = time.monotonic() + within
        while not self.accepted:
            assert time.monotonic() < deadline, f"nobody connected within {within:g}s"
            time.sleep(0.01)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()
