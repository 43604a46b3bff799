"""The request-reply API: NATS micro service `mq-scheduler` on `scheduler.v1.<verb>.<rest>`.

The `<rest>` of the subject names the task's target `mq.<rest>`, so NATS permissions on these
subjects bound whose tasks a caller may touch. Replies are JSON; errors carry a code and a
message: `{"error": {"code": "bad_request", "message": "..."}}`. An unexpected failure answers
code `internal` with an error id, and the server logs the exception once under that id: no
exception text reaches a caller.

The verbs keep a pace (`scheduler.api.pace`, `SCHEDULER_API_MAX_READS_PER_SECOND` requests a
second per edge process, a whole second's worth at once, so a client's burst of a few hundred
cancels goes through): a request past it is dropped
unanswered before its body is read or PostgreSQL asked, so the caller sees its own timeout,
as from any overloaded service, and a client flooding `get` or `stats` costs the edge a
bounded share of a core (7,000 a second, each a PostgreSQL read, doubled firing's p99 on a
2-core host). Drops are counted in one log line a second (`api.nats_paced dropped=N`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from scheduler import __version__
from scheduler.api.pace import Pace
from scheduler.clock import Clock
from scheduler.errors import EnvelopeError, RequestError, TargetRefusedError
from scheduler.messages.envelope import ID_RULE, duplicate_key, valid_id
from scheduler.messages.subjects import check_target, target_from_rest
from scheduler.operations.ports import WriteFailed
from scheduler.operations.tasks import TaskOperations, parse_due
from scheduler.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "scheduler.v1"
Handler = Callable[[str, dict[str, Any], bytes], Awaitable[dict[str, Any]]]


class SchedulerService:
    """Handlers of the micro service; every instance serves them (they work on PostgreSQL).

    Cancel, reschedule and get call `scheduler.operations.tasks`, as the HTTP API does."""

    def __init__(
        self,
        nc: Client,
        settings: Settings,
        tasks: TaskOperations,
        clock: Clock,
        stats: Callable[[], dict[str, Any]],
        leader: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.tasks = tasks
        self.clock = clock
        self.stats = stats
        self.leader = leader
        self.service: Service | None = None
        self.pace = Pace(settings.api_max_reads_per_second, burst=1.0)
        self.dropped = 0  # requests past the pace, since the last log line
        self._said_at = 0.0

    def _paced(self) -> bool:
        """Whether a request may be handled now; one past the pace is dropped (module doc)."""
        if self.pace.take():
            return True
        self.dropped += 1
        now = time.monotonic()
        if now - self._said_at >= 1.0:
            log.warning("api.nats_paced dropped=%d", self.dropped)
            self.dropped, self._said_at = 0, now
        return False

    async def start(self) -> None:
        self.service = await add_service(
            self.nc,
            name="mq-scheduler",
            version=__version__,
            description="delayed delivery and cron scheduling for hanzo.mq.v1 tasks",
        )
        verbs: dict[str, Handler] = {
            "schedule": self.schedule,
            "cancel": self.cancel,
            "reschedule": self.reschedule,
            "get": self.get,
        }
        for verb, handler in verbs.items():
            await self.service.add_endpoint(
                name=verb, subject=f"{PREFIX}.{verb}.>", handler=self._wrap(verb, handler)
            )
        await self.service.add_endpoint(
            name="stats", subject=f"{PREFIX}.stats", handler=self._stats
        )
        if self.leader is not None:
            await self.service.add_endpoint(
                name="leader", subject=f"{PREFIX}.leader", handler=self._leader
            )
        # The subscriptions are only queued so far: once the server has them, a request made
        # after start-up finds a responder (not `no responders` on a busy host).
        await self.nc.flush()

    async def stop(self) -> None:
        if self.service is not None and not self.nc.is_closed:  # closed: nothing to undo
            await self.service.stop()

    def _wrap(self, verb: str, handler: Handler) -> Callable[[Request], Awaitable[None]]:
        prefix = f"{PREFIX}.{verb}."

        async def run(req: Request) -> None:
            if not self._paced():
                return
            try:
                target = check_target(
                    target_from_rest(req.subject[len(prefix) :]), self.settings.target_allow
                )
                body = _body(req.data) if verb != "schedule" else {}
                reply = await handler(target, body, req.data)
            except (TargetRefusedError, EnvelopeError) as exc:
                reply = _error("bad_request", str(exc))
            except RequestError as exc:
                reply = _error(exc.code, str(exc))
            except ValueError as exc:
                reply = _error("bad_request", f"body is not JSON: {exc}")
            except WriteFailed as exc:  # the delay lane did not take the task
                reply = _error("unavailable", _unwritten(exc))
            except Exception:  # the caller gets a code and an id, the log the exception
                reply = _internal(verb, req.subject)
            log.info(
                "api.%s subject=%s result=%s",
                verb,
                req.subject,
                reply.get("status") or reply.get("error"),
            )
            await req.respond(json.dumps(reply, default=str).encode())

        return run

    async def _stats(self, req: Request) -> None:
        if not self._paced():
            return
        await req.respond(json.dumps(self.stats(), default=str).encode())

    async def _leader(self, req: Request) -> None:
        """What `GET /v1/leader` answers: who leads (P = 1) and the partition map."""
        if not self._paced() or self.leader is None:
            return
        try:
            reply = await self.leader()
        except Exception:  # the caller gets a code and an id, the log the exception
            reply = _internal("leader", req.subject)
        await req.respond(json.dumps(reply, default=str).encode())

    async def schedule(self, target: str, _: dict[str, Any], raw: bytes) -> dict[str, Any]:
        """Validate and put the envelope on the delay lane; it is durable once this returns."""
        return (await self.tasks.schedule(target, raw)).model_dump()

    async def cancel(self, target: str, body: dict[str, Any], _: bytes) -> dict[str, Any]:
        return (await self.tasks.cancel(_task_id(body), target)).as_reply()

    async def reschedule(self, target: str, body: dict[str, Any], _: bytes) -> dict[str, Any]:
        task_id, due = _task_id(body), parse_due(body.get("delay_until"))
        return (await self.tasks.reschedule(task_id, due, target)).as_reply()

    async def get(self, target: str, body: dict[str, Any], _: bytes) -> dict[str, Any]:
        task = await self.tasks.get(_task_id(body), target)
        if task is None:
            return {"status": "not_found", "id": body.get("id")}
        return {"status": "found", "task": task.model_dump(mode="json")}


def _body(data: bytes) -> dict[str, Any]:
    """A verb's JSON object body; RequestError for another value or a key named twice."""
    body = json.loads(data)
    if not isinstance(body, dict):
        raise RequestError("bad_request", "body must be a JSON object")
    key = duplicate_key(data)
    if key is not None:
        raise RequestError("bad_request", f"{key}: appears more than once in the body", key)
    return body


def _task_id(body: dict[str, Any]) -> str:
    task_id = body.get("id")
    if not isinstance(task_id, str):
        raise RequestError("bad_request", f"id: must be a string ({ID_RULE})", "id")
    if not valid_id(task_id):
        shown = json.dumps(task_id[:40]) + ("..." if len(task_id) > 40 else "")
        raise RequestError("bad_request", f"id: {ID_RULE} (got {shown})", "id")
    return task_id


def _internal(verb: str, subject: str) -> dict[str, Any]:
    """Log the exception being handled once, under a fresh id, and the reply naming only it."""
    error_id = uuid.uuid4().hex[:12]
    log.exception("api.%s.failed subject=%s error_id=%s", verb, subject, error_id)
    return _error("internal", f"the request failed on the server (error id {error_id}, in its log)")


def _unwritten(exc: WriteFailed) -> str:
    if exc.maybe_stored:
        return (
            f"the delay lane did not acknowledge the task ({exc}): it may or may not be "
            "scheduled; send it again (intake takes an exact resend as a no-op)"
        )
    return f"the delay lane refused the task ({exc}): it is not scheduled"


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}
