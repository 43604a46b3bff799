"""What every role process shares: its run state, its start phases, and a start that a stop
abandons at once (whatever phase it is in), naming the phase."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Coroutine
from typing import Any

from scheduler.aio import first_of

log = logging.getLogger(__name__)


class RunState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Phased:
    """A process part with a run state, start phases and a stop signal."""

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
