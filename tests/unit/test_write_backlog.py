"""The write backlog retries a deferred write until it is done, in order, and says what is
lost when the daemon stops first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from scheduler.operations import backlog as backlog_module
from scheduler.operations.backlog import WriteBacklog


async def test_retries_until_written_then_logs_what_is_lost_at_stop(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails twice with a connection error is written on the third try, before
    the next one; at stop a write that still fails is logged as lost, and a full or stopped
    backlog refuses a new write at once, saying so."""
    monkeypatch.setattr(backlog_module, "FIRST_WAIT", 0.01)
    monkeypatch.setattr(backlog_module, "FINAL_BUDGET", 0.2)
    done: list[str] = []
    fails = {"a": 2, "b": 0}
    written = asyncio.Event()

    def write(name: str) -> Callable[[], Awaitable[None]]:
        async def attempt() -> None:
            if fails[name] > 0:
                fails[name] -= 1
                raise ConnectionRefusedError("postgres away")
            done.append(name)
            if name == "b":
                written.set()

        return attempt

    backlog, stop = WriteBacklog(limit=2), asyncio.Event()
    runner = asyncio.create_task(backlog.run(stop))
    assert backlog.add("row a", write("a")) and backlog.add("row b", write("b"))
    assert not backlog.add("row c", write("b"))  # full
    async with asyncio.timeout(3):
        await written.wait()
        while len(backlog):  # noqa: ASYNC110 (popped right after the write returns; no event)
            await asyncio.sleep(0.01)
    assert done == ["a", "b"] and len(backlog) == 0
    fails["a"] = 1_000
    with caplog.at_level(logging.ERROR, logger="scheduler.operations.backlog"):
        backlog.add("row a again", write("a"))
        stop.set()
        async with asyncio.timeout(3):
            await runner
        assert not backlog.add("row d", write("b"))  # after the loop ended
    lost = [r.getMessage() for r in caplog.records if "backlog.lost" in r.getMessage()]
    assert lost == [
        "backlog.lost reason=full limit=2 what=row c",
        "backlog.lost reason=stopping what=row a again",
        "backlog.lost reason=stopping what=row d",
    ]


async def test_a_connection_left_mid_operation_is_retried_like_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """asyncpg's InternalClientError (a pooled connection left mid-operation by a PostgreSQL
    that stopped under it) is transient: the write is retried and done, and the operations
    that defer writes (a trigger's fire-log confirm) answer `pending` instead of a 500."""
    monkeypatch.setattr(backlog_module, "FIRST_WAIT", 0.01)
    assert issubclass(asyncpg.InternalClientError, backlog_module.TRANSIENT)
    tries: list[int] = []
    written = asyncio.Event()

    async def write() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise asyncpg.InternalClientError("cannot switch to state 11; another operation")
        written.set()

    backlog, stop = WriteBacklog(), asyncio.Event()
    runner = asyncio.create_task(backlog.run(stop))
    assert backlog.add("row", write)
    async with asyncio.timeout(3):
        await written.wait()
    stop.set()
    await runner
    assert len(tries) == 2
