"""`JournalReader` on a SQLite journal: a read-only connection (`query_only`), opened only
after the file's header says it is a toolbus journal."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from toolbus.bus import AuditEntry, AuditQuery, HistoryEntry, MemoryCheck, StoredEvent
from toolbus.journal.sqlite import audit as queries
from toolbus.journal.sqlite.readonly import open_readonly
from toolbus.journal.sqlite.replay import check_memory
from toolbus.journal.sqlite.store import SqliteJournal


class SqliteReader:
    def __init__(self, path: Path, busy_timeout: float = 5.0) -> None:
        self.path = path
        self._conn = open_readonly(path, busy_timeout)

    def audit(self, query: AuditQuery) -> Iterator[AuditEntry]:
        return queries.audit(self._conn, query)

    def history(self, path: str, limit: int | None = None, host: str | None = None) -> list[HistoryEntry]:
        return queries.history(self._conn, path, limit, host)

    def event_at(self, position: int) -> StoredEvent:
        return queries.event_at(self._conn, position)

    def event_by_id(self, event_id: str) -> StoredEvent:
        return queries.event_by_id(self._conn, event_id)

    def events(self, types: Sequence[str], start: int = 0, end: int | None = None) -> Iterator[StoredEvent]:
        return queries.events_between(self._conn, types, start, end)

    def blob(self, digest: str) -> bytes | None:
        return queries.blob_if_any(self._conn, digest)

    def check_memory(self) -> MemoryCheck:
        return check_memory(self._conn)

    def counts(self) -> tuple[int, int]:
        """How many commands and events the journal holds (for `toolbus doctor`)."""
        row = self._conn.execute("SELECT (SELECT count(*) FROM commands), (SELECT count(*) FROM events)").fetchone()
        return int(row[0]), int(row[1])

    def close(self) -> None:
        self._conn.close()


class JournalTexts:
    """`handlers.ports.Texts`: the journal's blobs, read on the writer's thread (off the event loop)."""

    def __init__(self, journal: SqliteJournal) -> None:
        self._journal = journal

    async def text(self, digest: str) -> bytes | None:
        return await self._journal.run(lambda conn: queries.blob_if_any(conn, digest))
