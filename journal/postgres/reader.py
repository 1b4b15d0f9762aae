"""`JournalReader` on a team journal: read-only transactions on a connection of its own.

An agent's login reads what row-level security shows it (its own commands, events and texts,
and the observations it may see); the admin's reads everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

from psycopg.rows import dict_row

from toolbus.bus import (
    AuditEntry,
    AuditQuery,
    HistoryEntry,
    MemoryCheck,
    NoSuchEvent,
    StoredEvent,
    file_streams,
)
from toolbus.bus.commands import SQLITE_INT_MAX
from toolbus.journal.decoding import (
    FILE_CHANGING_TOOLS,
    audit_entry,
    decode_stored_events,
    eventless_matcher,
    history_entry,
    not_ok_statuses,
    with_eventless,
)
from toolbus.journal.location import shown
from toolbus.journal.postgres.replay import check_memory
from toolbus.journal.postgres.schema import schema_version
from toolbus.journal.postgres.store import (
    ANSWER_TIMEOUT,
    Connection,
    PostgresJournal,
    answered_within,
    check_journal,
    connect,
    server_answers,
)

_BATCH = 200


class PostgresReader:
    def __init__(self, url: str) -> None:
        self._conn: Connection = connect(url)
        self._conn.read_only = True
        self.location = shown(url)
        self._alive = server_answers(self._conn, url, self.location)  # its one connection's server
        with answered_within(self._conn, ANSWER_TIMEOUT, self.location):
            self.agent, self.department, self.administers = check_journal(self._conn, self.location)

    def schema_version(self) -> int | None:
        with self._answered():
            return schema_version(self._conn)

    def audit(self, query: AuditQuery) -> Iterator[AuditEntry]:
        entries = self._entries(self._rows(*_command_sql(query)))
        if query.paths:
            match = eventless_matcher(query.paths, hosts=True, here=query.here)
            entries = with_eventless(entries, self._failed_changes(query), match, query.paths)
        yield from islice(entries, query.limit)

    def _failed_changes(self, query: AuditQuery) -> Iterator[dict[str, Any]]:
        """The calls that would change a file and ended before any event, matching `query`'s
        other filters, newest first: each status's walk of `commands_not_ok`, in batches as far
        as the audit goes, merged."""
        walks = [self._failed_with_status(query, status) for status in not_ok_statuses(query.status)]
        return heapq.merge(*walks, key=lambda row: (row["received_at"], row["id"]), reverse=True)

    def _failed_with_status(self, query: AuditQuery, status: str) -> Iterator[dict[str, Any]]:
        before: tuple[str, int] | None = None
        while rows := self._rows(*_failed_changes_sql(query, status, before)):
            yield from rows
            before = (rows[-1]["received_at"], rows[-1]["id"])

    def _entries(self, rows: list[dict[str, Any]]) -> Iterator[AuditEntry]:
        for start in range(0, len(rows), _BATCH):  # each command once (`_command_sql`)
            batch = rows[start : start + _BATCH]
            events = self._events_of([row["id"] for row in batch])
            for row in batch:
                yield audit_entry(row, events.get(row["id"], []), row["host"])

    def history(self, path: str, limit: int | None = None, host: str | None = None) -> list[HistoryEntry]:
        sql = (
            "SELECT e.*, c.tool AS c_tool, c.status AS c_status, c.agent AS c_agent, c.session_id AS c_session,"
            " c.host AS c_host FROM events AS e LEFT JOIN commands AS c ON c.id = e.command_id"
            " WHERE e.stream = ANY(%s) AND (%s::text IS NULL OR c.host = %s OR c.host IS NULL)"
            " ORDER BY e.position DESC LIMIT %s"
        )
        rows = self._rows(sql, (list(file_streams(path)), host, host, limit))
        return [history_entry(row, event) for row, event in zip(rows, self._stored(rows), strict=True)]

    def event_at(self, position: int) -> StoredEvent:
        return self._one("position", position, str(position))

    def event_by_id(self, event_id: str) -> StoredEvent:
        return self._one("event_id", event_id.lower(), event_id)

    def events(self, types: Sequence[str], start: int = 0, end: int | None = None) -> Iterator[StoredEvent]:
        after = start - 1
        while True:
            rows = self._rows(
                "SELECT * FROM events WHERE type = ANY(%s) AND position > %s AND position <= %s"
                " ORDER BY position LIMIT %s",
                (list(types), after, end if end is not None else SQLITE_INT_MAX, _BATCH),
            )
            if not rows:
                return
            yield from self._stored(rows)
            after = rows[-1]["position"]

    def blob(self, digest: str) -> bytes | None:
        with self._answered():
            return blob_content(self._conn, digest)

    def check_memory(self) -> MemoryCheck:
        # The rebuild goes to a temporary table, which a read-only transaction may not create;
        # nothing else is written, and the table goes with the transaction.
        self._conn.read_only = False
        try:
            with self._answered(), self._conn.transaction():
                return check_memory(self._conn)
        finally:
            if not self._conn.closed:  # not one given up on: its error is the one to tell
                self._conn.read_only = True

    def counts(self) -> tuple[int, int]:
        [row] = self._rows("SELECT (SELECT count(*) FROM commands) AS c, (SELECT count(*) FROM events) AS e", ())
        return int(row["c"]), int(row["e"])

    def close(self) -> None:
        self._conn.close()

    # --- helpers ------------------------------------------------------------------------------

    def _answered(self) -> contextlib.AbstractContextManager[None]:
        """Each statement's wait, given up on when the server stops answering anyone; a long
        one on a busy server goes on."""
        return answered_within(self._conn, ANSWER_TIMEOUT, self.location, self._alive)

    def _rows(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        with self._answered(), self._conn.transaction(), self._conn.cursor(row_factory=dict_row) as cursor:
            return cursor.execute(sql, params).fetchall()

    def _one(self, column: str, value: object, shown: str) -> StoredEvent:
        rows = self._rows(f"SELECT * FROM events WHERE {column} = %s", (value,))
        if not rows:
            raise NoSuchEvent(f"no event {shown} in the journal")
        return self._stored(rows)[0]

    def _stored(self, rows: Sequence[dict[str, Any]]) -> list[StoredEvent]:
        return decode_stored_events(rows, self._blob_sizes)

    def _blob_sizes(self, digests: set[str]) -> dict[str, int]:
        if not digests:
            return {}
        rows = self._rows("SELECT DISTINCT hash, size FROM blobs WHERE hash = ANY(%s)", (sorted(digests),))
        return {row["hash"]: row["size"] for row in rows}

    def _events_of(self, command_ids: list[int]) -> dict[int, list[StoredEvent]]:
        if not command_ids:
            return {}
        rows = self._rows("SELECT * FROM events WHERE command_id = ANY(%s) ORDER BY position", (command_ids,))
        grouped: dict[int, list[StoredEvent]] = {}
        for event in self._stored(rows):
            if event.command_id is not None:
                grouped.setdefault(event.command_id, []).append(event)
        return grouped


def _failed_changes_sql(query: AuditQuery, status: str, before: tuple[str, int] | None) -> tuple[str, list[Any]]:
    """A batch of the calls of `status` that would change a file and ended before any event,
    matching `query`'s other filters, newest first from `before` (received_at, id). Their
    arguments are matched in Python (`eventless_matcher`): as `json`, one holding `\\u0000`
    anywhere could not be read."""
    query = dataclasses.replace(query, status=None)
    where, params = _filters(query)
    tools = [tool for tool in FILE_CHANGING_TOOLS if query.tool in (None, tool)]
    where += [
        "c.status = %s",
        "c.status <> 'ok'",
        "c.tool = ANY(%s)",
        "NOT EXISTS (SELECT 1 FROM events AS e WHERE e.command_id = c.id)",
    ]
    params += [status, tools]
    if before is not None:
        where.append("(c.received_at, c.id) < (%s, %s)")
        params += before
    params.append(_BATCH)
    sql = f"SELECT c.* FROM commands AS c WHERE {' AND '.join(where)} ORDER BY c.received_at DESC, c.id DESC LIMIT %s"
    return sql, params


def _filters(query: AuditQuery) -> tuple[list[str], list[Any]]:
    """`query`'s filters on `commands AS c` but its paths, and their values."""
    pairs = (("tool", query.tool), ("status", query.status), ("session_id", query.session), ("agent", query.agent))
    where = [f"c.{column} = %s" for column, value in pairs if value is not None]
    params: list[Any] = [value for _, value in pairs if value is not None]
    if query.since is not None:
        where.append("c.received_at >= %s")
        params.append(query.since)
    if query.until is not None:
        where.append("c.received_at < %s")
        params.append(query.until)
    if query.host is not None:  # that machine's, and those of no known machine
        where.append("(c.host = %s OR c.host IS NULL)")
        params.append(query.host)
    return where, params


def _command_sql(query: AuditQuery) -> tuple[str, list[Any]]:
    """The commands matching `query`, newest first (PostgreSQL's planner picks the index)."""
    where, params = _filters(query)
    if query.paths:  # each command once, by its newest event on the file
        sql = (
            "SELECT c.* FROM (SELECT command_id, max(position) AS newest FROM events WHERE stream = ANY(%s)"
            " GROUP BY command_id) AS e JOIN commands AS c ON c.id = e.command_id"
        )
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY e.newest DESC"
        params.insert(0, list(query.paths))
    else:
        sql = "SELECT c.* FROM commands AS c" + (" WHERE " + " AND ".join(where) if where else "")
        sql += " ORDER BY c.received_at DESC, c.id DESC"
    if query.limit is not None:
        sql += " LIMIT %s"
        params.append(query.limit)
    return sql, params


class PostgresTexts:
    """`handlers.ports.Texts`: the team journal's blobs, read on the writer's thread."""

    def __init__(self, journal: PostgresJournal) -> None:
        self._journal = journal

    async def text(self, digest: str) -> bytes | None:
        return await self._journal.run(lambda conn: blob_content(conn, digest))


def blob_content(conn: Connection, digest: str) -> bytes | None:
    """The text whose SHA-256 is `digest`, as this login may read it (its own copy; the admin's
    any, all equal by the blobs' check); None when there is none."""
    row = conn.execute("SELECT content FROM blobs WHERE hash = %s LIMIT 1", (digest,)).fetchone()
    return None if row is None else bytes(row[0])
