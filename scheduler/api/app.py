"""The HTTP surface: management API (health, readiness; more per issue) and the metrics endpoint.

Both bind to `SCHEDULER_HTTP_HOST` (loopback by default). The API and metrics run as two aiohttp
sites in the daemon's own event loop, so they share its state without locks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from scheduler.metrics import Metrics

log = logging.getLogger("scheduler.api")


class HealthSource(Protocol):
    """What the API asks the daemon: is it alive, and is it ready (with details)."""

    def is_alive(self) -> bool: ...

    def readiness(self) -> tuple[bool, dict[str, Any]]: ...

    async def leader(self) -> dict[str, Any]: ...


def build_api(health: HealthSource) -> web.Application:
    app = web.Application()
    app.router.add_get("/healthz", _healthz(health))
    app.router.add_get("/readyz", _readyz(health))
    app.router.add_get("/v1/leader", _leader(health))
    return app


def build_metrics_app(metrics: Metrics) -> web.Application:
    async def render(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", render)
    return app


def _healthz(health: HealthSource) -> Callable[[web.Request], Any]:
    async def handler(_: web.Request) -> web.Response:
        alive = health.is_alive()
        return web.json_response({"alive": alive}, status=200 if alive else 503)

    return handler


def _readyz(health: HealthSource) -> Callable[[web.Request], Any]:
    async def handler(_: web.Request) -> web.Response:
        ready, body = health.readiness()
        return web.json_response({"ready": ready, **body}, status=200 if ready else 503)

    return handler


def _leader(health: HealthSource) -> Callable[[web.Request], Any]:
    async def handler(_: web.Request) -> web.Response:
        return web.json_response(await health.leader())

    return handler


@dataclass
class Served:
    """A running aiohttp site: where it listens and how to stop it."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve(app: web.Application, host: str, port: int) -> Served:
    """Start `app` on host:port (port 0 picks a free one) and return where it listens."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    server = site._server
    bound = server.sockets[0].getsockname()[1] if server and server.sockets else port
    return Served(runner, host, int(bound))
