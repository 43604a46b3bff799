"""The cold start: what the HTTP ports answer before the management API is built
(`scheduler.api.starting`), and the daemon's start path importing no web framework."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

from scheduler.api.starting import MetricsApp, StartingApp


class Probes:
    def __init__(self) -> None:
        self.alive = True
        self.ready = False

    def is_alive(self) -> bool:
        return self.alive

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return self.ready, {"state": "starting", "nats": "connected"}


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x")


def test_the_daemon_start_path_imports_no_web_framework() -> None:
    """`scheduler run` imports the CLI and the lifecycle, then starts: FastAPI, the console
    and their templates come later, in a worker thread (0.4-0.6 s of a cold start)."""
    code = (
        "import sys, scheduler.cli.main, scheduler.daemon.lifecycle; "
        "print(sorted(m for m in ('fastapi', 'jinja2', 'scheduler.console.console', "
        "'scheduler.api.app') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


ENGINE_RUN = """
import asyncio, sys
import scheduler.cli.main as cli

class Engine:  # what `scheduler run --role engine` hands `_run_daemon`, started at once
    def __init__(self):
        self.started = asyncio.Event()
    async def run(self):
        self.started.set()
        await asyncio.sleep(0.2)  # running: `_run_daemon` tunes the collector meanwhile

async def main():
    return await cli._run_daemon(Engine(), banner=False)

asyncio.run(main())
print(sorted(m for m in ("uvicorn", "fastapi", "starlette", "jinja2", "scheduler.daemon.edge",
                         "scheduler.daemon.lifecycle") if m in sys.modules))
"""


def test_the_engines_process_imports_no_web_framework_once_running() -> None:
    """What `scheduler run` does once the engine is up (the collector's tuning) imports
    nothing of the edge: it imported the one-process daemon's module, and through it uvicorn
    and the edge, on the engine's loop after it had started firing (~0.2-0.5 s)."""
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_RUN], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


async def test_the_probes_answer_from_the_daemon_before_the_api_is_built() -> None:
    probes = Probes()
    app = StartingApp(probes)
    async with client(app) as c:
        r = await c.get("/healthz")
        assert (r.status_code, r.json()) == (200, {"alive": True})
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert r.json() == {"ready": False, "state": "starting", "nats": "connected"}
        probes.alive, probes.ready = False, True
        assert (await c.get("/healthz")).status_code == 503
        assert (await c.get("/readyz")).status_code == 200
        head = await c.head("/healthz")
        assert head.status_code == 503 and head.content == b""


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/leader"),
        ("POST", "/v1/delayed/x/cancel"),
        ("GET", "/ui/"),
        ("POST", "/healthz"),
    ],
)
async def test_every_other_request_is_told_to_retry_without_its_body_being_read(
    method: str, path: str
) -> None:
    received: list[Any] = []
    app = StartingApp(Probes())

    async def probe_receive(scope: Any, receive: Any, send: Any) -> None:
        async def counting() -> Any:
            message = await receive()
            received.append(message)
            return message

        await app(scope, counting, send)

    async with client(probe_receive) as c:
        r = await c.request(method, path, content=b"x" * 100_000)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert doc["code"] == "unavailable" and doc["status"] == 503 and "starting" in doc["detail"]
    assert received == []  # not a byte of the request body was read


async def test_once_the_api_is_set_every_request_is_its_own() -> None:
    seen: list[str] = []

    async def api(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = StartingApp(Probes())
    app.app = api
    async with client(app) as c:
        assert (await c.get("/healthz")).status_code == 204
        assert (await c.get("/v1/leader")).status_code == 204
    assert seen == ["/healthz", "/v1/leader"]


async def test_the_metrics_port_serves_metrics_alone() -> None:
    app = MetricsApp(lambda: b"# HELP x y\nx 1.0\n")
    async with client(app) as c:
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.content == b"# HELP x y\nx 1.0\n"
        assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        head = await c.head("/metrics")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-length"] == str(len(b"# HELP x y\nx 1.0\n"))
        r = await c.post("/metrics")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
        assert (await c.get("/metrics/x")).status_code == 404
        assert (await c.get("/")).status_code == 404
