"""A per-task timeline at DEBUG: where a late task spent its time.

Off unless this module's logger is at DEBUG (`SCHEDULER_LOG_LEVEL=DEBUG`); then each step of a
batch writes one line naming its tasks: `trace.<step> at=<ms> ids=<id>@<ms>,...`, every time in
milliseconds of the wall clock (the store times of the lane and the target stream are the
server's wall clock too, so the lines compare with them). The steps, in a task's order:

- `taken`: intake took the lane's message; `@` its store time on the lane, then its stream
  sequence and delivery count (`/seq/n`),
- `stored`: the batch it came in committed in PostgreSQL (`took=` since it was taken),
- `claimed`: the claim that took it returned (`sent=` when the claim was sent),
- `sent`: the dispatcher handed it to the publisher,
- `acked`: its publish was answered (`@` when; `!` a failure).

`tests/support/timeline.py` reads these lines back into one row per task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

log = logging.getLogger(__name__)


def on() -> bool:
    """Whether the trace is written (callers skip building its lines otherwise)."""
    return log.isEnabledFor(logging.DEBUG)


def now_ms() -> int:
    """The wall clock in ms: what the servers' store times are read against."""
    return int(time.time() * 1000)


def step(name: str, items: Iterable[str], **fields: object) -> None:
    """Write one step's line: its time, `fields` (`key=value`), then its tasks (`items`)."""
    extra = "".join(f" {k}={v}" for k, v in fields.items())
    log.debug("trace.%s at=%d%s ids=%s", name, now_ms(), extra, ",".join(items))
