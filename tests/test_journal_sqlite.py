"""The SQLite backend passes the journal contract."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.journal_contract import JournalContract
from toolbus.bus import JournalReader, JournalUnavailable, JournalWriter
from toolbus.handlers import MemoryStore
from toolbus.journal.sqlite import SqliteJournal, SqliteMemoryStore, SqliteReader


def open_sqlite_writer(location: str) -> SqliteJournal:
    return SqliteJournal(Path(location))


class TestSqliteJournal(JournalContract):
    writer_factory = staticmethod(open_sqlite_writer)

    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        path = tmp_path / "journal.db"
        SqliteJournal(path).close()  # created, so readers and other processes find it
        return str(path)

    def open_reader(self, location: str) -> JournalReader:
        return SqliteReader(Path(location))

    def memory_store(self, writer: JournalWriter) -> MemoryStore:
        assert isinstance(writer, SqliteJournal)
        return SqliteMemoryStore(writer)


# --- SQLite's failures in toolbus's words, chosen by result code ------------------------------


def test_a_failure_is_explained_by_its_code_not_by_words_in_its_message(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path / "journal.db")
    try:
        # The message names a table "disk_is_full_and_locked"; the failure is neither.
        with pytest.raises(JournalUnavailable) as raised:
            journal.run_sync(lambda conn: conn.execute("SELECT * FROM disk_is_full_and_locked"))
    finally:
        journal.close()
    said = str(raised.value)
    assert "no such table: disk_is_full_and_locked" in said, said
    assert "is full" not in said and "locked by another" not in said, said


def test_a_journal_held_by_another_writer_is_explained_as_locked(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = SqliteJournal(path, busy_timeout=0.05)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(JournalUnavailable, match="locked by another process"):
            journal.run_sync(lambda conn: conn.execute("BEGIN IMMEDIATE"))
    finally:
        other.execute("ROLLBACK")
        other.close()
        journal.close()
