"""Schema migrations (Alembic, in the repository's `migrations/` folder), run from code."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_ENV = "SCHEDULER_MIGRATIONS_DIR"


def migrations_dir() -> Path:
    """`$SCHEDULER_MIGRATIONS_DIR`, else `migrations/` beside the package, else in the cwd."""
    candidates = [
        os.environ.get(MIGRATIONS_ENV),
        Path(__file__).resolve().parent.parent / "migrations",
        Path.cwd() / "migrations",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "env.py").is_file():
            return Path(candidate)
    raise FileNotFoundError(f"no migrations folder found; set {MIGRATIONS_ENV}")


def alembic_config(dsn: str) -> Config:
    """An Alembic config for `dsn` (a plain postgresql:// URL; the asyncpg driver is added)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    url = "postgresql+asyncpg://" + dsn.split("://", 1)[1]
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(dsn: str, revision: str = "head") -> None:
    """Bring the schema up to `revision`; idempotent."""
    from alembic import command

    command.upgrade(alembic_config(dsn), revision)


def downgrade(dsn: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(dsn), revision)


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


async def current_revision(dsn: str) -> str | None:
    """The revision the database is at, or None (no schema yet)."""
    conn = await asyncpg.connect(dsn)
    try:
        if not await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL"):
            return None
        return await conn.fetchval("SELECT version_num FROM alembic_version")
    finally:
        await conn.close()


async def upgrade_async(dsn: str, revision: str = "head") -> None:
    """`upgrade` from inside a running event loop (Alembic's env.py runs its own loop).

    A database already at the head is left alone without loading Alembic at all: importing
    and running it takes most of a second, which every restart and failover would pay."""
    if revision == "head" and (head := head_revision()) is not None:
        if await current_revision(dsn) == head:
            return
    await asyncio.to_thread(upgrade, dsn, revision)
