"""Alembic environment: runs migrations over SQLAlchemy's asyncpg driver (no psycopg needed)."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

config = context.config


# Several replicas start at once and each migrates: a session advisory lock lets one run the
# migrations while the others wait, then find the schema at head and do nothing.
MIGRATION_LOCK = 0x6D717363  # "mqsc"


def _run(connection: Connection) -> None:
    connection.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
    try:
        context.configure(
            connection=connection, target_metadata=None, transaction_per_migration=True
        )
        with context.begin_transaction():
            context.run_migrations()
    except Exception:
        # End the failed transaction, or the unlock below fails too and its error ("current
        # transaction is aborted") hides the one that matters (say, a missing permission).
        connection.rollback()
        raise
    finally:
        connection.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")


async def _main() -> None:
    # A label on the session lets `scheduler` end a migration it was asked to stop.
    name = config.attributes.get("application_name")
    connect_args = {"server_settings": {"application_name": name}} if name else {}
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
