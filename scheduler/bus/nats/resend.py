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

After a reconnect the frames still unanswered are sent again on the new link (`again`), but only
those with a `Nats-Msg-Id`, which the stream's duplicate window drops when the first copy was
stored: a KV write without one (a cron cursor) could be stored twice, the second copy after a
newer write of the same key.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

FIRST_PAUSE = 0.025  # s before the first resend
MAX_PAUSE = 0.25  # s between resends at most: how late after the election a task can go out
MAX_KNOWN_SUBJECTS = 10_000  # subjects remembered as captured; forgotten all at once past it
_MSG_ID = b"\r\nNats-Msg-Id: "


def idempotent(frame: bytes) -> bool:
    """Whether an `HPUB` frame's header block carries a `Nats-Msg-Id` (a second copy is
    dropped by the stream's duplicate window)."""
    return frame.find(_MSG_ID, 0, frame.find(b"\r\n\r\n")) >= 0


class Resends:
    """The frames of unacknowledged publishes (by reply token), the subjects known to be
    captured, and the resends scheduled on the loop's clock."""

    __slots__ = ("_attempts", "_due", "captured", "frames")

    def __init__(self) -> None:
        self.frames: dict[str, bytes] = {}
        self.captured: set[str] = set()
        self._attempts: dict[str, int] = {}
        self._due: list[tuple[float, str]] = []

    def keep(self, token: str, frame: bytes) -> None:
        """Remember the frame sent for `token` until its outcome (`forget`)."""
        self.frames[token] = frame

    def forget(self, token: str) -> None:
        if self.frames.pop(token, None) is not None and self._attempts:
            self._attempts.pop(token, None)

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
        one; a frame without an id may have been stored, and is left to its timeout)."""
        for token in tokens:
            frame = self.frames.get(token)
            if frame is not None and idempotent(frame):
                heapq.heappush(self._due, (now, token))

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
