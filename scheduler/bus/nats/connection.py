"""The NATS side: one connection per daemon, and provisioning of streams, consumers and buckets.

The connection reconnects forever with jittered waits and has the client's reconnect publish
buffer disabled (`pending_size=0`): a process cut off from NATS gets an error on publish instead
of flushing stale publishes when it comes back (docs/leadership.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nats import errors as nats_errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js import errors as js_errors
from nats.js.errors import BadRequestError, NotFoundError

from scheduler.aio import Backoff, first_of
from scheduler.bus.nats import wire
from scheduler.bus.nats.events import BusEvents
from scheduler.bus.nats.link import LinkWatch, ServerChoice
from scheduler.bus.nats.plain import PlainPublisher
from scheduler.bus.nats.publisher import Publisher
from scheduler.bus.nats.puller import Puller
from scheduler.errors import ConfigError, ServiceUnavailableError
from scheduler.settings import Settings, nkey_seed, redact_url

log = logging.getLogger(__name__)

MIN_SERVER_VERSION = (2, 10, 23)
# The first release whose streams accept `duplicate_window: 0` (when they have `sources`,
# nats-server PR #7651): the delay lane then keeps no duplicate window at all.
DEDUP_OFF_VERSION = (2, 14, 0)
# The shortest window older servers accept: the lane's window where it cannot be turned off.
FALLBACK_WINDOW = 0.1

# What the embedded work stream captures: the platform's registered queues (mq.inference.>,
# mq.batch.>, mq.scheduled.>, mq.notify.>) and mq.tasks.> for experiments, so a task sent in
# development, or by an example in docs/, has somewhere to arrive.
DEV_WORK_SUBJECTS = ("mq.tasks.>", "mq.scheduled.>", "mq.inference.>", "mq.batch.>", "mq.notify.>")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProvisionNote:
    """What provisioning found or did for one stream, consumer or bucket."""

    kind: str  # stream | consumer | bucket
    name: str
    status: str  # created | exists | covered
    detail: str = ""


def parse_version(text: str) -> tuple[int, ...] | None:
    """`2.14.0-beta.1` -> (2, 14, 0); None when it does not parse."""
    try:
        return tuple(int(p) for p in text.split("-")[0].split(".")[:3])
    except ValueError:
        return None


class NatsBus:
    """The daemon's NATS connection, its JetStream context and its connection state."""

    def __init__(self, settings: Settings, events: BusEvents, role: str = "") -> None:
        self.settings = settings
        self.role = role  # in the connection's name (`mq-scheduler <instance> <role>`, /connz)
        self._events = events
        self.nc: Client | None = None
        self.js: JetStreamContext | None = None
        self.connected = asyncio.Event()
        # called with False when the link drops (before nats-py reconnects and flushes what it
        # buffered) and True once it is back; the engine holds and revalidates its publishes
        self.link_listeners: list[Callable[[bool], None]] = []
        self._connect_error: BaseException | None = None
        self._backoff: Backoff | None = None  # of the first connect, while it runs
        self._warned = False  # the first failure to connect was logged
        self._closing = False
        self._denied = ""  # the last permissions violation the server reported
        self._denied_event = asyncio.Event()
        self._refused = asyncio.Event()  # the first connect met a refusal retrying cannot cure
        self._stream_of: dict[str, str] = {}  # subject -> the stream capturing it
        self._choice = ServerChoice()
        self._watch: LinkWatch | None = None

    async def connect(self, budget: float = 60.0) -> None:
        """Connect, retrying an unreachable server with backoff for `budget` seconds.

        The first failure is logged at once with the URL (credentials hidden) and the setting
        to check, and so is every retry; past the budget it raises ServiceUnavailableError.
        Refused credentials or TLS raise ConfigError at once (retrying cannot help).
        """
        backoff = self._backoff = Backoff(budget)
        while True:
            backoff.attempt += 1
            self._connect_error = None
            # nats-py retries a first connect forever when reconnects are unlimited, so the
            # first connect tries each server twice at once and our loop bounds it; once it
            # succeeds, the client reconnects forever, a second apart.
            options = self._options()  # a ConfigError (a TLS file) is no URL problem
            options.update(max_reconnect_attempts=1, reconnect_time_wait=0)
            nc = Client()
            try:
                async with asyncio.timeout(max(backoff.left, options["connect_timeout"])):
                    await self._attempt(nc, options)
            except asyncio.CancelledError:
                await _close_quietly(nc)
                raise
            except ValueError as exc:  # a URL nats-py cannot parse (a TLS refusal is one too)
                if isinstance(exc, ssl.SSLError):
                    await _close_quietly(nc)
                    raise nats_refused(
                        self.settings, tls_variable(exc, self.settings), exc
                    ) from None
                await _close_quietly(nc)
                raise ConfigError(
                    "SCHEDULER_NATS_URL", f"{self.settings.redacted_nats_url}: {exc}"
                ) from None
            except (OSError, nats_errors.Error) as exc:  # what nats-py raises on connect
                await _close_quietly(nc)
                cause = self._connect_error or exc
                if (variable := permanent_connect_error(cause, self.settings)) is not None:
                    raise nats_refused(self.settings, variable, cause) from None
                if backoff.left <= 0:
                    raise nats_unavailable(self.settings, cause, budget) from None
                if backoff.attempt > 1:
                    self._warn_unreachable(cause, backoff)
                await backoff.wait()
                continue
            break
        nc.options["max_reconnect_attempts"] = -1
        nc.options["reconnect_time_wait"] = 1
        self.nc = nc
        self.js = nc.jetstream()
        self._set_connected(True)
        if self.settings.nats_stale_after > 0:
            self._watch = LinkWatch(
                nc, self.settings.nats_stale_after, self._choice, self._on_stale
            ).start()
        log.info(
            "nats.connected url=%s server=%s",
            redact_url(nc.connected_url.geturl(), token=True) if nc.connected_url else "?",
            self.server_version,
        )

    async def _attempt(self, nc: Client, options: dict[str, Any]) -> None:
        """One first connect. A refusal retrying cannot cure (credentials, a certificate), as
        reported to the error callback, ends it at once: after a failed TLS handshake nats-py
        would otherwise sit in its retry until the whole budget is spent."""
        self._refused.clear()
        connecting = asyncio.ensure_future(nc.connect(**options))
        try:
            await first_of(asyncio.shield(connecting), self._refused.wait())
        finally:
            if not connecting.done():
                connecting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await connecting
        if not connecting.cancelled():
            connecting.result()
        elif self._connect_error is not None:
            raise self._connect_error

    def _warn_unreachable(self, cause: BaseException, backoff: Backoff, retry: bool = True) -> None:
        log.warning(
            'nats.unreachable url=%s error="%s" attempt=%d %s(check SCHEDULER_NATS_URL; '
            "giving up in %.0fs)",
            self.settings.redacted_nats_url,
            describe_connect_error(cause),
            backoff.attempt,
            f"retry_in={backoff.next_wait:.1f}s " if retry else "",
            backoff.left,
        )

    def _options(self) -> dict[str, Any]:
        s = self.settings
        opts: dict[str, Any] = {
            "servers": s.nats_servers,
            "name": " ".join(filter(None, ("mq-scheduler", s.instance_id, self.role))),
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
            # the next node on a reconnect: not one just called stale or just lost (link.py)
            "reconnect_to_server_handler": self._choice,
        }
        if s.nats_user:
            opts["user"] = s.nats_user
        if s.nats_password:
            opts["password"] = s.nats_password.get_secret_value()
        if s.nats_token:
            opts["token"] = s.nats_token.get_secret_value()
        if s.nats_nkey_seed:
            opts["nkeys_seed_str"] = nkey_seed(s.nats_nkey_seed).decode()
        if s.nats_creds:
            opts["user_credentials"] = str(s.nats_creds)
        if (context := tls_context(s)) is not None:
            opts["tls"] = context
        return opts

    async def _on_error(self, exc: Exception) -> None:
        if self.nc is None:  # still connecting: connect() reports the cause with the URL
            self._connect_error = exc
            if permanent_connect_error(exc, self.settings) is not None:
                self._refused.set()  # connect() says it in one line, naming the setting
                return
            if self._backoff is not None and not self._warned:
                self._warned = True  # said at once, not after nats-py's second try of a server
                self._warn_unreachable(exc, self._backoff, retry=False)
            return
        if "permissions violation" in str(exc).lower():
            self._denied = str(exc).removeprefix("nats: ")
            self._denied_event.set()
        log.warning("nats.error error=%r", exc)

    async def setup(self, work: Awaitable[T]) -> T:
        """Run the start's JetStream calls (provisioning, bucket checks). A server without
        JetStream, or a user the server denies the JetStream API (reported at once, where the
        request itself would only time out), ends them with a ConfigError naming the setting."""
        task = asyncio.ensure_future(work)
        try:
            await first_of(asyncio.shield(task), self._denied_event.wait())
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        url = self.settings.redacted_nats_url
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            subject = self._denied.rsplit(" to ", 1)[-1].strip('"').upper()
            raise ConfigError(
                credentials_variable(self.settings),
                f"{url}: this user may not publish to {subject} (permissions violation); "
                "the scheduler's NATS user needs publish rights on $JS.API.>",
            )
        try:
            return task.result()
        except (nats_errors.NoRespondersError, js_errors.ServiceUnavailableError) as exc:
            raise ConfigError(
                "SCHEDULER_NATS_URL",
                f"{url}: JetStream is not enabled on this server (run nats-server with -js, or "
                "`jetstream {}` in its configuration)",
            ) from exc

    def _on_stale(self, netloc: str, silent: float) -> None:
        log.warning(
            "nats.stale_link server=%s silent_for=%.2fs (no PONG: reconnecting to another node)",
            netloc,
            silent,
        )
        self._events.nats_stale_link()

    async def _on_disconnect(self) -> None:
        if self.nc is None:  # a first connect that failed: connect() reports it
            return
        url = self.nc.connected_url
        self._choice.lost(url.netloc if url else None)
        if self._closing:  # our own close() or drain(): nothing went wrong
            log.info("nats.closed")
        else:
            log.warning("nats.disconnected")
            self._events.nats_disconnected()
        self._set_connected(False)

    async def _on_reconnect(self) -> None:
        log.info("nats.reconnected")
        self._events.nats_reconnected()
        self._set_connected(True)

    def _set_connected(self, up: bool) -> None:
        self._events.nats_link(up)
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
        return wire.server_version(self.nc)

    @property
    def max_payload(self) -> int:
        return int(self.nc.max_payload) if self.nc is not None else 1024 * 1024

    def version_known(self) -> bool:
        """True when the server's version parses (an unknown one only earns a warning)."""
        return parse_version(self.server_version) is not None

    def can_disable_dedup(self) -> bool:
        """Whether the server lets the delay lane run without a duplicate window (2.14+)."""
        parts = parse_version(self.server_version)
        return parts is not None and parts >= DEDUP_OFF_VERSION

    def version_problem(self) -> str | None:
        """A warning when the server is older than the oldest version we support."""
        parts = parse_version(self.server_version)
        if parts is None:
            return f"cannot parse nats-server version {self.server_version!r}"
        if parts < MIN_SERVER_VERSION:
            floor = ".".join(map(str, MIN_SERVER_VERSION))
            return (
                f"nats-server {self.server_version} is older than {floor} (known stream-loss bugs)"
            )
        return None

    async def close(self) -> None:
        """Drain and close; bounded so shutdown cannot hang on a dead server."""
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None
        if self.nc is None or self.nc.is_closed:
            return
        self._closing = True
        try:
            await asyncio.wait_for(self.nc.drain(), timeout=5)
        except Exception as exc:  # a dead link cannot drain; close hard below
            log.warning("nats.drain_failed error=%r", exc)
        if not self.nc.is_closed:
            await self.nc.close()
        self._set_connected(False)

    # What a term of office needs (scheduler.engine.ports.Bus): built here, so the engine never
    # touches the client.

    async def open_publisher(
        self, timeout: float, fence: Callable[[], bool]
    ) -> Publisher | PlainPublisher:
        """A started publisher for one term, sending only while `fence()` holds: the wire
        adapter, or the plain nats-py one (`SCHEDULER_PUBLISH_PATH=nats_py`)."""
        assert self.nc is not None
        if self.settings.publish_path == "nats_py":
            return await PlainPublisher(self.nc, timeout=timeout, fence=fence).start()
        return await Publisher(self.nc, timeout=timeout, fence=fence).start()

    def intake_source(self, stream: str, consumer: str, batch: int) -> Puller:
        """The puller of the delay lane's durable consumer (started by its user); shared by
        every engine's under P > 1 (intake runs in every term)."""
        assert self.nc is not None
        return Puller(self.nc, stream, consumer, batch, shared=self.settings.partitions > 1)

    async def listen(self, subject: str, handler: Callable[[bytes], Awaitable[None]]) -> Any:
        """Call `handler` with the payload of every core message on `subject`; the result's
        `unsubscribe()` ends it."""
        assert self.nc is not None

        async def on_msg(msg: Msg) -> None:
            await handler(msg.data)

        return await self.nc.subscribe(subject, cb=on_msg)

    async def notify(self, subject: str, data: bytes) -> None:
        """A core message on `subject` (the client's publish: raises while the link is down,
        since its reconnect buffer is off)."""
        assert self.nc is not None
        await self.nc.publish(subject, data)

    async def duplicate_window(self, stream: str) -> float:
        """The duplicate window of `stream`, in seconds (0 without one)."""
        assert self.js is not None
        return (await self.js.stream_info(stream)).config.duplicate_window or 0

    async def messages_held(self, subject: str) -> int:
        """How many messages the stream capturing `subject` holds on it (the stream's name is
        looked up once per subject); raises NotFoundError when no stream captures it."""
        assert self.js is not None
        stream = self._stream_of.get(subject)
        if stream is None:
            stream = self._stream_of[subject] = await self.js.find_stream_name_by_subject(subject)
        info = await self.js.stream_info(stream, subjects_filter=subject)
        return int((info.state.subjects or {}).get(subject, 0))


# How long the start's JetStream calls wait out a cluster that is electing: a replicated
# stream or bucket just created, or a meta leader just lost, answers nothing (a request
# timeout) or 503 "temporarily unavailable" until its group has a leader (seconds, more on a
# loaded host). Longer than that is a cluster that cannot elect: the start fails then.
ELECTING_BUDGET = 45.0


def electing(exc: BaseException) -> bool:
    """True for the answers of a JetStream cluster without a leader for what was asked."""
    if isinstance(exc, js_errors.ServiceUnavailableError):
        return "temporarily" in str(exc.description or "")
    return isinstance(exc, TimeoutError)  # nats.errors.TimeoutError is one


async def while_electing(
    make: Callable[[], Awaitable[T]], what: str, budget: float = ELECTING_BUDGET
) -> T:
    """Run `make()` again (every step of it is idempotent) while the cluster answers as one
    that is electing, up to `budget` seconds; any other error, or the last, is raised."""
    backoff = Backoff(budget)
    while True:
        backoff.attempt += 1
        try:
            return await make()
        except Exception as exc:
            if not electing(exc) or backoff.left <= 0:
                raise
            log.warning("nats.electing step=%s attempt=%d error=%r", what, backoff.attempt, exc)
            await backoff.wait()


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The client's TLS context from SCHEDULER_NATS_TLS_CA (the CA that signed the server's
    certificate; default: the system's) and SCHEDULER_NATS_TLS_CERT/_KEY (a client certificate
    for mutual TLS), or None when none is set (a `tls://` URL then uses the system's CAs).
    A file that is no certificate or key raises ConfigError naming its setting."""
    s = settings
    if not (s.nats_tls_ca or s.nats_tls_cert):
        return None
    try:
        context = ssl.create_default_context(cafile=str(s.nats_tls_ca) if s.nats_tls_ca else None)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("SCHEDULER_NATS_TLS_CA", f"not a PEM CA certificate: {exc}") from None
    if s.nats_tls_cert and s.nats_tls_key:
        try:
            context.load_cert_chain(str(s.nats_tls_cert), str(s.nats_tls_key))
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                "SCHEDULER_NATS_TLS_CERT/SCHEDULER_NATS_TLS_KEY",
                f"not a PEM certificate and its private key: {exc}",
            ) from None
    return context


def describe_connect_error(exc: BaseException) -> str:
    """A connect failure in a few words: `connection refused`, `unknown host 'x'`, ..."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS failed: the server's certificate: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError) and _server_alert(exc):
        if "CERTIFICATE_REQUIRED" in str(exc.reason):
            return "TLS failed: the server requires a client certificate (mutual TLS)"
        return f"TLS failed: the server refused the client certificate ({exc.reason})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {getattr(exc, 'reason', None) or exc}"
    if isinstance(exc, TimeoutError):
        return "timed out (nothing answered)"
    if isinstance(exc, nats_errors.AuthorizationError) or _is_auth(exc):
        return "credentials refused (authorization violation)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).removeprefix("nats: ") or type(exc).__name__


def nats_refused(settings: Settings, variable: str, cause: BaseException) -> ConfigError:
    """NATS refused us for `cause` (credentials, TLS): retrying cannot cure it."""
    return ConfigError(variable, f"{settings.redacted_nats_url}: {describe_connect_error(cause)}")


def nats_unavailable(
    settings: Settings, cause: BaseException, budget: float
) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        "NATS",
        f"{settings.redacted_nats_url}: {describe_connect_error(cause)}; retried for "
        f"{budget:g}s. Check SCHEDULER_NATS_URL and that nats-server runs there",
    )


def permanent_connect_error(exc: BaseException, settings: Settings) -> str | None:
    """The setting to fix when retrying `exc` cannot help (credentials, TLS), else None."""
    if isinstance(exc, nats_errors.AuthorizationError) or _is_auth(exc):
        return credentials_variable(settings)
    if isinstance(exc, ssl.SSLError):
        return tls_variable(exc, settings)
    if isinstance(exc, nats_errors.SecureConnRequiredError):
        return "SCHEDULER_NATS_TLS_CA" if settings.nats_tls_ca else "SCHEDULER_NATS_URL"
    return None


def tls_variable(exc: ssl.SSLError, settings: Settings) -> str:
    """The setting to fix for a failed TLS handshake: the client certificate when the server
    refused it or asked for one (an alert from the server), else the CA that should have
    verified the server's certificate."""
    return "SCHEDULER_NATS_TLS_CERT" if _server_alert(exc) else "SCHEDULER_NATS_TLS_CA"


def _server_alert(exc: ssl.SSLError) -> bool:
    """The server ended the handshake with an alert (it refused what the client showed)."""
    reason = str(getattr(exc, "reason", "") or "").upper()
    return reason.startswith(("SSLV3_ALERT", "TLSV1_ALERT", "TLSV13_ALERT"))


def credentials_variable(settings: Settings) -> str:
    """The setting that says who the daemon is to NATS."""
    if settings.nats_creds:
        return "SCHEDULER_NATS_CREDS"
    if settings.nats_nkey_seed:
        return "SCHEDULER_NATS_NKEY_SEED"
    if settings.nats_token:
        return "SCHEDULER_NATS_TOKEN"
    if settings.nats_user or settings.nats_password:
        return "SCHEDULER_NATS_USER/SCHEDULER_NATS_PASSWORD"
    return "SCHEDULER_NATS_URL"


def _is_auth(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "authorization violation" in text or "authentication" in text


async def _close_quietly(nc: Client) -> None:
    """Close a client whose first connect failed or was cancelled (it may hold tasks)."""
    with contextlib.suppress(Exception):
        await nc.close()


# -- provisioning ---------------------------------------------------------------------------------


def _stream_name(config: js_api.StreamConfig) -> str:
    """The name of a stream config built here (nats-py types the field optional)."""
    if config.name is None:
        raise ValueError("a stream config needs a name")
    return config.name


async def ensure_stream(js: JetStreamContext, config: js_api.StreamConfig) -> ProvisionNote:
    """Create `config` unless it exists or another stream covers its subjects (named in detail)."""
    name = _stream_name(config)
    try:
        await js.stream_info(name)
        return ProvisionNote("stream", name, "exists")
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
        return ProvisionNote("stream", name, "created")
    except BadRequestError as exc:
        owner = await _covering_stream(js, config.subjects or [])
        if owner is None:
            raise
        log.warning("nats.stream_covered stream=%s owner=%s error=%s", name, owner, exc)
        return ProvisionNote("stream", name, "covered", owner)


async def _covering_stream(js: JetStreamContext, subjects: list[str]) -> str | None:
    for subject in subjects:
        probe = subject.replace(">", "probe").replace("*", "probe")
        try:
            return await js.find_stream_name_by_subject(probe)
        except NotFoundError:
            continue
    return None


async def _captures_only(js: JetStreamContext, stream: str, subject: str) -> bool:
    """True when `stream` captures `subject` and nothing else."""
    return (await js.stream_info(stream)).config.subjects == [subject]


async def ensure_bucket(
    js: JetStreamContext, bucket: str, ttl: float | None, replicas: int = 1
) -> ProvisionNote:
    """Create a KV bucket (history 1, file storage, TTL = `ttl` seconds, `replicas`) unless it
    exists."""
    try:
        await js.key_value(bucket)
        return ProvisionNote("bucket", bucket, "exists")
    except NotFoundError:
        pass
    await js.create_key_value(
        js_api.KeyValueConfig(
            bucket=bucket, history=1, ttl=ttl, storage=js_api.StorageType.FILE, replicas=replicas
        )
    )
    return ProvisionNote("bucket", bucket, "created")


async def ensure_consumer(
    js: JetStreamContext, stream: str, durable: str, filter_subject: str | None, ack_wait: float
) -> ProvisionNote:
    """Create the durable pull consumer of the delay lane unless it exists; an existing one
    whose filter differs from `filter_subject` (see `provision` for why) or whose ack wait
    differs from `ack_wait` (`SCHEDULER_INTAKE_ACK_WAIT` changed) is updated."""
    name = f"{stream}/{durable}"
    try:
        info = await js.consumer_info(stream, durable)
    except NotFoundError:
        info = None
    same_filter = info is not None and (info.config.filter_subject or None) == filter_subject
    same_wait = info is not None and abs((info.config.ack_wait or 0) - ack_wait) < 0.001
    if same_filter and same_wait:
        return ProvisionNote("consumer", name, "exists")
    config = js_api.ConsumerConfig(
        durable_name=durable,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        deliver_policy=js_api.DeliverPolicy.ALL,
        filter_subject=filter_subject,
        max_ack_pending=100_000,
        max_waiting=16,
    )
    if info is None:
        await js.add_consumer(stream, config)
        return ProvisionNote("consumer", name, "created")
    try:
        await js.add_consumer(stream, config)  # no action given: the server updates it
    except Exception as exc:  # an older server may refuse: the old config still works
        log.warning("nats.consumer_update_failed consumer=%s error=%r", name, exc)
        return ProvisionNote("consumer", name, "exists", f"config kept: {exc}")
    return ProvisionNote(
        "consumer", name, "updated", f"filter {filter_subject or 'none'}, ack wait {ack_wait:g} s"
    )


def nodedup_stream(settings: Settings) -> str:
    """The empty stream the delay lane sources so its duplicate window may be 0."""
    return f"{settings.intake_stream}_NODEDUP"


def lane_config(settings: Settings, dedup_off: bool) -> js_api.StreamConfig:
    """The delay lane: a work queue with no duplicate window where the server allows it (a
    source on the empty `nodedup_stream`), else the shortest window it accepts. A window
    shared by every producer would let whoever publishes a `Nats-Msg-Id` first make the
    server drop another producer's task; the daemon's own id rule judges resends instead."""
    return js_api.StreamConfig(
        name=settings.intake_stream,
        subjects=[settings.intake_subject],
        retention=js_api.RetentionPolicy.WORK_QUEUE,
        storage=js_api.StorageType.FILE,
        duplicate_window=0 if dedup_off else FALLBACK_WINDOW,
        sources=[js_api.StreamSource(name=nodedup_stream(settings))] if dedup_off else None,
        num_replicas=settings.stream_replicas,
    )


def stream_configs(
    settings: Settings, embedded: bool, dedup_off: bool = False
) -> list[js_api.StreamConfig]:
    """The streams the daemon provisions: intake, dead letters, and (embedded only) MQ_TASKS."""
    file = js_api.StorageType.FILE
    configs = [
        lane_config(settings, dedup_off),
        js_api.StreamConfig(
            name=settings.dlq_stream,
            subjects=[settings.dlq_subject_prefix + ".>"],
            retention=js_api.RetentionPolicy.LIMITS,
            storage=file,
            max_age=settings.dlq_max_age.total_seconds(),
            duplicate_window=120,
            num_replicas=settings.stream_replicas,
        ),
    ]
    if embedded:
        configs.append(
            js_api.StreamConfig(
                name=settings.tasks_stream,
                subjects=list(DEV_WORK_SUBJECTS),
                retention=js_api.RetentionPolicy.WORK_QUEUE,
                storage=file,
                duplicate_window=120,
                num_replicas=settings.stream_replicas,
            )
        )
    return configs


# How the start-up log explains the empty stream (docs/operations.md quotes it)
NODEDUP_DETAIL = (
    "sealed, empty on purpose: the delay lane sources it, which lets the lane keep no "
    "duplicate window (docs/operations.md)"
)


async def ensure_nodedup_stream(
    js: JetStreamContext, name: str, replicas: int = 1
) -> ProvisionNote:
    """The empty stream the delay lane sources: its only subject is its own name, and it is
    sealed (a sealed stream refuses every publish and delete, for good), so it stays empty.

    Instances starting together race here: one may seal the stream between another's read and
    its update (nats-server then refuses the update: 10052, a seal cannot be undone) or create
    it first. A refused step is judged by reading the stream again: sealed by another is done."""
    for attempt in range(3):
        try:
            return await _seal_nodedup_stream(js, name, replicas)
        except js_errors.APIError:
            info = await _stream_or_none(js, name)
            if info is not None and info.config.sealed:
                return ProvisionNote("stream", name, "exists")
            if attempt == 2:
                raise
    raise AssertionError("unreachable")  # the loop returns or raises


async def _stream_or_none(js: JetStreamContext, name: str) -> js_api.StreamInfo | None:
    try:
        return await js.stream_info(name)
    except NotFoundError:
        return None


async def _seal_nodedup_stream(js: JetStreamContext, name: str, replicas: int) -> ProvisionNote:
    """Create `name` if missing, then seal it (a stream cannot be created sealed)."""
    info = await _stream_or_none(js, name)
    if info is not None and info.config.sealed:
        return ProvisionNote("stream", name, "exists")
    status = "updated" if info is not None else "created"
    if info is None:
        config = js_api.StreamConfig(
            name=name,
            subjects=[name],
            storage=js_api.StorageType.FILE,
            max_msgs=1,
            num_replicas=replicas,
        )
        info = await js.add_stream(config)
    info.config.sealed = True
    await js.update_stream(info.config)
    return ProvisionNote("stream", name, status, NODEDUP_DETAIL)


async def ensure_lane_window(js: JetStreamContext, config: js_api.StreamConfig) -> ProvisionNote:
    """Give an existing delay lane (made by an older version) the window and source of
    `config`, in place: its messages and consumer stay."""
    name = _stream_name(config)
    info = await js.stream_info(name)
    window = info.config.duplicate_window or 0
    have = list(info.config.sources or [])
    want = [src for src in config.sources or [] if src.name not in {h.name for h in have}]
    if abs(window - config.duplicate_window) < 0.001 and not want:
        return ProvisionNote("stream", name, "exists")
    info.config.duplicate_window = config.duplicate_window
    info.config.sources = [*have, *want] or None
    await js.update_stream(info.config)
    detail = f"duplicate window {window:g}s -> {config.duplicate_window:g}s"
    return ProvisionNote("stream", name, "updated", detail)


async def lane_window_warning(bus: NatsBus, stream: str) -> str | None:
    """A warning when the delay lane `stream` keeps a duplicate window (None when it has
    none): for that long, a publish whose `Nats-Msg-Id` another producer used first is
    dropped by the server (PubAck `duplicate: true`), never seen by the daemon."""
    assert bus.js is not None
    window = (await bus.js.stream_info(stream)).config.duplicate_window or 0
    if window <= 0:
        return None
    version = bus.server_version
    exposure = (
        f"the delay lane {stream} keeps a {window:g}s duplicate window: a publish carrying a "
        "Nats-Msg-Id that another producer used within it is dropped by the server (PubAck "
        "duplicate: true) and never reaches the scheduler"
    )
    if not bus.can_disable_dedup():
        return f"nats-server {version} cannot turn it off (2.14 and later can): {exposure}"
    return (
        f"{exposure}; nats-server {version} can turn it off: let SCHEDULER_PROVISION=true "
        f"update the lane, or set its duplicate_window to 0 with a source on an empty stream "
        "(docs/operations.md, 'The delay lane's duplicate window')"
    )


async def ensure_dev_subjects(js: JetStreamContext, config: js_api.StreamConfig) -> None:
    """Add to an existing embedded work stream the subjects a newer version captures (a data
    dir from before keeps working with the docs' examples)."""
    info = await js.stream_info(_stream_name(config))
    missing = [x for x in config.subjects or [] if x not in (info.config.subjects or [])]
    if missing:
        info.config.subjects = [*(info.config.subjects or []), *missing]
        await js.update_stream(info.config)
        log.info("nats.provision stream=%s added_subjects=%s", config.name, ",".join(missing))


async def provision(bus: NatsBus, embedded: bool) -> list[ProvisionNote]:
    """Create what is missing; report streams that another stream's subjects already cover.
    A server that cannot place SCHEDULER_STREAM_REPLICAS replicas raises ConfigError naming it."""
    try:
        return await _provision(bus, embedded)
    except js_errors.APIError as exc:
        want = bus.settings.stream_replicas
        text = str(exc.description or exc)
        if want > 1 and any(w in text for w in ("replicas", "peers", "clustered", "resources")):
            raise ConfigError(
                "SCHEDULER_STREAM_REPLICAS",
                f"{want}, but {bus.settings.redacted_nats_url} refused it ({text}): a JetStream "
                f"cluster of at least {want} nodes is needed",
            ) from None
        raise


async def _provision(bus: NatsBus, embedded: bool) -> list[ProvisionNote]:
    assert bus.js is not None
    s = bus.settings
    dedup_off = bus.can_disable_dedup()
    configs = stream_configs(s, embedded, dedup_off)
    first = []
    if dedup_off:
        first.append(await ensure_nodedup_stream(bus.js, nodedup_stream(s), s.stream_replicas))
    notes = [await ensure_stream(bus.js, cfg) for cfg in configs]
    if embedded and notes[-1].status == "exists":
        await ensure_dev_subjects(bus.js, configs[-1])
    if notes[0].status == "exists":
        notes[0] = await ensure_lane_window(bus.js, configs[0])
    intake_stream = s.intake_stream
    if notes[0].status == "covered":
        intake_stream = notes[0].detail
        log.warning(
            "nats.intake_covered stream=%s hint='set SCHEDULER_INTAKE_STREAM=%s'",
            intake_stream,
            intake_stream,
        )
    # On a stream of its own the consumer takes no filter: nats-server stores a subject with a
    # DEL byte (0x7f) but never hands it to a consumer filtered on `mq.delay.>`, so a filter
    # would leave such a message on the lane, unseen (and undead-lettered), forever. A stream
    # that covers more than the lane needs the filter.
    dedicated = notes[0].status != "covered" and await _captures_only(
        bus.js, intake_stream, s.intake_subject
    )
    notes.append(
        await ensure_consumer(
            bus.js,
            intake_stream,
            s.intake_consumer,
            None if dedicated else s.intake_subject,
            s.intake_ack_wait.total_seconds(),
        )
    )
    notes.append(await ensure_bucket(bus.js, s.leader_bucket, s.lease_ttl, s.stream_replicas))
    notes.append(await ensure_bucket(bus.js, s.state_bucket, None, s.stream_replicas))
    notes = [*first, *notes]
    for note in notes:
        log.info(
            "nats.provision kind=%s name=%s status=%s %s",
            note.kind,
            note.name,
            note.status,
            note.detail,
        )
    return notes
