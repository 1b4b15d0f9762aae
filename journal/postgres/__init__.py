"""The PostgreSQL backend of the journal, for a team: the writer, the reader, the memory store,
and the schema with the row-level security that enforces who sees and writes what."""

from toolbus.journal.postgres.memory import PostgresMemoryStore
from toolbus.journal.postgres.reader import PostgresReader
from toolbus.journal.postgres.schema import init_schema, register_agent
from toolbus.journal.postgres.store import PostgresJournal, connect, describe, is_postgres_url

__all__ = [
    "PostgresJournal",
    "PostgresMemoryStore",
    "PostgresReader",
    "connect",
    "describe",
    "init_schema",
    "is_postgres_url",
    "register_agent",
]
