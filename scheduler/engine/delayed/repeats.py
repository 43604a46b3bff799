"""Exact resends on the delay lane, known without PostgreSQL.

The lane stores every publish (it keeps no duplicate window: the daemon's id rule decides, see
`engine.delayed.intake`), so a producer that resends a publish its PubAck did not answer puts
each copy on the lane. After an outage that is most of the backlog: a producer resending every
second through an 8-14 s freeze of the lane's leader left 9,400 copies among 13,400 messages
(bench/cluster_faults.py, sigstop), and intake judged each one like a new task, envelope
validation and two statements per batch, at about 3,500 messages a second on the 2-core host:
the tasks behind the copies fell due while they waited, up to 2.9 s late.

A copy repeats its task exactly: the same subject (so the same target) and the same bytes (so
the same envelope and id), which is what the id rule calls an exact resend, a no-op that is
acked. `Repeats` remembers that key, one digest of the subject and the bytes, for the tasks
intake committed lately (stored, or found stored already), and intake acks a message with a key it
knows before it validates anything. A message whose key it does not know (another task with
the same id, other bytes, a copy of a task not committed yet) goes the whole way, as before.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable

from scheduler.engine.ports import Delivery

Key = bytes

# Keys kept (about 100 bytes each with the dict's slot): at 1,000 tasks a second, the last
# 100 s of intake, longer than a producer resending every second goes on through any election
# (4-10 s). As a `(subject, digest)` pair a key took about 230 bytes, 23 MB for the 100,000
# (the subject string kept alive per key): what took the engine's RSS over 200 MB while a
# million tasks due at one instant went through intake (bench/README.md, host P).
REMEMBER = 100_000


def key_of(msg: Delivery) -> Key | None:
    """The message's key, a 16-byte digest of its subject and bytes (a subject holds no
    whitespace, so the newline between them keeps every pair apart), or None for a message
    that must be judged whatever its bytes (its subject or headers could not be decoded:
    intake dead-letters it)."""
    if getattr(msg, "defect", None) is not None:
        return None
    digest = hashlib.blake2b(msg.subject.encode(), digest_size=16)
    digest.update(b"\n")
    digest.update(msg.data)
    return digest.digest()


class Repeats:
    """The keys of the tasks intake committed lately, the oldest forgotten past `remember`."""

    __slots__ = ("_keys", "remember")

    def __init__(self, remember: int = REMEMBER) -> None:
        self.remember = remember
        self._keys: dict[Key, None] = {}  # in insertion order: the oldest first

    def __len__(self) -> int:
        return len(self._keys)

    def known(self, key: Key | None) -> bool:
        return key is not None and key in self._keys

    def add(self, keys: Iterable[Key | None]) -> None:
        """Remember `keys` (those of committed tasks), forgetting the oldest past the bound."""
        held = self._keys
        for key in keys:
            if key is not None:
                held.pop(key, None)
                held[key] = None
        over = len(held) - self.remember
        if over > 0:
            for old in list(itertools.islice(held, over)):
                del held[old]
