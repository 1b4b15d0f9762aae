"""The SQLite backend of the journal: one file, WAL, the writer, the reader and the memory store."""

from toolbus.journal.location import Synchronous, default_journal_path
from toolbus.journal.rows import Outcome
from toolbus.journal.sqlite.memory import SqliteMemoryStore
from toolbus.journal.sqlite.reader import JournalTexts, SqliteReader
from toolbus.journal.sqlite.replay import rebuild_memory
from toolbus.journal.sqlite.schema import SCHEMA_VERSION
from toolbus.journal.sqlite.store import SqliteJournal

__all__ = [
    "SCHEMA_VERSION",
    "JournalTexts",
    "Outcome",
    "SqliteJournal",
    "SqliteMemoryStore",
    "SqliteReader",
    "Synchronous",
    "default_journal_path",
    "rebuild_memory",
]
