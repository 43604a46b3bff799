"""A cold start fires before the management API is built (`scheduler.api.starting`): the
probes answer meanwhile, every other request is told to retry, and the daemon reports itself
running (readiness included) only once the whole API serves."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from scheduler.daemon import edge as edge_role
from scheduler.daemon import listeners
from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from tests.support.hostile import Reader, hostile


def fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


async def afetch(url: str) -> tuple[int, dict[str, str], bytes]:
    return await asyncio.to_thread(fetch, url)


async def test_a_due_task_fires_while_the_management_api_is_still_being_built(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    build = listeners.build_api_app

    def held_build(backend: Any) -> Any:
        gate.wait(30)  # the worker thread's import and build, held until the test lets go
        return build(backend)

    monkeypatch.setattr(edge_role, "build_api_app", held_build)
    monkeypatch.setattr(edge_role, "api_imported", lambda: False)  # as in a fresh process
    async with hostile(settings) as h:
        await h.prepare()
        task_id, _ = await h.control(0.2)  # waits on the lane before the daemon starts
        tasks = await Reader(h.js, "TASKS").open()
        h.daemon = daemon = Daemon(h.settings)
        h.task = asyncio.create_task(daemon.run())
        try:
            (msg,) = await tasks.take(1, within=15)
            assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == task_id
            assert not daemon.started.is_set() and daemon.http_app.app is None
            assert daemon.endpoints.api is not None and daemon.endpoints.metrics is not None
            api = daemon.endpoints.api.url
            status, _, body = await afetch(api + "/healthz")
            assert (status, json.loads(body)) == (200, {"alive": True})
            status, _, body = await afetch(api + "/readyz")
            doc = json.loads(body)
            assert status == 503 and doc["ready"] is False and doc["state"] == "starting"
            assert doc["role"] == "leader"
            status, headers, body = await afetch(api + "/v1/leader")
            assert status == 503 and headers["retry-after"] == "1"
            assert json.loads(body)["code"] == "unavailable"
            status, _, body = await afetch(daemon.endpoints.metrics.url + "/metrics")
            assert status == 200 and b"mq_scheduler_is_leader 1.0" in body
        finally:
            gate.set()
        async with asyncio.timeout(15):
            await daemon.started.wait()
        assert daemon.http_app.app is not None
        status, _, body = await afetch(api + "/readyz")
        assert status == 200 and json.loads(body)["ready"] is True
        status, _, body = await afetch(api + "/v1/leader")
        assert status == 200 and json.loads(body)["self"]["instance"] == h.settings.instance_id
        await tasks.close()
