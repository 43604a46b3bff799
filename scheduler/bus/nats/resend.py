"""Resending a publish that no stream took while its stream elects a leader.

When the node leading a replicated stream dies, the stream has no leader for the raft election
(4-10 s on nats-server 2.10-2.15): nobody subscribes to its subjects, and every publish is
answered at once with a 503 "no responders". Such a publish stored nothing. Failing it hands
the task to the engine's retry backoff (1 s, 2 s, 4 s...), so the tasks caught in the election
went out seconds after the stream took writes again. nats.go resends on no-responders (twice,
250 ms apart); here a 503 for a subject that a stream has acknowledged before (so it *is*
captured: a subject no stream captures still fails at once, "no stream captures ...") is resent,
the same frame (same `Nats-Msg-Id`, same reply token), after a pause doubling from
`FIRST_PAUSE` to `MAX_PAUSE`, for as long as the publish's own deadline allows. Every resend is
checked against the fence first, like any send. A task therefore goes out within `MAX_PAUSE` of
its stream taking writes again.

A publish can also go unanswered on a link that works: a node that resumes after a stop (SIGSTOP,
a VM pause) can drop what it was routing while its routes recover, and its sender would wait
for the whole PubAck timeout (5 s; measured: two tasks 5 s late). A frame unanswered for
`HEDGE_AFTER` while a publish sent after it has been answered (so the link and the servers are
answering: this is not a slow server, where later publishes wait too) is sent again, the same
frame, at most every `HEDGE_AFTER` doubling (`hedge`); the target stream's duplicate window
keeps one copy, and the first answer settles the publish. Only a frame with a `Nats-Msg-Id` is
sent again while it may have been stored (here and after a reconnect, `again`): a KV write
without one (a cron cursor) could be stored twice, the second copy after a newer write.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

FIRST_PAUSE = 0.025  # s before the first resend
MAX_PAUSE = 0.25  # s between resends at most: how late after the election a task can go out
HEDGE_AFTER = 0.5  # s unanswered, while later publishes were answered, before a frame goes again
MAX_KNOWN_SUBJECTS = 10_000
_MSG_ID = b"\r\nNats-Msg-Id: "  # subjects remembered as captured; forgotten all at once past it


def idempotent(frame: bytes) -> bool:
    """Whether an `HPUB` frame's header block carries a `Nats-Msg-Id` (a second copy is
    dropped by the stream's duplicate window)."""
    return frame.find(_MSG_ID, 0, frame.find(b"\r\n\r\n")) >= 0


class Resends:
    """The frames of unacknowledged publishes (by reply token), the subjects known to be
    captured, and the resends scheduled on the loop's clock."""

    __slots__ = ("_attempts", "_due", "_hedges", "captured", "frames")

    def __init__(self) -> None:
        self.frames: dict[str, bytes] = {}
        self.captured: set[str] = set()
        self._attempts: dict[str, int] = {}
        self._due: list[tuple[float, str]] = []
        self._hedges: dict[str, tuple[int, float]] = {}  # token -> (sent again, next allowed)

    def keep(self, token: str, frame: bytes) -> None:
        """Remember the frame sent for `token` until its outcome (`forget`)."""
        self.frames[token] = frame

    def forget(self, token: str) -> None:
        if self.frames.pop(token, None) is not None:
            if self._attempts:
                self._attempts.pop(token, None)
            if self._hedges:
                self._hedges.pop(token, None)

    def learned(self, subject: str) -> None:
        """A stream acknowledged a publish to `subject`: it is captured."""
        captured = self.captured
        if subject not in captured:
            if len(captured) >= MAX_KNOWN_SUBJECTS:
                captured.clear()
            captured.add(subject)

    def schedule(self, token: str, subject: str, now: float, deadline: float) -> bool:
        """Plan a resend of `token` (answered 503) if its subject is captured, its frame known
        and the pause ends before `deadline`; False when it should fail now instead."""
        if subject not in self.captured or token not in self.frames:
            return False
        attempt = self._attempts.get(token, 0)
        at = now + min(FIRST_PAUSE * 2.0**attempt, MAX_PAUSE)
        if at >= deadline:
            return False
        self._attempts[token] = attempt + 1
        heapq.heappush(self._due, (at, token))
        return True

    def again(self, tokens: Iterable[str], now: float) -> None:
        """Plan a resend at `now` of every token whose frame is kept and carries a
        `Nats-Msg-Id` (the link it went out on was replaced: its answer cannot come on the new
        one)."""
        for token in tokens:
            frame = self.frames.get(token)
            if frame is not None and idempotent(frame):
                heapq.heappush(self._due, (now, token))

    def hedge(self, token: str, now: float) -> bool:
        """Plan a resend at `now` of `token`, unanswered past `HEDGE_AFTER` while later
        publishes were answered, unless its frame is gone or it was sent again less than
        `HEDGE_AFTER * 2**n` ago (n resends so far); True when planned."""
        frame = self.frames.get(token)
        if frame is None or token in self._attempts or not idempotent(frame):
            return False  # gone, not idempotent, or already resent for a 503
        count, allowed = self._hedges.get(token, (0, now))
        if now < allowed:
            return False
        self._hedges[token] = (count + 1, now + HEDGE_AFTER * 2.0 ** (count + 1))
        heapq.heappush(self._due, (now, token))
        return True

    def next_at(self) -> float | None:
        """When the earliest planned resend is due (loop clock), or None."""
        return self._due[0][0] if self._due else None

    def take_due(self, now: float) -> list[tuple[str, bytes]]:
        """The (token, frame) of every resend due by `now` whose frame is still kept."""
        out = []
        while self._due and self._due[0][0] <= now:
            _, token = heapq.heappop(self._due)
            frame = self.frames.get(token)
            if frame is not None:
                out.append((token, frame))
        return out
