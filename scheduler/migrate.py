"""Schema migrations (Alembic, in the repository's `migrations/` folder), run from code."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from alembic import command
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
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    url = "postgresql+asyncpg://" + dsn.split("://", 1)[1]
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(dsn: str, revision: str = "head") -> None:
    """Bring the schema up to `revision`; idempotent."""
    command.upgrade(alembic_config(dsn), revision)


def downgrade(dsn: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(dsn), revision)


async def upgrade_async(dsn: str, revision: str = "head") -> None:
    """`upgrade` from inside a running event loop (Alembic's env.py runs its own loop)."""
    await asyncio.to_thread(upgrade, dsn, revision)
