"""A small producer helper: publish delayed tasks, cancel, reschedule and look them up.

from scheduler import client
await client.publish_delayed(js, "mq.inference.chat", envelope_dict)
await client.cancel(nc, "mq.inference.chat", task_id)      # "cancelled" | "too_late" | ...
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck

DELAY_PREFIX = "mq.delay."
API_PREFIX = "scheduler.v1"


def _rest(target: str) -> str:
    if not target.startswith("mq.") or len(target) <= 3:
        raise ValueError(f"target {target!r} must be a subject under mq.")
    return target[3:]


def delay_subject(target: str) -> str:
    """`mq.inference.chat` -> `mq.delay.inference.chat`."""
    return DELAY_PREFIX + _rest(target)


async def publish_delayed(
    js: JetStreamContext,
    target: str,
    envelope: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
) -> PubAck:
    """Publish a task to the delay lane for `target`, without `Nats-Msg-Id`.

    The lane is one stream shared by every producer and its duplicate window is per stream:
    a message id would let whoever published it first make JetStream drop this task before the
    daemon sees it (nats-server 2.10 cannot turn the window off). The daemon's own id rule
    makes a retry safe instead: an exact resend is a no-op, other bytes under a taken id are
    refused `duplicate_id` and dead-lettered."""
    raw = envelope if isinstance(envelope, bytes) else json.dumps(envelope).encode()
    extra = {k: v for k, v in (headers or {}).items() if k.lower() != "nats-msg-id"}
    return await js.publish(delay_subject(target), raw, headers=extra or None)


async def _call(
    nc: Client, verb: str, target: str, body: dict[str, Any], timeout: float
) -> dict[str, Any]:
    reply = await nc.request(
        f"{API_PREFIX}.{verb}.{_rest(target)}", json.dumps(body).encode(), timeout=timeout
    )
    return dict(json.loads(reply.data))


async def cancel(nc: Client, target: str, task_id: str, timeout: float = 2.0) -> dict[str, Any]:
    """Cancel a pending task: `cancelled` (no delivery will happen), `too_late` or `not_found`."""
    return await _call(nc, "cancel", target, {"id": task_id}, timeout)


async def reschedule(
    nc: Client, target: str, task_id: str, when: datetime, timeout: float = 2.0
) -> dict[str, Any]:
    """Move a pending task to `when` (aware datetime)."""
    return await _call(
        nc, "reschedule", target, {"id": task_id, "delay_until": _iso(when)}, timeout
    )


def _iso(when: datetime) -> str:
    if when.tzinfo is None:
        raise ValueError("naive datetime: give a time zone")
    return when.isoformat()


async def get(nc: Client, target: str, task_id: str, timeout: float = 2.0) -> dict[str, Any]:
    """A task's state: status, due time, attempts, when it fired."""
    return await _call(nc, "get", target, {"id": task_id}, timeout)


async def schedule(
    nc: Client, target: str, envelope: dict[str, Any], timeout: float = 2.0
) -> dict[str, Any]:
    """Schedule through the API (validated before the reply): returns id and due time."""
    reply = await nc.request(
        f"{API_PREFIX}.schedule.{_rest(target)}", json.dumps(envelope).encode(), timeout=timeout
    )
    return dict(json.loads(reply.data))
