"""The PostgreSQL backend of the journal, for a team: the writer, the reader, the memory store,
and the schema with the row-level security that enforces who sees and writes what."""

from toolbus.journal.postgres.memory import PostgresMemoryStore
from toolbus.journal.postgres.reader import PostgresReader, PostgresTexts
from toolbus.journal.postgres.schema import init_schema, register_agent, unregister_agent
from toolbus.journal.postgres.store import PostgresJournal, connect

__all__ = [
    "PostgresJournal",
    "PostgresMemoryStore",
    "PostgresReader",
    "PostgresTexts",
    "connect",
    "init_schema",
    "register_agent",
    "unregister_agent",
]
