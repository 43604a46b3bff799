"""The books: the outcomes of a flush of publishes, recorded in one go, fenced by the epoch.

The dispatcher (`engine.delayed.dispatch`) gathers outcomes as JetStream acknowledges (or
refuses) each publish, and hands them over every few milliseconds. `Books.book` records them:
the fired (`mark_fired`, the fire log), the expired, then the failed, retried with a backoff
(`retry_later`, back onto the horizon under its lock) or, after `max_attempts` or a permanent
error, killed and copied to the dead letters. A newer leader's epoch (`FencedError`) calls
`on_fenced`. The per-org quota ledger, when on, forgets what is no longer pending.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from scheduler.backoff import backoff_seconds
from scheduler.clock import Clock
from scheduler.engine.delayed.dead_letters import DeadLetter, DeadLetterCopies
from scheduler.engine.delayed.events import DelayedEvents
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.delayed.quota import OrgLedger
from scheduler.engine.ports import TaskRepository
from scheduler.errors import FencedError
from scheduler.records import ClaimedTask, Fired, PubAck, PublishError, TaskRef, ceil_ms, to_ms
from scheduler.settings import Settings

log = logging.getLogger(__name__)


class Books:
    """Records the outcomes of a term's publishes (see the module)."""

    def __init__(
        self,
        *,
        settings: Settings,
        horizon: Horizon,
        tasks: TaskRepository,
        clock: Clock,
        events: DelayedEvents,
        dead: DeadLetterCopies,
        on_fenced: Callable[[int], None],
        on_stream: Callable[[str], None] | None = None,
        ledger: OrgLedger | None = None,
    ) -> None:
        self.settings = settings
        self.horizon = horizon
        self.tasks = tasks
        self.clock = clock
        self._events = events
        self.dead = dead
        self._on_fenced = on_fenced
        self.on_stream = on_stream  # told each target stream that took a delivery
        self.ledger = ledger  # per-org quotas (engine/delayed/quota.py), when on

    async def book(
        self,
        epoch: int,
        outcomes: list[tuple[ClaimedTask, PubAck | PublishError, datetime]],
        expired: list[ClaimedTask],
    ) -> None:
        """Record a flush of outcomes, fenced by `epoch`: the fired (`mark_fired`), the expired,
        then the failed (retried or dead); a newer leader's epoch calls `on_fenced`."""
        fired = [Fired(t, at, r.stream, r.seq) for t, r, at in outcomes if isinstance(r, PubAck)]
        if self.on_stream is not None:
            for stream in {f.stream for f in fired}:
                self.on_stream(stream)
        failed = [(t, r) for t, r, _ in outcomes if isinstance(r, PublishError)]
        try:
            await self.tasks.mark_fired(epoch, fired, self.settings.instance_id)
            await self._expire(epoch, expired)
            await self._retry_or_kill(epoch, failed)
        except FencedError:
            self._on_fenced(epoch)
            return
        if self.ledger is not None:  # fired, expired: no longer pending (dead: in retry_or_kill)
            self.ledger.finished([*(f.task for f in fired), *expired])
        self._events.tasks_fired(fired)

    async def _expire(self, epoch: int, expired: list[ClaimedTask]) -> None:
        if not expired:
            return
        await self.tasks.expire(epoch, [t.id for t in expired])
        self._events.tasks_expired(len(expired))
        for t in expired:
            log.info("task.expired id=%s target=%s expired_at=%s", t.id, t.target, t.expires_at)

    async def _retry_or_kill(
        self, epoch: int, failed: list[tuple[ClaimedTask, PublishError]]
    ) -> None:
        """Retry with backoff, or dead-letter after `max_attempts`. A publish that went out
        unacknowledged leaves its task in doubt (never pending: a cancel must not succeed
        for a task JetStream may hold); its retry republishes under the same message id."""
        if not failed:
            return
        now = self.clock.now()
        dead: list[tuple[ClaimedTask, str, str]] = []
        retry: list[tuple[ClaimedTask, datetime, str, bool]] = []
        for t, e in failed:
            doubt = e.in_doubt or t.doubted
            if e.permanent or t.attempts >= self.settings.max_attempts:
                if doubt:  # the task may have been delivered: say so
                    reason, error = "publish_unconfirmed", f"{e} (it may have been delivered)"
                else:
                    reason, error = e.reason, str(e)
                dead.append((t, error, reason))
            else:
                retry.append((t, ceil_ms(now + self._backoff(t.attempts)), str(e), e.in_doubt))
        await self.horizon.arm(  # under its lock: the loader must not pass a retry unseen
            self.tasks.retry_later(epoch, retry),
            lambda _: [
                TaskRef(t.id, to_ms(due), t.priority, t.seq, t.org_id) for t, due, _, _ in retry
            ],
            wake=False,  # woken below, once the dead ones are recorded too
        )
        for task, _, error, doubt in retry:
            log.warning(
                "publish.retry id=%s target=%s attempt=%d in_doubt=%s error=%s",
                task.id,
                task.target,
                task.attempts,
                doubt or task.doubted,
                error,
            )
        self._events.publishes_retried(len(retry), sum(1 for _, _, _, doubt in retry if doubt))
        if dead:
            await self.tasks.kill(epoch, dead)
            if self.ledger is not None:
                self.ledger.finished(t for t, _, _ in dead)
            await self._dead_letter(dead)
        self.horizon.wake_up()

    def _backoff(self, attempt: int) -> timedelta:
        """First backoff doubling per attempt up to 60 s, with +-20 % jitter."""
        return timedelta(seconds=backoff_seconds(self.settings.backoff.total_seconds(), attempt))

    async def _dead_letter(self, dead: list[tuple[ClaimedTask, str, str]]) -> None:
        self._events.tasks_dead(reason for _, _, reason in dead)
        letters = []
        for task, error, reason in dead:
            log.error(
                "task.dead id=%s target=%s attempts=%d error=%s",
                task.id,
                task.target,
                task.attempts,
                error,
            )
            marks = {"Mq-Target": task.target, "Mq-Attempt": str(task.attempts)}
            letter = DeadLetter(
                task.target, task.payload, task.headers, reason, error, marks, f"dlq:{task.id}"
            )
            letters.append(letter)
        await self.dead.send(letters)
