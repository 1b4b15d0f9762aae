"""The SQLite event log: append, read, replay, audit queries, blobs, and the memory projection."""

from journal.schema import SCHEMA_VERSION
from journal.store import SqliteJournal, default_journal_path, iso_time

__all__ = ["SCHEMA_VERSION", "SqliteJournal", "default_journal_path", "iso_time"]
