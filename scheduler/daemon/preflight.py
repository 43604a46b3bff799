"""The daemon's start-up checks: things that would make it unsafe, or silently slow, to run.

Each returns a warning to show in `/readyz` (None when all is well) or raises ConfigError naming
the setting to change when running would be unsafe.
"""

from __future__ import annotations

import ipaddress
import logging

from scheduler.bus.nats.connection import NatsBus
from scheduler.bus.nats.replicas import replicas_warning
from scheduler.errors import ConfigError
from scheduler.settings import Settings

log = logging.getLogger(__name__)


def check_server_version(bus: NatsBus, settings: Settings) -> str | None:
    """nats-server older than the oldest supported: refused unless SCHEDULER_ALLOW_UNSAFE_NATS
    (an unparseable version only warns)."""
    problem = bus.version_problem()
    log.info("nats.server_version version=%s", bus.server_version)
    if problem is None:
        return None
    if bus.version_known() and not settings.allow_unsafe_nats:
        raise ConfigError(
            "SCHEDULER_NATS_URL",
            f"{problem}; upgrade the server, or set SCHEDULER_ALLOW_UNSAFE_NATS=true to run anyway",
        )
    log.warning("nats.server_too_old %s", problem)
    return problem


async def check_lease_bucket(bus: NatsBus, settings: Settings) -> str | None:
    """The lease bucket's TTL must equal the lease TTL, else two leaders or slow takeovers."""
    assert bus.js is not None
    s = settings
    try:
        info = await bus.js.stream_info(f"KV_{s.leader_bucket}")
    except Exception as exc:
        raise ConfigError(
            "SCHEDULER_LEADER_BUCKET",
            f"KV bucket {s.leader_bucket!r} is missing ({exc!r}); "
            "create it (SCHEDULER_PROVISION=true does) with TTL = SCHEDULER_LEASE_TTL",
        ) from exc
    ttl = info.config.max_age or 0.0
    if ttl <= 0 or ttl < s.lease_ttl - 0.001:
        raise ConfigError(
            "SCHEDULER_LEASE_TTL",
            f"{s.lease_ttl:g}s, but KV bucket {s.leader_bucket!r} has TTL {ttl:g}s; a lease "
            "would outlive no deadline or expire while its holder still acts. Recreate the "
            "bucket with TTL = the lease TTL, or set the lease TTL to the bucket's",
        )
    if ttl > s.lease_ttl + 0.001:
        why = (
            f"KV bucket {s.leader_bucket!r} has TTL {ttl:g}s, longer than the lease TTL "
            f"{s.lease_ttl:g}s: safe, but a crashed leader is replaced only after {ttl:g}s"
        )
        log.warning("leader.bucket_ttl_long %s", why)
        return why
    return None


async def check_replicas(bus: NatsBus, settings: Settings, embedded: bool) -> str | None:
    """Every provisioned stream and bucket should have SCHEDULER_STREAM_REPLICAS replicas: one
    with fewer loses its data (and stops) with a node; the warning names each that differs."""
    assert bus.js is not None
    return await replicas_warning(bus.js, settings, embedded)


def check_api_exposure(settings: Settings) -> str | None:
    """Open reads are fine on loopback; on any other address say so, loudly, once."""
    s = settings
    if is_loopback(s.http_host) or s.read_token is not None or s.admin_token is not None:
        return None
    why = (
        f"the management API listens on {s.http_host} and no SCHEDULER_READ_TOKEN or "
        "SCHEDULER_ADMIN_TOKEN is set: anyone who reaches it can read tasks and schedules"
    )
    log.warning("api.open_reads %s", why)
    return why


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False
