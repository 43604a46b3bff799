"""The NATS side: one connection per daemon, and provisioning of streams, consumers and buckets.

The connection reconnects forever with jittered waits and has the client's reconnect publish
buffer disabled (`pending_size=0`): a process cut off from NATS gets an error on publish instead
of flushing stale publishes when it comes back (design section 5).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError, NotFoundError

from scheduler.errors import ServiceUnavailableError
from scheduler.metrics import Metrics
from scheduler.settings import Settings

log = logging.getLogger("scheduler.nats")

MIN_SERVER_VERSION = (2, 10, 23)


@dataclass(frozen=True, slots=True)
class ProvisionNote:
    """What provisioning found or did for one stream, consumer or bucket."""

    kind: str  # stream | consumer | bucket
    name: str
    status: str  # created | exists | covered
    detail: str = ""


class NatsBus:
    """The daemon's NATS connection, its JetStream context and its connection state."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.connected = asyncio.Event()
        # called with False when the link drops (before nats-py reconnects and flushes what it
        # buffered) and True once it is back; the engine holds and revalidates its publishes
        self.link_listeners: list[Callable[[bool], None]] = []

    async def connect(self, attempts: int | None = None) -> None:
        """Connect, retrying with backoff (forever when `attempts` is None)."""
        delay, tried = 0.2, 0
        while True:
            try:
                # nats-py retries a first connect forever when reconnects are unlimited, so the
                # first connect tries each server once and our loop bounds it; after it succeeds
                # the client reconnects forever.
                self.nc = await nats.connect(**self._options(), max_reconnect_attempts=1)
                self.nc.options["max_reconnect_attempts"] = -1
                break
            except Exception as exc:  # nats-py raises several unrelated types on connect
                tried += 1
                if attempts is not None and tried >= attempts:
                    raise ServiceUnavailableError("NATS", str(exc) or type(exc).__name__) from exc
                log.warning(
                    "nats.connect_failed attempt=%d error=%r retry_in=%.1fs", tried, exc, delay
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.js = self.nc.jetstream()
        self._set_connected(True)
        log.info(
            "nats.connected url=%s server=%s",
            self.nc.connected_url.netloc if self.nc.connected_url else "?",
            self.server_version,
        )

    def _options(self) -> dict[str, Any]:
        s = self.settings
        opts: dict[str, Any] = {
            "servers": s.nats_servers,
            "name": f"mq-scheduler {s.instance_id}",
            "allow_reconnect": True,
            "reconnect_time_wait": 1,
            "connect_timeout": 2,
            "pending_size": 0,
            # A silent link (a partition, a blackholed proxy) is noticed in 4-6 s, not minutes.
            "ping_interval": 2,
            "max_outstanding_pings": 2,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnect,
            "reconnected_cb": self._on_reconnect,
        }
        if s.nats_user:
            opts["user"] = s.nats_user
        if s.nats_password:
            opts["password"] = s.nats_password.get_secret_value()
        if s.nats_creds:
            opts["user_credentials"] = str(s.nats_creds)
        if s.nats_tls_ca:
            opts["tls"] = ssl.create_default_context(cafile=str(s.nats_tls_ca))
        return opts

    async def _on_error(self, exc: Exception) -> None:
        log.warning("nats.error error=%r", exc)

    async def _on_disconnect(self) -> None:
        log.warning("nats.disconnected")
        self.metrics.disconnects.labels("nats").inc()
        self._set_connected(False)

    async def _on_reconnect(self) -> None:
        log.info("nats.reconnected")
        self.metrics.reconnects.labels("nats").inc()
        self._set_connected(True)

    def _set_connected(self, up: bool) -> None:
        self.metrics.connected.labels("nats").set(1 if up else 0)
        (self.connected.set if up else self.connected.clear)()
        for listener in list(self.link_listeners):
            try:
                listener(up)
            except Exception:  # a listener must not break nats-py's reconnect sequence
                log.exception("nats.link_listener_failed")

    @property
    def is_connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    @property
    def server_version(self) -> str:
        if self.nc is None or not self.nc._server_info:
            return "unknown"
        return str(self.nc._server_info.get("version", "unknown"))

    @property
    def max_payload(self) -> int:
        return int(self.nc.max_payload) if self.nc is not None else 1024 * 1024

    def version_known(self) -> bool:
        """True when the server's version parses (an unknown one only earns a warning)."""
        try:
            tuple(int(p) for p in self.server_version.split("-")[0].split(".")[:3])
        except ValueError:
            return False
        return True

    def version_problem(self) -> str | None:
        """A warning when the server is older than the oldest version we support."""
        try:
            parts = tuple(int(p) for p in self.server_version.split("-")[0].split(".")[:3])
        except ValueError:
            return f"cannot parse nats-server version {self.server_version!r}"
        if parts < MIN_SERVER_VERSION:
            floor = ".".join(map(str, MIN_SERVER_VERSION))
            return (
                f"nats-server {self.server_version} is older than {floor} (known stream-loss bugs)"
            )
        return None

    async def close(self) -> None:
        """Drain and close; bounded so shutdown cannot hang on a dead server."""
        if self.nc is None or self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.drain(), timeout=5)
        except Exception as exc:  # a dead link cannot drain; close hard below
            log.warning("nats.drain_failed error=%r", exc)
        if not self.nc.is_closed:
            await self.nc.close()
        self._set_connected(False)


# -- provisioning ---------------------------------------------------------------------------------


async def ensure_stream(js: JetStreamContext, config: js_api.StreamConfig) -> ProvisionNote:
    """Create `config` unless it exists or another stream covers its subjects (named in detail)."""
    try:
        await js.stream_info(config.name)
        return ProvisionNote("stream", config.name, "exists")
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
        return ProvisionNote("stream", config.name, "created")
    except BadRequestError as exc:
        owner = await _covering_stream(js, config.subjects or [])
        if owner is None:
            raise
        log.warning("nats.stream_covered stream=%s owner=%s error=%s", config.name, owner, exc)
        return ProvisionNote("stream", config.name, "covered", owner)


async def _covering_stream(js: JetStreamContext, subjects: list[str]) -> str | None:
    for subject in subjects:
        probe = subject.replace(">", "probe").replace("*", "probe")
        try:
            return await js.find_stream_name_by_subject(probe)
        except NotFoundError:
            continue
    return None


async def ensure_bucket(js: JetStreamContext, bucket: str, ttl: float | None) -> ProvisionNote:
    """Create a KV bucket (history 1, file storage, TTL = `ttl` seconds) unless it exists."""
    try:
        await js.key_value(bucket)
        return ProvisionNote("bucket", bucket, "exists")
    except NotFoundError:
        pass
    await js.create_key_value(
        js_api.KeyValueConfig(bucket=bucket, history=1, ttl=ttl, storage=js_api.StorageType.FILE)
    )
    return ProvisionNote("bucket", bucket, "created")


async def ensure_consumer(
    js: JetStreamContext, stream: str, durable: str, filter_subject: str, ack_wait: float
) -> ProvisionNote:
    """Create the durable pull consumer of the delay lane unless it exists."""
    try:
        await js.consumer_info(stream, durable)
        return ProvisionNote("consumer", f"{stream}/{durable}", "exists")
    except NotFoundError:
        pass
    config = js_api.ConsumerConfig(
        durable_name=durable,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        deliver_policy=js_api.DeliverPolicy.ALL,
        filter_subject=filter_subject,
        max_ack_pending=100_000,
        max_waiting=16,
    )
    await js.add_consumer(stream, config)
    return ProvisionNote("consumer", f"{stream}/{durable}", "created")


def stream_configs(settings: Settings, embedded: bool) -> list[js_api.StreamConfig]:
    """The streams the daemon provisions: intake, dead letters, and (embedded only) MQ_TASKS."""
    file = js_api.StorageType.FILE
    configs = [
        js_api.StreamConfig(
            name=settings.intake_stream,
            subjects=[settings.intake_subject],
            retention=js_api.RetentionPolicy.WORK_QUEUE,
            storage=file,
            duplicate_window=settings.intake_duplicate_window.total_seconds(),
        ),
        js_api.StreamConfig(
            name=settings.dlq_stream,
            subjects=[settings.dlq_subject_prefix + ".>"],
            retention=js_api.RetentionPolicy.LIMITS,
            storage=file,
            max_age=settings.dlq_max_age.total_seconds(),
            duplicate_window=120,
        ),
    ]
    if embedded:
        configs.append(
            js_api.StreamConfig(
                name=settings.tasks_stream,
                subjects=["mq.tasks.>", "mq.scheduled.>"],
                retention=js_api.RetentionPolicy.WORK_QUEUE,
                storage=file,
                duplicate_window=120,
            )
        )
    return configs


async def provision(bus: NatsBus, embedded: bool) -> list[ProvisionNote]:
    """Create what is missing; report streams that another stream's subjects already cover."""
    assert bus.js is not None
    s = bus.settings
    notes = [await ensure_stream(bus.js, cfg) for cfg in stream_configs(s, embedded)]
    intake_stream = s.intake_stream
    if notes[0].status == "covered":
        intake_stream = notes[0].detail
        log.warning(
            "nats.intake_covered stream=%s hint='set SCHEDULER_INTAKE_STREAM=%s'",
            intake_stream,
            intake_stream,
        )
    notes.append(
        await ensure_consumer(
            bus.js,
            intake_stream,
            s.intake_consumer,
            s.intake_subject,
            s.intake_ack_wait.total_seconds(),
        )
    )
    notes.append(await ensure_bucket(bus.js, s.leader_bucket, s.lease_ttl))
    notes.append(await ensure_bucket(bus.js, s.state_bucket, None))
    for note in notes:
        log.info(
            "nats.provision kind=%s name=%s status=%s %s",
            note.kind,
            note.name,
            note.status,
            note.detail,
        )
    return notes
