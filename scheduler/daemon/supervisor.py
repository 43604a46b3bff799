"""`scheduler run`: the engine in this process, the edge in a child process beside it.

One command starts both roles and stops both (Ctrl-C, SIGTERM); `scheduler run --role
engine|edge` runs one. The engine runs here, so the process a user (or a fault test) signals,
pauses or kills is the one that fires, exactly as before the split; the edge is a child in a
session of its own that `scheduler run` starts once the servers' URLs are known (after the
embedded servers, in embedded mode), stops with SIGTERM at the end and waits for before the
embedded servers stop (so it never sees them go), and restarts with a backoff when it dies
while the engine runs (firing never waits for it). The child ends itself when this process
dies, even by SIGKILL (`PR_SET_PDEATHSIG`).

The child takes this process's settings (the same `--config`, the URLs the embedded servers got,
the instance id, the development tokens) and the run folder (`scheduler.daemon.pair`) where the
engine writes its status and metrics. A child that fails to start writes its one-line error
there (`edge-exit.json`) instead of printing it; this process prints the one line, after the
child has exited, and exits with the child's status.

`scheduler run --engines N` starts engines 2..N beside the edge (`scheduler.daemon.crew`), with
the edge, restarts them the same way and stops them with it, before the embedded servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.daemon.crew import Crew
from scheduler.daemon.engine import EngineDaemon
from scheduler.daemon.pair import EDGE_EXIT, EDGE_STATUS, read_json, write_json
from scheduler.daemon.runstate import Endpoints, RunState
from scheduler.settings import Settings

log = logging.getLogger(__name__)

PARENT_ENV = "SCHEDULER_PAIR_PARENT"  # set in the edge child: the pid of its `scheduler run`
RESTART_FIRST, RESTART_MAX = 0.5, 30.0  # seconds between restarts of an edge that died
STABLE_AFTER = 60.0  # an edge that ran this long restarts after RESTART_FIRST again
EDGE_STOP_GRACE = 10.0
PR_SET_PDEATHSIG = 1


class EdgeFailed(Exception):
    """The edge child could not start: its one line and exit status."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(line)
        self.code, self.line = code, line


@dataclass(frozen=True)
class Listening:
    url: str


class Pair:
    """The engine here and the edge as a child (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedded: bool = False,
        argv: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        engines: int = 1,
    ) -> None:
        self.settings = settings
        self.embedded = embedded
        self.argv = argv or []  # --config/--data-dir, passed on to the child
        self.extra_env = dict(extra_env or {})
        self._own_dir = settings.run_dir is None
        self.run_dir = settings.run_dir or Path(tempfile.mkdtemp(prefix="mq-scheduler-run-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.engine = EngineDaemon(
            settings,
            embedded=embedded,
            run_dir=self.run_dir,
            on_servers=self._servers_up,
            before_servers_stop=self._stop_children,
        )
        # engines 2..N (`--engines N`), children beside the edge
        self.crew = Crew(self.run_dir, engines, self.argv) if engines > 1 else None
        self.endpoints = Endpoints()
        self.started = asyncio.Event()
        self.child: asyncio.subprocess.Process | None = None
        self._child_env: dict[str, str] = {}
        self._edge_ran = False
        self._spawned = asyncio.Event()
        self._stopping = False
        self._termed: asyncio.subprocess.Process | None = None  # the child sent SIGTERM

    # -- what `scheduler run` asks of a daemon ------------------------------------------------
    @property
    def stopped_during_start(self) -> str | None:
        return self.engine.stopped_during_start

    @property
    def state(self) -> RunState:
        return self.engine.state

    def stop(self) -> None:
        self._stopping = True
        self.engine.stop()
        self._signal_child(signal.SIGTERM)
        if self.crew is not None:
            self.crew.stop_soon()

    def reload(self) -> None:
        self.engine.reload()

    async def run(self) -> None:
        """Run the engine and keep an edge beside it until both have stopped."""
        engine = asyncio.create_task(self.engine.run(), name="engine-role")
        watch = asyncio.create_task(self._watch_edge(engine), name="edge-watch")
        crew = asyncio.create_task(self._watch_crew(engine), name="crew-watch")
        try:
            await asyncio.wait({engine, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done() and not watch.cancelled() and watch.exception() is not None:
                self.engine.stop()  # the edge failed to start: abandon the engine's start too
            await asyncio.wait({engine})
        except asyncio.CancelledError:  # a second signal: no grace for anyone
            self._signal_child(signal.SIGKILL)
            if self.crew is not None:
                self.crew.signal(signal.SIGKILL)
            engine.cancel()
            raise
        finally:
            watch.cancel()
            crew.cancel()
            await asyncio.gather(watch, crew, return_exceptions=True)
            await self._stop_children()
            if not engine.done():
                engine.cancel()
                await asyncio.gather(engine, return_exceptions=True)
            self._remove_dir()
        engine.result()  # the engine's own error first: it is the one line shown
        if not watch.cancelled() and (failed := watch.exception()) is not None:
            raise failed

    # -- the child ---------------------------------------------------------------------------
    async def _servers_up(self, settings: Settings, started: list[str]) -> None:
        """The engine knows its servers' URLs: start the edge with them."""
        self.settings = settings
        self.endpoints.embedded += started
        self.endpoints.nats_url = settings.redacted_nats_url
        self.endpoints.database_url = settings.redacted_database_url or ""
        self._child_env = self._environment(settings)
        if self.crew is not None:
            await self.crew.start(self._crew_environment(), settings.instance_id)
        await self._spawn()

    def _crew_environment(self) -> dict[str, str]:
        """The edge's environment without the API's tokens (an engine serves no API)."""
        env = dict(self._child_env)
        for name in ("SCHEDULER_ADMIN_TOKEN", "SCHEDULER_READ_TOKEN"):
            if name not in os.environ:
                env.pop(name, None)
        return env

    async def _watch_crew(self, engine: asyncio.Task[None]) -> None:
        """Engines 2..N (started with the edge) are restarted while engine 1 runs."""
        if self.crew is None:
            return
        await self._spawned.wait()
        await self.crew.watch(engine)

    def _environment(self, s: Settings) -> dict[str, str]:
        env = {**os.environ, **self.extra_env}
        env[PARENT_ENV] = str(os.getpid())
        env["SCHEDULER_RUN_DIR"] = str(self.run_dir)
        env["SCHEDULER_INSTANCE_ID"] = s.instance_id
        if s.nats_url is not None:
            env["SCHEDULER_NATS_URL"] = s.nats_url
        if s.database_url is not None:
            env["SCHEDULER_DATABASE_URL"] = s.database_url.get_secret_value()
        for name in ("admin_token", "read_token"):
            secret = getattr(s, name)
            if secret is not None:
                env["SCHEDULER_" + name.upper()] = secret.get_secret_value()
        return env

    async def _spawn(self) -> None:
        (self.run_dir / EDGE_EXIT).unlink(missing_ok=True)
        (self.run_dir / EDGE_STATUS).unlink(missing_ok=True)
        args = [sys.executable, "-m", "scheduler", "run", "--role", "edge", *self.argv]
        if self.embedded:
            args.append("--embedded")  # for the edge: a taken default port moves to a free one
        self.child = await asyncio.create_subprocess_exec(
            *args, env=self._child_env, start_new_session=True, stdin=asyncio.subprocess.DEVNULL
        )
        self._spawned.set()
        log.info("edge.started pid=%d", self.child.pid)

    async def _watch_edge(self, engine: asyncio.Task[None]) -> None:
        """Until the engine ends: mark the pair started once both run; restart an edge that
        died after it ran; fail (EdgeFailed) when one dies during its first start."""
        await self._spawned.wait()
        delay = RESTART_FIRST
        while not engine.done():
            assert self.child is not None
            spawned = time.monotonic()
            exited = asyncio.create_task(self.child.wait())
            while not exited.done():
                await asyncio.wait({exited, engine}, timeout=0.05)
                if engine.done():
                    exited.cancel()
                    return
                self._note_edge()
            if self._stopping or self.engine.stopping:
                return
            code = exited.result()
            failure = read_json(self.run_dir / EDGE_EXIT)
            if not self._edge_ran:
                line = str((failure or {}).get("line") or f"scheduler: the edge exited ({code})")
                raise EdgeFailed(int((failure or {}).get("code") or 1), line)
            if time.monotonic() - spawned > STABLE_AFTER:
                delay = RESTART_FIRST  # it had run a good while: this is a new failure
            log.warning("edge.exited code=%s: restarting in %.1fs", code, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX)
            self._pin_ports()
            await self._spawn()

    def _note_edge(self) -> None:
        """Read `edge.json`: where it listens; once it runs, the pair has started."""
        if self.started.is_set() and self._edge_ran:
            return
        doc = read_json(self.run_dir / EDGE_STATUS)
        if doc is None:
            return
        self.endpoints.api = Listening(str(doc.get("api")))
        self.endpoints.metrics = Listening(str(doc.get("metrics")))
        if doc.get("state") == "running":
            self._edge_ran = True
            if self.engine.started.is_set():
                self.started.set()
        if self._edge_ran and self.engine.started.is_set():
            self.started.set()

    def _pin_ports(self) -> None:
        """A restarted edge listens where the first one did (port 0 chose them once)."""
        for variable, served in (
            ("SCHEDULER_HTTP_PORT", self.endpoints.api),
            ("SCHEDULER_METRICS_PORT", self.endpoints.metrics),
        ):
            if served is not None and served.url.rsplit(":", 1)[-1].isdigit():
                self._child_env[variable] = served.url.rsplit(":", 1)[-1]

    def _signal_child(self, sig: int) -> None:
        if self.child is not None and self.child.returncode is None:
            if sig == signal.SIGTERM:
                # once per child: a second SIGTERM is a second Ctrl-C to it (no grace)
                if self._termed is self.child:
                    return
                self._termed = self.child
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(sig)

    async def _stop_children(self) -> None:
        """The engines 2..N and the edge, before the embedded servers stop."""
        if self.crew is not None:
            await asyncio.gather(self.crew.stop(), self._stop_child())
        else:
            await self._stop_child()

    async def _stop_child(self) -> None:
        """SIGTERM (unless sent already), then SIGKILL after EDGE_STOP_GRACE."""
        child = self.child
        if child is None or child.returncode is not None:
            return
        self._signal_child(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(child.wait()), EDGE_STOP_GRACE)
        except TimeoutError:
            log.warning("edge.stop_timeout pid=%d: killed", child.pid)
            self._signal_child(signal.SIGKILL)
            await child.wait()

    def _remove_dir(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


# -- in the edge child -----------------------------------------------------------------------


def paired_parent() -> int | None:
    """The pid of the `scheduler run` this edge belongs to (None: run alone)."""
    value = os.environ.get(PARENT_ENV)
    return int(value) if value and value.isdigit() else None


def die_with_parent(parent: int) -> None:
    """Have the kernel send SIGTERM when the parent dies (Linux); if it died already, go."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def report_exit(run_dir: Path | None, code: int, line: str) -> None:
    """A paired edge's start-up failure, for its parent to print (`edge-exit.json`)."""
    if run_dir is not None:
        with contextlib.suppress(OSError):
            write_json(run_dir / EDGE_EXIT, {"code": code, "line": line, "at": time.time()})


def report_listening(run_dir: Path | None, edge: Any) -> None:
    """`edge.json`: where this edge listens and whether it runs."""
    if run_dir is None:
        return
    e = edge.endpoints
    doc = {
        "api": e.api.url if e.api else None,
        "metrics": e.metrics.url if e.metrics else None,
        "state": edge.state.value,
        "pid": os.getpid(),
    }
    with contextlib.suppress(OSError):
        write_json(run_dir / EDGE_STATUS, doc)
