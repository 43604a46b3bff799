"""What every role process shares: its run state, its start phases, and a start that a stop
abandons at once (whatever phase it is in), naming the phase."""

from __future__ import annotations

import asyncio
import enum
import gc
import logging
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

from scheduler.aio import first_of

log = logging.getLogger(__name__)


class RunState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Listener(Protocol):
    """A port being listened on (`scheduler.api.server.Served`, or the URL an edge reported)."""

    @property
    def url(self) -> str: ...


@dataclass
class Endpoints:
    """Where a daemon's parts listen, for the start banner and for tests."""

    nats_url: str = ""
    database_url: str = ""
    api: Listener | None = None
    metrics: Listener | None = None
    embedded: list[str] = field(default_factory=list)


class Phased:
    """A process part with a run state, start phases and a stop signal. `run` is the same
    for every part: start (a stop meanwhile abandons it), its loops in one TaskGroup until
    `stop()`, then everything the start registered on the AsyncExitStack torn down."""

    part = "daemon"  # named in the log lines of `run`

    def __init__(self) -> None:
        self.state = RunState.STARTING
        self.phase = "starting"
        self.stopped_during_start: str | None = None
        self.started = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask it to shut down; returns at once."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        """Run until `stop()`; everything started is torn down on the way out."""
        try:
            async with AsyncExitStack() as stack:
                if not await self._start_unless_stopped(self._start(stack)):
                    return
                async with asyncio.TaskGroup() as tg:
                    self.spawn(tg)
                    tg.create_task(self._stop.wait(), name="stop-signal")
                    await self._ready()  # the loops run meanwhile (an engine fires)
                    self._set_state(RunState.RUNNING)
                    self.started.set()
                    log.info("daemon.running role=%s instance=%s", self.part, self._instance())
                self._set_state(RunState.STOPPING)
                log.info("daemon.stopping role=%s", self.part)
        finally:
            self._set_state(RunState.STOPPED)
            log.info("daemon.stopped role=%s", self.part)

    def _instance(self) -> str:
        settings = getattr(self, "settings", None)
        return str(getattr(settings, "instance_id", ""))

    async def _start(self, stack: AsyncExitStack) -> None:
        """Connect and build everything, registering cleanups on `stack`."""
        raise NotImplementedError

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        """Start the part's loops in `tg`; they end when `stop()` is called."""
        raise NotImplementedError

    async def _ready(self) -> None:
        """What must be done, its loops running, before the part says it runs."""

    def _set_state(self, state: RunState) -> None:
        self.state = state

    def _enter(self, phase: str) -> None:
        self.phase = phase
        log.info("daemon.start phase=%r", phase)

    async def _start_unless_stopped(self, start: Coroutine[Any, Any, None]) -> bool:
        """Run `start`; a stop requested meanwhile cancels it at once (False)."""
        task = asyncio.create_task(start, name="start")
        try:
            await first_of(asyncio.shield(task), self._stop.wait())
        except asyncio.CancelledError:  # cancelled from outside (a second Ctrl-C)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        if task.done():
            task.result()
            return True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self.stopped_during_start = self.phase
        log.info("daemon.start_abandoned phase=%r", self.phase)
        return False


def tune_gc() -> None:
    """Fewer, cheaper collections. The loops allocate short-lived objects by the hundred
    thousand a second (messages, tasks, futures); with the default thresholds the cyclic
    collector runs hundreds of times a second and a full collection over every long-lived
    object (imported modules, the heap) stalls the loop for tens of milliseconds, which shows
    up as delivery lateness. Objects alive after start-up are frozen out of collections.
    Called by `scheduler run` once the daemon is up (it changes the whole process); it lives
    here, not beside the one-process daemon of the tests (`lifecycle`), whose import would pull
    the edge's web framework into the engine's process after it started firing."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
