"""The daemon's HTTP listeners (management API, metrics), and what to say when a port fails.

A port that cannot be had ends the start with a ConfigError naming its setting, except in
embedded mode when the port is only the default: then a free one is picked (the start banner
shows it).
"""

from __future__ import annotations

import errno
import logging
import sys
from typing import Any

from scheduler.api.deadlines import ConnectionLimits
from scheduler.api.server import Served, serve
from scheduler.errors import ConfigError
from scheduler.settings import Settings

log = logging.getLogger(__name__)


async def listen(
    app: Any, settings: Settings, port: int, variable: str, embedded: bool = False
) -> Served:
    """Serve `app` on the HTTP host and `port` (see the module docstring)."""
    host = settings.http_host
    field_name = variable.removeprefix("SCHEDULER_").lower()
    try:
        return await serve(app, host, port, ConnectionLimits.from_settings(settings))
    except OSError as exc:
        chosen = field_name in settings.model_fields_set
        if exc.errno == errno.EADDRINUSE and embedded and not chosen:
            log.info("embedded.port_taken %s=%d: listening on a free port", variable, port)
            return await listen(app, settings, 0, variable, embedded)
        raise listen_error(exc, variable, host, port) from None


API_MODULE = "scheduler.console.console"


def build_api_app(backend: Any) -> Any:
    """Import and build the management API with the console (`API_MODULE`). A cold daemon
    runs this in a worker thread while it starts, so the import is deferred on purpose
    (`scheduler.api.starting`)."""
    from scheduler.console.console import build_app

    return build_app(backend)


def api_imported() -> bool:
    """Whether this process has imported the API already (then building it takes ~25 ms)."""
    return API_MODULE in sys.modules


def listen_error(exc: OSError, variable: str, host: str, port: int) -> ConfigError:
    """What to tell a user whose HTTP or metrics port cannot be listened on."""
    fix = "choose another port (0 picks a free port)"
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(variable, f"port {port} on {host} is already in use; {fix}")
    if exc.errno == errno.EACCES:
        return ConfigError(variable, f"port {port} on {host} needs privileges; {fix}")
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(
            "SCHEDULER_HTTP_HOST",
            f"{host} is not an address of this machine; use 127.0.0.1, 0.0.0.0 or one of its "
            "addresses",
        )
    return ConfigError(
        "SCHEDULER_HTTP_HOST", f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    )
