"""The in-memory twin of PostgreSQL's clock (`scheduler.operations.stores.DatabaseTime`): the
database is asked nothing, so the question is answered at once by the clock it is given, as a
database on this host with no round trip would. tests/contracts/test_database_time.py holds it
and `scheduler.store.postgres.epoch.database_time` to the same answers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime


class MemoryDatabaseTime:
    def __init__(self, now: Callable[[], datetime]) -> None:
        self.now = now

    async def __call__(self) -> tuple[datetime, datetime, datetime]:
        sent = self.now()
        theirs = self.now()
        return sent, theirs, self.now()
