"""Replicas of what the daemon provisions: the check at start and the move to N replicas.

`SCHEDULER_STREAM_REPLICAS` (1 by default, 3 on a production cluster) is the `num_replicas` of
every stream and KV bucket the daemon creates: the delay lane (and the sealed empty stream it
sources), `MQ_DLQ`, `MQ_TASKS` in embedded mode, and the lease and state buckets (streams
`KV_<bucket>`). Provisioning only creates what is missing, so an existing deployment keeps its
replicas until `scheduler provision --replicas N` (`move_replicas`) edits each stream in place:
nats-server copies the data to the new peers (or drops peers) while the stream keeps working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js import errors as js_errors
from nats.js.errors import NotFoundError

from scheduler.bus.nats.connection import nodedup_stream
from scheduler.errors import ConfigError
from scheduler.settings import Settings

log = logging.getLogger(__name__)

SETTING = "SCHEDULER_STREAM_REPLICAS"


@dataclass(frozen=True, slots=True)
class Replicas:
    """A provisioned stream (or a bucket's stream) and its replicas (`have`; None: missing)."""

    stream: str
    have: int | None


def provisioned_streams(settings: Settings, embedded: bool) -> list[str]:
    """The names of the streams the daemon provisions, buckets as their `KV_<bucket>` stream."""
    s = settings
    names = [nodedup_stream(s), s.intake_stream, s.dlq_stream]
    if embedded:
        names.append(s.tasks_stream)
    return [*names, f"KV_{s.leader_bucket}", f"KV_{s.state_bucket}"]


async def current_replicas(js: JetStreamContext, streams: list[str]) -> list[Replicas]:
    """Each stream's configured replicas, None for one that does not exist."""
    out = []
    for name in streams:
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            out.append(Replicas(name, None))
            continue
        out.append(Replicas(name, int(info.config.num_replicas or 1)))
    return out


def describe(stream: str) -> str:
    """`stream MQ_DLQ` or `bucket scheduler_leader` (for a `KV_` stream)."""
    return f"bucket {stream[3:]}" if stream.startswith("KV_") else f"stream {stream}"


async def replicas_warning(js: JetStreamContext, settings: Settings, embedded: bool) -> str | None:
    """A warning naming every provisioned stream or bucket whose replicas differ from
    SCHEDULER_STREAM_REPLICAS (None when all match; missing ones are provisioning's business)."""
    want = settings.stream_replicas
    found = await current_replicas(js, provisioned_streams(settings, embedded))
    off = [f"{describe(r.stream)} has {r.have}" for r in found if r.have not in (None, want)]
    if not off:
        return None
    why = (
        f"{SETTING}={want} but {', '.join(off)}: run `scheduler provision --replicas {want}` "
        "to move them (docs/deploy.md, 'Replicas')"
    )
    log.warning("nats.replicas_differ %s", why)
    return why


async def move_replicas(js: JetStreamContext, streams: list[str], replicas: int) -> list[str]:
    """Set `num_replicas` of each existing stream in `streams` to `replicas`, in place; one line
    per stream saying what was done. A server that cannot (a single server asked for more than
    one, too few nodes) raises ConfigError naming the stream and the server's words."""
    lines = []
    for name in streams:
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            lines.append(f"{describe(name)}: missing (SCHEDULER_PROVISION=true creates it)")
            continue
        have = int(info.config.num_replicas or 1)
        if have == replicas:
            lines.append(f"{describe(name)}: {have} replicas, unchanged")
            continue
        info.config.num_replicas = replicas
        try:
            await js.update_stream(info.config)
        except js_errors.APIError as exc:
            raise ConfigError(
                "--replicas",
                f"{replicas}: nats-server refused it for {describe(name)} "
                f"({exc.description or exc}); it stays at {have}",
            ) from None
        log.info("nats.replicas_moved stream=%s from=%d to=%d", name, have, replicas)
        lines.append(f"{describe(name)}: {have} -> {replicas} replicas")
    return lines
