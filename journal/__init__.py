"""The SQLite event log: append, read, replay, audit queries, blobs, and the memory projection.

The audit query itself is `journal.audit.audit` (not re-exported: it would hide its module).
"""

from toolbus.journal.sqlite.audit import (
    AuditEntry,
    AuditQuery,
    HistoryEntry,
    NoSuchEvent,
    Recoverable,
    StoredEvent,
    find_event,
    history,
    recoverable,
)
from toolbus.journal.sqlite.readonly import open_readonly, require_journal
from toolbus.journal.sqlite.replay import EditorStep, MemoryCheck, check_memory, editor_steps, rebuild_memory
from toolbus.journal.sqlite.schema import SCHEMA_VERSION
from toolbus.journal.sqlite.store import SqliteJournal, default_journal_path, iso_time

__all__ = [
    "SCHEMA_VERSION",
    "AuditEntry",
    "AuditQuery",
    "EditorStep",
    "HistoryEntry",
    "MemoryCheck",
    "NoSuchEvent",
    "Recoverable",
    "SqliteJournal",
    "StoredEvent",
    "check_memory",
    "default_journal_path",
    "editor_steps",
    "find_event",
    "history",
    "iso_time",
    "open_readonly",
    "rebuild_memory",
    "recoverable",
    "require_journal",
]
