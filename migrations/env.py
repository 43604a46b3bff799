"""Alembic environment: runs migrations over SQLAlchemy's asyncpg driver (no psycopg needed)."""

from __future__ import annotations

import asyncio

import asyncpg
from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

config = context.config


# Several replicas start at once and each migrates: a session advisory lock lets one run the
# migrations while the others wait, then find the schema at head and do nothing.
MIGRATION_LOCK = 0x6D717363  # "mqsc"


def _run(connection: Connection) -> None:
    connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
    connection.commit()  # the lock belongs to the session; each migration has its transaction
    try:
        context.configure(
            connection=connection, target_metadata=None, transaction_per_migration=True
        )
        with context.begin_transaction():
            context.run_migrations()
        # Committed before the unlock: a replica that was waiting on the lock must find the
        # schema migrated, not migrate it again ("relation alembic_version already exists").
        connection.commit()
    except Exception:
        # End the failed transaction, or the unlock below fails too and its error ("current
        # transaction is aborted") hides the one that matters (say, a missing permission).
        connection.rollback()
        raise
    finally:
        connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
        connection.commit()


async def _main() -> None:
    # A label on the session lets `scheduler` end a migration it was asked to stop.
    name = config.attributes.get("application_name")
    connect_args = {"server_settings": {"application_name": name}} if name else {}
    dsn = config.attributes.get("dsn")
    if dsn:
        # asyncpg reads the URL itself, libpq's TLS parameters (sslmode, sslrootcert, sslcert)
        # included, which SQLAlchemy's dialect would hand on as unknown arguments
        engine = create_async_engine(
            "postgresql+asyncpg://",
            pool_size=1,
            async_creator=lambda: asyncpg.connect(dsn, **connect_args),
        )
    else:
        engine = create_async_engine(
            config.get_main_option("sqlalchemy.url"), pool_size=1, connect_args=connect_args
        )
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_main())
