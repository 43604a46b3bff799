"""`scheduler run --engines N`: the engines beyond the first, as child processes beside it.

One Python process fires on one core whatever the host has; a host with more cores fires more
with more engines. Engine 1 runs in the `scheduler run` process (`scheduler.daemon.supervisor`,
as with one engine); engines 2..N are children, `scheduler run --role engine` each, started once
the servers' URLs are known (after the embedded servers, in embedded mode), in a session of
their own, each ending itself when `scheduler run` dies (`PR_SET_PDEATHSIG`). Engine k runs as
instance `<instance id>-k` and writes its status and metrics into `<run folder>/engine-k/`, where
the edge reads its metrics (`scheduler.daemon.pair`). Under P > 1 the engines share the
partitions (fair share); under P = 1 the others stand by.

A child that exits while the first engine runs is started again after a pause (doubling from
RESTART_FIRST up to RESTART_MAX); at the end every child gets SIGTERM (it gives its leases back,
as on a rolling restart) and SIGKILL after STOP_GRACE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

MAX_ENGINES = 64
RESTART_FIRST, RESTART_MAX = 0.5, 30.0  # seconds between restarts of an engine that died
STOP_GRACE = 10.0  # seconds an engine has to stop after SIGTERM
WATCH_EVERY = 0.1  # seconds between looks at the children


def engine_folder(run_dir: Path, number: int) -> Path:
    """Where engine `number` (2..N) writes its status and metrics."""
    return run_dir / f"engine-{number}"


def engine_instance(instance: str, number: int) -> str:
    return f"{instance}-{number}"


class Crew:
    """Engines 2..`count` as children of this process."""

    def __init__(self, run_dir: Path, count: int, argv: list[str]) -> None:
        self.run_dir, self.count, self.argv = run_dir, count, argv
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self._env: dict[str, str] = {}
        self._instance = ""
        self._stopping = False
        self._termed: set[int] = set()  # pids sent SIGTERM (a second one would be a Ctrl-C)

    async def start(self, env: dict[str, str], instance: str) -> None:
        """Start engines 2..count with `env` (the URLs, the parent's pid) as `instance`-k."""
        self._env, self._instance = env, instance
        for number in range(2, self.count + 1):
            await self._spawn(number)

    async def _spawn(self, number: int) -> None:
        folder = engine_folder(self.run_dir, number)
        folder.mkdir(parents=True, exist_ok=True)
        env = {
            **self._env,
            "SCHEDULER_RUN_DIR": str(folder),
            "SCHEDULER_INSTANCE_ID": engine_instance(self._instance, number),
        }
        args = [sys.executable, "-m", "scheduler", "run", "--role", "engine", *self.argv]
        child = await asyncio.create_subprocess_exec(
            *args, env=env, start_new_session=True, stdin=asyncio.subprocess.DEVNULL
        )
        self.children[number] = child
        log.info("engine.started number=%d pid=%d", number, child.pid)

    async def watch(self, first: asyncio.Task[None]) -> None:
        """While the first engine runs: start again, after a pause, a child that exited."""
        delays = {n: RESTART_FIRST for n in range(2, self.count + 1)}
        due: dict[int, float] = {}
        while not first.done() and not self._stopping:
            now = time.monotonic()
            for number, child in list(self.children.items()):
                if child.returncode is None or self._stopping:
                    continue
                if number not in due:
                    log.warning(
                        "engine.exited number=%d code=%s: restarting in %.1fs",
                        number,
                        child.returncode,
                        delays[number],
                    )
                    due[number] = now + delays[number]
                    delays[number] = min(delays[number] * 2, RESTART_MAX)
                elif now >= due.pop(number):
                    await self._spawn(number)
            await asyncio.sleep(WATCH_EVERY)

    def signal(self, sig: int) -> None:
        """Send `sig` to every child still running (SIGTERM once per child)."""
        for child in self.children.values():
            if child.returncode is not None:
                continue
            if sig == signal.SIGTERM:
                if child.pid in self._termed:
                    continue
                self._termed.add(child.pid)
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)

    def stop_soon(self) -> None:
        """No restarts from now on; every child gets SIGTERM."""
        self._stopping = True
        self.signal(signal.SIGTERM)

    async def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM (unless sent already), then SIGKILL after `grace`; returns once all exited."""
        self.stop_soon()
        waits = [child.wait() for child in self.children.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), grace)
        except TimeoutError:
            log.warning("engine.stop_timeout: killed")
            self.signal(signal.SIGKILL)
            await asyncio.gather(*(child.wait() for child in self.children.values()))
