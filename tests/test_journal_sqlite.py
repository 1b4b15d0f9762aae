"""The SQLite backend passes the journal contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.journal_contract import JournalContract
from toolbus.bus import JournalReader, JournalWriter
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
