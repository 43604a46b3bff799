"""The producer examples of `examples/` (Go, TypeScript; tests/support/examples.py builds them)
run against a real daemon: each publishes three tasks to the delay lane, cancels one,
reschedules one from an hour ahead to a few seconds ahead, and prints the daemon's answers."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from scheduler.settings import Settings
from tests.support.examples import ExampleUnavailable, go_producer, ts_producer
from tests.support.helpers import DaemonRunner

pytestmark = pytest.mark.slow

STREAM = "TASKS"
RUN_TIMEOUT = 30
PUBLISHED = re.compile(r"^published (\S+) to (\S+) due (\S+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def go_command() -> list[str]:
    try:
        return go_producer()
    except ExampleUnavailable as missing:
        pytest.skip(f"Go producer not built: {missing}")


@pytest.fixture(scope="module")
def ts_command() -> list[str]:
    try:
        return ts_producer()
    except ExampleUnavailable as missing:
        pytest.skip(f"TypeScript producer not built: {missing}")


@pytest.fixture
async def producer_nats(settings: Settings) -> AsyncIterator[Client]:
    """A running daemon, a target stream on mq.tasks.>, and a connection to read it."""
    nc = await nats.connect(settings.nats_servers)
    await nc.jetstream().add_stream(name=STREAM, subjects=["mq.tasks.>"], duplicate_window=120)
    runner = DaemonRunner(settings)
    try:
        await runner.start()
        yield nc
    finally:
        await runner.stop()
        await nc.close()


async def test_go_producer(
    go_command: list[str], producer_nats: Client, settings: Settings
) -> None:
    """The Go producer's task arrives, its cancelled one never does, and its rescheduled one
    arrives at the new time."""
    await _check_producer(go_command, "mq.tasks.go", producer_nats, settings)


async def test_ts_producer(
    ts_command: list[str], producer_nats: Client, settings: Settings
) -> None:
    """The TypeScript producer's task arrives, its cancelled one never does, and its
    rescheduled one arrives at the new time."""
    await _check_producer(ts_command, "mq.tasks.ts", producer_nats, settings)


async def _check_producer(command: list[str], target: str, nc: Client, settings: Settings) -> None:
    assert settings.nats_url is not None
    output = await _run(command, {"NATS_URL": settings.nats_url, "TARGET": target})
    published = PUBLISHED.findall(output)
    lane = "mq.delay." + target.removeprefix("mq.")
    assert [where for _, where, _ in published] == [lane] * 3, output
    (soon, soon_due), (dropped, _), (moved, _) = [(i, _ts(due)) for i, _, due in published]
    answers = _answers(output)
    assert answers["cancel"] == {"status": "cancelled", "id": dropped}, output
    assert answers["reschedule"]["status"] == "rescheduled", output
    new_due = _ts(answers["reschedule"]["due_at"])
    assert answers["get"]["task"]["id"] == moved, output
    assert answers["stats"]["role"] == "leader", output

    await _delivered(nc, count=2, within=15)
    await asyncio.sleep(0.3)  # the cancelled task was due with the moved one: give it time
    arrived = await _delivered(nc, count=None, within=5)
    by_id = {m.headers["Nats-Msg-Id"]: m for m in arrived if m.headers}
    assert sorted(by_id) == sorted([soon, moved]), f"{list(by_id)}\n{output}"
    # The reply's due_at is the asked time cut to the millisecond, the task's the time
    # rounded up (never early): 1 ms apart at most when the producer sends finer.
    scheduled_for = _ts((by_id[moved].headers or {})["Mq-Scheduled-For"])
    assert timedelta(0) <= scheduled_for - new_due <= timedelta(milliseconds=1)
    for task_id, due in ((soon, soon_due), (moved, scheduled_for)):
        msg = by_id[task_id]
        assert msg.subject == target
        assert json.loads(msg.data)["id"] == task_id
        assert msg.metadata.timestamp >= due, (task_id, msg.metadata.timestamp, due)
        assert msg.metadata.timestamp < due + timedelta(seconds=5), (task_id, due)


async def _run(command: list[str], extra_env: dict[str, str]) -> str:
    """Run the producer to its end (bounded); its stdout, after checking it exited 0."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        env={**os.environ, **extra_env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode()
    assert proc.returncode == 0, f"{command} exited {proc.returncode}\n{text}\n{err.decode()}"
    return text


def _answers(output: str) -> dict[str, dict[str, Any]]:
    """The last reply printed for each verb (`<verb> <json>` lines)."""
    found: dict[str, dict[str, Any]] = {}
    for line in output.splitlines():
        name, _, body = line.partition(" ")
        if name in ("get", "cancel", "reschedule", "stats"):
            found[name] = json.loads(body)
    return found


async def _delivered(nc: Client, count: int | None, within: float) -> list[Msg]:
    """The target stream's messages from the start: until `count`, or until quiet for 0.3 s."""
    psub = await nc.jetstream().pull_subscribe(
        ">", durable=None, stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    got: list[Msg] = []
    try:
        async with asyncio.timeout(within):
            while count is None or len(got) < count:
                try:
                    got.extend(await psub.fetch(10, timeout=0.3 if count is None else 1.0))
                except TimeoutError:
                    if count is None:
                        break
    finally:
        await psub.unsubscribe()
    return got


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
