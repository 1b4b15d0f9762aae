"""The SQLite backend passes the journal contract."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import anyio
import pytest

from tests.journal_contract import JournalContract, record, saved
from toolbus.bus import AuditQuery, Caller, JournalReader, JournalUnavailable, JournalWriter, file_streams
from toolbus.handlers import MemoryStore
from toolbus.journal.rows import event_ids
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


@pytest.mark.anyio
async def test_work_queued_behind_a_wait_for_another_writer_waits_only_its_own_timeout(tmp_path: Path) -> None:
    """Another process holds the journal: work handed over together fails together, each after
    its own timeout counted from the hand-over, never one timeout after another; the record of
    a failure that found the journal held does not wait again; once free, work waits in full."""
    path = tmp_path / "journal.db"
    journal = SqliteJournal(path, busy_timeout=0.3)
    other = sqlite3.connect(path, isolation_level=None)
    allowed_ms: list[int] = []  # how long each work may wait for the other writer

    def write(conn: sqlite3.Connection) -> None:
        allowed_ms.append(conn.execute("PRAGMA busy_timeout").fetchone()[0])
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")

    async def write_then_record_its_failure() -> None:
        for _ in range(2):
            with pytest.raises(JournalUnavailable, match="locked by another process"):
                await journal.run(write)

    try:
        other.execute("BEGIN IMMEDIATE")
        async with anyio.create_task_group() as calls:
            for _ in range(3):
                calls.start_soon(write_then_record_its_failure)
        other.execute("ROLLBACK")
        await journal.run(write)
    finally:
        other.close()
        journal.close()
    # The first waited its 300 ms; the others had spent theirs queued behind it; no failure's
    # record waited; the work after the other writer let go could wait in full.
    assert allowed_ms == [300, 0, 0, 0, 0, 0, 300], allowed_ms


# --- one path on two machines -----------------------------------------------------------------


# Who saved /src/a.py, and what: a toolbus from before machines were, then two machines.
HOSTS = ((None, b"before machines were\n"), ("laptop", b"on the laptop\n"), ("server", b"on the server\n"))


def test_the_sqlite_reader_keeps_one_path_of_two_machines_as_two_histories(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = SqliteJournal(path)

    async def save(host: str | None, text: bytes) -> int:
        event, blobs = saved("/src/a.py", None, text)
        call = record("saveDocument", {"filePath": "/src/a.py"}, Caller(agent="claude", host=host))
        [(position, _)] = await journal.finish(call, None, "ok", events=[event], blobs=blobs)
        return position

    try:
        unknown, laptop, server = (anyio.run(save, host, text) for host, text in HOSTS)
    finally:
        journal.close()
    reader = SqliteReader(path)
    try:
        assert [h.event.position for h in reader.history("/src/a.py", host="laptop")] == [laptop, unknown]
        assert [h.event.position for h in reader.history("/src/a.py", host="server")] == [server, unknown]
        assert [h.host for h in reader.history("/src/a.py")] == ["server", "laptop", None]
        assert [e.host for e in reader.audit(AuditQuery(paths=file_streams("/src/a.py"), host="laptop"))] == [
            "laptop",
            None,
        ]
    finally:
        reader.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT host FROM commands ORDER BY id").fetchall() == [(None,), ("laptop",), ("server",)]
        for view in ("audit_log", "file_history"):
            hosts = conn.execute(f"SELECT host FROM {view} ORDER BY position").fetchall()
            assert hosts == [(None,), ("laptop",), ("server",)], view
    finally:
        conn.close()


# --- event ids -----------------------------------------------------------------------------


def test_event_ids_are_unique_time_ordered_uuid7s() -> None:
    first, second = event_ids(500), event_ids(1)
    for text in [*first, *second]:
        parsed = uuid.UUID(hex=text)
        assert len(text) == 32 and parsed.hex == text
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert len(set(first + second)) == 501
    # The leading 48 bits are the millisecond: a later batch never sorts before an earlier one.
    assert {text[:12] for text in first} == {first[0][:12]}
    assert second[0][:12] >= first[0][:12]
    # Every random digit is used: the variant digit takes all four of its values.
    assert {text[16] for text in first} == set("89ab")
