"""Schema migrations (Alembic, in the repository's `migrations/` folder), run from code."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from scheduler.errors import ConfigError
from scheduler.settings import redact_url
from scheduler.store.postgres.connect import connect, connect_problem

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_ENV = "SCHEDULER_MIGRATIONS_DIR"


def migrations_dir() -> Path:
    """`$SCHEDULER_MIGRATIONS_DIR`, else `migrations/` beside the package, else in the cwd."""
    candidates = [
        os.environ.get(MIGRATIONS_ENV),
        Path(__file__).resolve().parents[2] / "migrations",
        Path.cwd() / "migrations",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "env.py").is_file():
            return Path(candidate)
    raise FileNotFoundError(f"no migrations folder found; set {MIGRATIONS_ENV}")


def alembic_config(dsn: str, application_name: str | None = None) -> Config:
    """An Alembic config for `dsn` (a plain postgresql:// URL; the asyncpg driver is added).
    `application_name` labels the migration's session, so a cancelled run can end it."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    url = "postgresql+asyncpg://" + dsn.split("://", 1)[1]
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["dsn"] = dsn  # what migrations/env.py connects with
    if application_name:
        cfg.attributes["application_name"] = application_name
    return cfg


def upgrade(dsn: str, revision: str = "head", application_name: str | None = None) -> None:
    """Bring the schema up to `revision`; idempotent."""
    from alembic import command

    command.upgrade(alembic_config(dsn, application_name), revision)


def downgrade(dsn: str, revision: str = "base", application_name: str | None = None) -> None:
    from alembic import command

    command.downgrade(alembic_config(dsn, application_name), revision)


_REVISION = re.compile(r"^revision(?:: \w+)? = [\"']([^\"']+)[\"']", re.M)
_DOWN = re.compile(r"^down_revision(?:: [^=]+)? = [\"']([^\"']+)[\"']", re.M)


def head_revision() -> str | None:
    """The single head of the migration scripts, read as text (no Alembic import); None when
    it cannot be told that way (several heads, an unusual file), so the caller runs Alembic."""
    revisions, parents = set(), set()
    for path in (migrations_dir() / "versions").glob("*.py"):
        text = path.read_text()
        if (rev := _REVISION.search(text)) is None:
            return None
        revisions.add(rev.group(1))
        if (down := _DOWN.search(text)) is not None:
            parents.add(down.group(1))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


async def current_revision(dsn: str, budget: float = 60.0) -> str | None:
    """The revision the database is at, or None (no schema yet). This is the first contact
    with PostgreSQL at start: an unreachable server is retried for `budget` seconds, and a
    wrong URL ends in ConfigError naming SCHEDULER_DATABASE_URL."""
    conn = await connect(dsn, budget)
    try:
        if not await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL"):
            return None
        revision: str | None = await conn.fetchval("SELECT version_num FROM alembic_version")
        return revision
    finally:
        await conn.close()


async def upgrade_async(dsn: str, revision: str = "head", budget: float = 60.0) -> None:
    """`upgrade` from inside a running event loop (Alembic's env.py runs its own loop).

    A database already at the head is left alone without loading Alembic at all: importing
    and running it takes most of a second, which every restart and failover would pay."""
    current = await current_revision(dsn, budget)
    if revision == "head" and current is not None and current == head_revision():
        return
    await _in_thread(upgrade, dsn, revision)


async def downgrade_async(dsn: str, revision: str = "base", budget: float = 60.0) -> None:
    """`downgrade` from inside a running event loop, with the errors of `upgrade_async`."""
    await current_revision(dsn, budget)
    await _in_thread(downgrade, dsn, revision)


async def _in_thread(run: Callable[[str, str, str], None], dsn: str, revision: str) -> None:
    """Run Alembic in a worker thread. Cancelled (a signal during start-up), it ends the
    migration's PostgreSQL session, so the thread stops within moments and the migration in
    progress rolls back; a failure from PostgreSQL (a missing permission, say) becomes one
    ConfigError naming SCHEDULER_DATABASE_URL."""
    name = f"mq-scheduler-migrate-{uuid.uuid4().hex[:12]}"
    job = _daemon_thread(run, dsn, revision, name)
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        await _end_session(dsn, name, job)
        raise
    except Exception as exc:
        cause = _postgres_cause(exc)
        if cause is None:
            raise
        problem = connect_problem(cause)
        what = problem[0] if problem else str(cause)
        raise ConfigError(
            "SCHEDULER_DATABASE_URL",
            f"{redact_url(dsn)}: migrating to {revision} failed: {what}{_hint(cause)}",
        ) from None


def _daemon_thread(run: Callable[[str, str, str], None], *args: str) -> asyncio.Future[None]:
    """`run(*args)` in a daemon thread; its outcome as a future of the running loop.

    Not the loop's default executor: `asyncio.run` waits for that executor's threads when the
    loop closes, so a migration whose session could not be ended (PostgreSQL unreachable
    from the stop path, a lock wait) kept a stopped process alive for good, its parent gone
    (seen: an edge stopped while migrating lived on after `scheduler run` exited). A daemon
    thread ends with the process, and PostgreSQL rolls its transaction back then."""
    loop = asyncio.get_running_loop()
    job: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if job.done():
            return
        if error is None:
            job.set_result(None)
        else:
            job.set_exception(error)

    def target() -> None:
        error: BaseException | None = None
        try:
            run(*args)
        except BaseException as exc:  # handed to the loop, raised where the job is awaited
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=target, name=args[-1], daemon=True).start()
    return job


async def _end_session(dsn: str, name: str, job: asyncio.Future[None]) -> None:
    """Terminate the backend of the migration labelled `name` until its thread has ended."""
    with contextlib.suppress(Exception):
        conn = await asyncpg.connect(dsn, timeout=2)
        try:
            async with asyncio.timeout(5):
                while not job.done():
                    await conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = $1",
                        name,
                    )
                    await asyncio.wait({job}, timeout=0.05)
        finally:
            await conn.close()
    if job.done() and not job.cancelled():
        job.exception()  # retrieved: the thread failed because we ended its session


def _postgres_cause(exc: BaseException) -> BaseException | None:
    """The PostgreSQL or network error under SQLAlchemy's and Alembic's wrappers, if any."""
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, asyncpg.PostgresError | OSError):
            return node
        node = getattr(node, "orig", None) or node.__cause__ or node.__context__
    return None


def _hint(cause: BaseException) -> str:
    if isinstance(cause, asyncpg.InsufficientPrivilegeError):
        return (
            "; the user needs to own the database's schema (or run `scheduler migrate` as "
            "its owner)"
        )
    return ""


async def at_start(dsn: str, budget: float, enter: Callable[[str], None]) -> None:
    """A role's start: first contact with PostgreSQL (retried for `budget` s), then the
    migrations; `enter` is told each phase (a stop during the start names it)."""
    enter("connecting to PostgreSQL")
    await current_revision(dsn, budget)
    enter("migrating the schema")
    await upgrade_async(dsn, budget=budget)
