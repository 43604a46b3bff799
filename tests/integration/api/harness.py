"""A running daemon with tokens, cron jobs and a target stream, plus an HTTP client for its API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from scheduler import client
from scheduler.settings import Settings
from tests.integration.test_delayed import envelope as envelope  # shared task builder
from tests.support.helpers import DaemonRunner

ADMIN = "admin-secret-token"
READ = "read-secret-token"
TARGET = "mq.tasks.work"
T = TypeVar("T")
JOBS = """
scheduled_jobs:
  - name: every-second
    subject: mq.scheduled.tick
    cron: "* * * * * *"
    data: {kind: tick}
  - name: nightly
    subject: mq.scheduled.nightly
    cron: "30 2 * * *"
    timezone: Europe/Berlin
    data: {kind: night}
  - name: frozen
    subject: mq.scheduled.frozen
    cron: "0 * * * *"
    paused: true
    data: {}
"""


class Reply:
    """One HTTP answer: status, headers and the decoded JSON body (None when not JSON)."""

    def __init__(self, status: int, headers: Mapping[str, str], body: Any) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.body!r})"


def replayed(first: Reply, again: Reply) -> None:
    """`again` is the first answer served again: same status and body, marked replayed."""
    assert again.status == first.status, (first, again)
    assert again.body == first.body
    assert header(again, "Idempotency-Replayed") == "true", again.headers
    assert header(first, "Idempotency-Replayed") is None


def header(reply: Reply, name: str) -> str | None:
    """A header of `reply`, by its name in any case."""
    return {k.lower(): v for k, v in reply.headers.items()}.get(name.lower())


def request_headers(
    token: str | None, headers: dict[str, str] | None, json_text: bool
) -> dict[str, str]:
    """A call's headers: the token's, then the caller's, and the JSON type for raw `data`."""
    sent = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    if json_text:
        sent["Content-Type"] = "application/json"
    return sent


class ApiHarness(DaemonRunner):
    """A daemon with the API's tokens set, a TASKS stream and a NATS connection for the test."""

    def __init__(self, settings: Settings, nc: Client, http: aiohttp.ClientSession) -> None:
        super().__init__(settings)
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.http = http

    @property
    def url(self) -> str:
        assert self.daemon is not None and self.daemon.endpoints.api is not None
        return self.daemon.endpoints.api.url

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = ADMIN,
        json_body: Any = None,
        data: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        headers = request_headers(token, headers, data is not None)
        async with asyncio.timeout(10):
            async with self.http.request(
                method,
                self.url + path,
                headers=headers,
                json=json_body,
                data=data,
                params={k: str(v) for k, v in (params or {}).items()},
            ) as resp:
                raw = await resp.read()
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                return Reply(resp.status, dict(resp.headers), body)

    async def publish(self, target: str, doc: dict[str, Any] | bytes) -> None:
        await client.publish_delayed(self.js, target, doc)

    async def read_stream(
        self, stream: str, quiet: float = 1.0, within: float = 10.0, subject: str = ">"
    ) -> list[Any]:
        """Every message of `stream` (on `subject`) from the start, read until it stays quiet
        for `quiet` s."""
        psub = await self.js.pull_subscribe(
            subject, durable=None, stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
        )
        out: list[Any] = []
        try:
            async with asyncio.timeout(within):
                while True:
                    try:
                        out += await psub.fetch(500, timeout=quiet)
                    except TimeoutError:
                        break
        finally:
            await psub.unsubscribe()
        return out


@asynccontextmanager
async def running_api(settings: Settings, jobs: str = JOBS) -> AsyncIterator[ApiHarness]:
    """An ApiHarness (not started) with both tokens, fast retries, the `jobs` YAML and the
    target streams TASKS and SCHEDULED; stopped and disconnected on the way out."""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    await js.add_stream(name="SCHEDULED", subjects=["mq.scheduled.>"], duplicate_window=120)
    write_jobs(settings, jobs)
    tuned = settings.with_overrides(
        admin_token=ADMIN,
        read_token=READ,
        backoff=timedelta(milliseconds=100),
        forecast_interval=timedelta(milliseconds=200),
    )
    async with aiohttp.ClientSession() as http:
        harness = ApiHarness(tuned, nc, http)
        try:
            yield harness
        finally:
            await harness.stop()
            await nc.close()


def write_jobs(settings: Settings, text: str = JOBS) -> Path:
    path = Path(settings.schedules_dir) / "jobs.yaml"
    path.write_text(text)
    return path


async def poll(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], within: float = 5.0
) -> T:
    """Call `probe` until `done(value)`; fail the test after `within` seconds."""
    async with asyncio.timeout(within):
        while True:
            value = await probe()
            if done(value):
                return value
            await asyncio.sleep(0.05)
