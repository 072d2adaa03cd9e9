"""The ledger: the source of truth for studies and trials, in SQLite or PostgreSQL, kept by Alembic migrations."""
