"""The fault suite's parts: daemon processes, a load of delayed tasks, and the checker.

Every daemon is a real `python -m scheduler run` process with its own log file; the checker
reads the whole target stream back and classifies every task the load published as delivered
once, lost, doubled, early or late.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import nats
from nats.js.api import StreamConfig

from scheduler.daemon.embedded import free_port

TTL = 3.0
TARGET_STREAM = "FAULTS"
TARGET_SUBJECTS = ["mq.fault.>"]
LANE_SUBJECT = "mq.delay.fault.work"


class DaemonProc:
    """One `scheduler run` process."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        nats_url: str,
        database_url: str,
        argv: tuple[str, ...] = ("run",),
    ) -> None:
        self.name = name
        self.argv = argv  # `run --role engine`: an engine alone (no edge, no HTTP)
        self.port = free_port()
        self.log_path = workdir / f"{name}.log"
        (workdir / "schedules").mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "SCHEDULER_NATS_URL": nats_url,
            "SCHEDULER_DATABASE_URL": database_url,
            "SCHEDULER_INSTANCE_ID": name,
            "SCHEDULER_LEASE_TTL": str(TTL),
            "SCHEDULER_HTTP_PORT": str(self.port),
            "SCHEDULER_METRICS_PORT": str(free_port()),
            "SCHEDULER_SCHEDULES_DIR": str(workdir / "schedules"),
            "SCHEDULER_DATA_DIR": str(workdir / "data"),
            "SCHEDULER_LOG_LEVEL": "INFO",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> DaemonProc:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", *self.argv],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def readyz(self) -> dict[str, Any] | None:
        """The /readyz body, or None when the process does not answer."""
        try:
            timeout = aiohttp.ClientTimeout(total=1)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(f"http://127.0.0.1:{self.port}/readyz") as resp:
                    return dict(await resp.json())
        except Exception:
            return None

    async def role(self) -> str | None:
        body = await self.readyz()
        return None if body is None else str(body.get("role"))

    async def wait_ready(self, within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            while True:
                if not self.alive():
                    raise AssertionError(f"{self.name} exited at start:\n{self.log_tail()}")
                body = await self.readyz()
                if body is not None and body.get("ready"):
                    return
                await asyncio.sleep(0.05)

    async def wait_exit(self, within: float = 20.0) -> int:
        """The exit status once the process ends on its own (fails after `within` seconds)."""
        assert self.proc is not None
        async with asyncio.timeout(within):
            while self.proc.poll() is None:  # noqa: ASYNC110 (a child process, no event)
                await asyncio.sleep(0.02)
        return int(self.proc.returncode)

    async def stop(self, within: float = 20.0) -> int:
        """SIGTERM (and SIGCONT, in case it is stopped), wait; SIGKILL after `within` seconds."""
        if self.proc is None:
            return 0
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(within):
                while self.proc.poll() is None:  # noqa: ASYNC110 (a child process, no event)
                    await asyncio.sleep(0.02)
        except TimeoutError:
            self.proc.kill()
            self.proc.wait(10)
        return int(self.proc.returncode or 0)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Cluster:
    """Two or three daemons on one NATS (each maybe through its own URL) and one database."""

    workdir: Path
    nats_urls: list[str]
    database_url: str
    env: dict[str, str] = field(default_factory=dict)  # SCHEDULER_* overrides for every member
    members: list[DaemonProc] = field(default_factory=list)

    async def start(self) -> Cluster:
        for i, url in enumerate(self.nats_urls):
            member = DaemonProc(f"d{i + 1}", self.workdir, url, self.database_url)
            member.env.update(self.env)
            self.members.append(member.start())
        await asyncio.gather(*(m.wait_ready() for m in self.members))
        return self

    async def leader(self, within: float = 10.0, exclude: DaemonProc | None = None) -> DaemonProc:
        """The one member that says it leads (failing when two do, or nobody within `within`)."""
        async with asyncio.timeout(within):
            while True:
                live = [m for m in self.members if m.alive() and m is not exclude]
                roles = await asyncio.gather(*(m.role() for m in live))
                leading = [m for m, r in zip(live, roles, strict=True) if r == "leader"]
                if len(leading) == 1:
                    return leading[0]
                assert len(leading) < 2, f"two leaders: {[m.name for m in leading]}"
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.members))

    def logs(self) -> str:
        return "\n".join(f"--- {m.name} ---\n{m.log_tail(40)}" for m in self.members)


async def add_target_stream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().add_stream(
            StreamConfig(name=TARGET_STREAM, subjects=TARGET_SUBJECTS, duplicate_window=120)
        )
    finally:
        await nc.close()


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_envelope(task_id: str, due: datetime, n: int) -> bytes:
    """A task's envelope for the delay lane, due at `due` (whole milliseconds)."""
    doc = {
        "schema": "hanzo.mq.v1",
        "id": task_id,
        "type": "fault.work",
        "source": "faults",
        "timestamp": _iso(datetime.now(UTC)),
        "delay_until": _iso(due),
        "data": {"n": n},
    }
    return json.dumps(doc).encode()


async def publish_load(
    nats_url: str, first_due: datetime, count: int, spacing: float
) -> dict[str, datetime]:
    """Publish `count` tasks to the delay lane, due every `spacing` s from `first_due`; acked."""
    expected: dict[str, datetime] = {}
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        acks = []
        for i in range(count):
            due = first_due + timedelta(seconds=i * spacing)
            due = due.replace(microsecond=due.microsecond // 1000 * 1000)
            task_id = f"f_{uuid.uuid4().hex}"
            expected[task_id] = due
            acks.append(js.publish(LANE_SUBJECT, task_envelope(task_id, due, i)))
            if len(acks) >= 500:
                await asyncio.gather(*acks)
                acks = []
        await asyncio.gather(*acks)
    finally:
        await nc.close()
    return expected


@dataclass
class Verdict:
    delivered: int
    lost: list[str]
    doubled: list[str]
    early: list[str]
    late: list[str]
    max_lateness: float
    unknown: int

    def __str__(self) -> str:
        return (
            f"delivered once {self.delivered}, lost {len(self.lost)}, doubled "
            f"{len(self.doubled)}, early {len(self.early)}, late {len(self.late)}, unknown "
            f"{self.unknown}, max lateness {self.max_lateness:.2f} s"
        )


async def read_stream(nats_url: str, stream: str = TARGET_STREAM) -> list[tuple[str, datetime]]:
    """(Nats-Msg-Id, store time) of every message in `stream`, in order."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        total = (await js.stream_info(stream)).state.messages
        out: list[tuple[str, datetime]] = []
        if total == 0:
            return out
        sub = await js.subscribe(TARGET_SUBJECTS[0], ordered_consumer=True, stream=stream)
        try:
            while len(out) < total:
                msg = await sub.next_msg(timeout=5)
                stored = msg.metadata.timestamp
                out.append(((msg.headers or {}).get("Nats-Msg-Id", "?"), stored))
        finally:
            await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def wait_delivered(nats_url: str, count: int, within: float) -> int:
    """Wait until the target stream holds `count` messages (or `within` passes); return count."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        held = 0
        try:
            async with asyncio.timeout(within):
                while (held := (await js.stream_info(TARGET_STREAM)).state.messages) < count:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
        except TimeoutError:
            pass
        return held
    finally:
        await nc.close()


async def check(nats_url: str, expected: dict[str, datetime], late_after: float) -> Verdict:
    """Classify every expected task by what the target stream holds."""
    seen = await read_stream(nats_url)
    counts = Counter(task_id for task_id, _ in seen)
    stored_at: dict[str, datetime] = {}
    for task_id, at in seen:
        stored_at.setdefault(task_id, at)
    early, late, worst = [], [], 0.0
    for task_id, due in expected.items():
        if task_id not in stored_at:
            continue
        lateness = (stored_at[task_id] - due).total_seconds()
        worst = max(worst, lateness)
        if lateness < 0:
            early.append(task_id)
        elif lateness > late_after:
            late.append(task_id)
    return Verdict(
        delivered=sum(1 for t in expected if counts.get(t) == 1),
        lost=[t for t in expected if t not in counts],
        doubled=[t for t in expected if counts.get(t, 0) > 1],
        early=early,
        late=late,
        max_lateness=worst,
        unknown=sum(1 for t in counts if t not in expected),
    )
