"""The ledger's database: a SQLAlchemy engine on a URL (SQLite by default, PostgreSQL for a
cluster), brought to this version's schema by the Alembic migrations (`migrations/`) when it opens,
a database written by an older memsweep included."""

from __future__ import annotations

import contextlib
import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import Connection, Engine

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig


def unreachable(exc: Exception) -> str:
    """A database error the ledger met (SQLAlchemy's OperationalError or InterfaceError) in one line:
    the driver's first line, nothing stored, and what to check. The REST answer's and the CLI's."""
    cause = getattr(exc, "orig", None)
    said = (
        str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else type(exc).__name__
    )
    return (
        f"the ledger's database did not take the request ({said}); nothing was stored. Check that it "
        "runs and that its file, directory and disk take writes (MEMSWEEP_DATABASE_URL, MEMSWEEP_HOME)"
    )


def connect(url: str) -> Engine:
    """An engine on the ledger's database, migrated to this version's schema. A pooled connection
    the database dropped (a restart) is replaced before it is used (pre-ping); SQLite in WAL mode."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    url = with_driver(url)
    try:
        database = create_engine(url, pool_pre_ping=True, **kwargs)
    except ModuleNotFoundError as exc:  # a driver named in the URL that this environment lacks
        raise ValueError(
            f"the ledger's database URL names a driver this Python environment does not have "
            f"({exc.name}); memsweep installs psycopg2 for PostgreSQL: write postgresql://… or "
            "postgresql+psycopg2://…, or install the driver (MEMSWEEP_DATABASE_URL)"
        ) from None
    if url.startswith("sqlite"):
        event.listen(database, "connect", _sqlite_pragmas)
    upgrade(database)
    return database


def with_driver(url: str) -> str:
    """A PostgreSQL URL that names no driver (`postgresql://`, or `postgres://` as some hosts write it)
    given the one this environment has: SQLAlchemy 2.1 takes psycopg 3 for it, and memsweep installs
    psycopg2 (`pyproject.toml`); psycopg 3 where only it is installed. Any other URL as it is."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    driver = "psycopg2" if importlib.util.find_spec("psycopg2") is not None else "psycopg"
    return f"postgresql+{driver}://{rest}"


#: the Alembic revision of a ledger written before memsweep kept migrations
FIRST_REVISION = "0001"


def migrations(connection: Connection) -> AlembicConfig:
    """Alembic's configuration of the ledger's migrations (`service/store/migrations/`), on `connection`."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    cfg.attributes["connection"] = connection
    return cfg


#: PostgreSQL advisory lock key under which one process at a time migrates a ledger
MIGRATION_LOCK = 0x6D656D73


def upgrade(engine: Engine) -> None:
    """Bring the database to this version's schema, one process at a time (an API and a CLI may
    open one ledger at once): SQLite takes its write lock first (BEGIN IMMEDIATE, which also makes its
    DDL transactional), PostgreSQL an advisory lock."""
    from alembic import command

    migrator = engine
    if engine.dialect.name == "sqlite":
        _wal(engine.url.database)
        migrator = create_engine(engine.url, connect_args={"timeout": 60, "isolation_level": None})
        event.listen(migrator, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    try:
        with migrator.begin() as connection:
            if engine.dialect.name == "postgresql":
                connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
            cfg = migrations(connection)
            tables = set(inspect(connection).get_table_names())
            if "studies" in tables and "alembic_version" not in tables:  # from before migrations
                command.stamp(cfg, FIRST_REVISION)
            command.upgrade(cfg, "head")
    finally:
        if migrator is not engine:
            migrator.dispose()


def _wal(path: str | None, wait: float = 60.0) -> None:
    """Put a SQLite ledger in WAL mode (readers — the API — don't block the engine's writes), once:
    the mode stays with the file. Switching needs the database to itself, and SQLite refuses at once
    (no busy wait) while another process switches it too, so this tries again until it holds."""
    import sqlite3

    if not path or path == ":memory:":
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=wait)) as db:
                db.execute("PRAGMA journal_mode=WAL")  # a file system without WAL keeps its mode: fine
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):  # a folder that is missing or takes no writes
                raise ValueError(
                    f"the ledger's SQLite file {path} cannot be opened ({exc}): its folder must exist and "
                    "take writes; set MEMSWEEP_DATABASE_URL (or MEMSWEEP_HOME) to one that does"
                ) from None
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL is the file's mode already (`_wal`, in `upgrade`)
    cur.close()
