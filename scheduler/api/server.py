"""Serving an ASGI app with uvicorn inside the daemon's own event loop.

The socket is bound here, so a taken port or a refused address fails the start with one line
naming the address (uvicorn itself would log and `sys.exit`). uvicorn's own signal handling and
logging set-up are left out: the CLI owns both. Instead of uvicorn's main loop (a 100 ms timer)
a 1 s tick keeps the `Date` header current. Connections close lingering
(`scheduler.api.lingering`), and a request's head and an idle connection have deadlines
(`scheduler.api.deadlines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from scheduler.api.deadlines import ConnectionLimits, protocol_for

log = logging.getLogger(__name__)

GRACE = 2.0  # seconds for requests in flight at shutdown
DEFAULT_LIMITS = ConnectionLimits()  # the settings' defaults


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the daemon's own handlers stay in charge of SIGINT/SIGTERM

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown without its fixed 0.1 s sleeps (two ports: 0.2 s of every
        stop): stop listening, ask each connection to close, wait for them and the requests
        in flight every 5 ms for up to the grace, then cancel what is left. Lifespan is off."""
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.timeout_graceful_shutdown or GRACE)
        state = self.server_state
        while (state.connections or state.tasks) and not self.force_exit:
            if loop.time() >= deadline:
                log.error("api.shutdown cancelled=%d (grace exceeded)", len(state.tasks))
                for task in state.tasks:
                    task.cancel()
                break
            await asyncio.sleep(0.005)


@dataclass
class Served:
    """A running server: where it listens and how to stop it."""

    server: uvicorn.Server
    ticker: asyncio.Task[None]
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        self.ticker.cancel()
        await asyncio.gather(self.ticker, return_exceptions=True)
        self.server.force_exit = False
        await self.server.shutdown()


async def serve(
    app: Any, host: str, port: int, limits: ConnectionLimits = DEFAULT_LIMITS
) -> Served:
    """Start `app` on host:port (port 0 picks a free one) and return where it listens;
    `limits` are the connection's deadlines (`ConnectionLimits.from_settings`)."""
    sock = _bind(host, port)
    config = uvicorn.Config(
        app,
        http=protocol_for(limits),  # lingering close, head deadline (scheduler.api.deadlines)
        timeout_keep_alive=limits.idle_timeout,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=int(GRACE),
        server_header=False,
        proxy_headers=False,
    )
    server = _EmbeddedServer(config)
    config.load()
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    ticker = asyncio.create_task(_tick(server), name=f"http-{sock.getsockname()[1]}")
    return Served(server, ticker, host, int(sock.getsockname()[1]))


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock


async def _tick(server: uvicorn.Server) -> None:
    """What uvicorn's main loop does, once a second: refresh the `Date` header."""
    while True:
        await server.on_tick(0)
        await asyncio.sleep(1.0)
