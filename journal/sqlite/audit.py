"""Reading the journal for people and scripts: audit queries, a file's history, recoverable text.

Every query is shaped so SQLite walks one index in the order asked and stops at the limit:
commands by `received_at` (alone, with agent and session_id beside it to check along the walk;
behind the tool; or behind a status other than ok), a file's events by `(stream, position)`, and
a batch of commands' events by `command_id`.
"""

from __future__ import annotations

import dataclasses
import heapq
import sqlite3
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

from toolbus.bus import AuditEntry, AuditQuery, HistoryEntry, NoSuchEvent, StoredEvent, file_streams
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
from toolbus.journal.sqlite.schema import NOT_OK

_BATCH = 200
_PROBE_CAP = 5000  # commands counted per filter when choosing which index to walk


# --- audit -----------------------------------------------------------------------------


def audit(conn: sqlite3.Connection, query: AuditQuery) -> Iterator[AuditEntry]:
    """Commands matching `query`, newest first, each with its events."""
    hosts = keeps_hosts(conn)
    if not hosts:  # every machine unknown: each one's commands are all of them
        query = dataclasses.replace(query, host=None)
    sql, params = _command_sql(query, _driving_column(conn, query))
    cursor = conn.execute(sql, params)
    cursor.row_factory = sqlite3.Row
    # A file's events walk yields a command once per event of it: the limit counts commands.
    batch = min(_BATCH, query.limit or _BATCH)
    entries = _each_once(conn, cursor, hosts, batch)
    if query.paths:
        match = eventless_matcher(query.paths, hosts, query.here)
        entries = with_eventless(entries, _failed_changes(conn, query), match, query.paths)
    yield from islice(entries, query.limit)


def _failed_changes(conn: sqlite3.Connection, query: AuditQuery) -> Iterator[sqlite3.Row]:
    """The calls that would change a file and ended before any event, matching `query`'s other
    filters, newest first: one walk of the partial index per status, merged. Lazy: rows are
    read only as far as the audit goes."""
    walks = [_rows_of(conn, *_failed_changes_sql(query, status)) for status in not_ok_statuses(query.status)]
    return heapq.merge(*walks, key=lambda row: (row["received_at"], row["id"]), reverse=True)


def _rows_of(conn: sqlite3.Connection, sql: str, params: list[Any]) -> Iterator[sqlite3.Row]:
    """`sql`'s rows as read. Not the cursor, nor `yield from` it: an audit left part way is
    closed when collected, maybe after its connection, and closing the cursor then would raise."""
    cursor = conn.execute(sql, params)
    cursor.row_factory = sqlite3.Row
    for row in cursor:  # noqa: UP028
        yield row


def _failed_changes_sql(query: AuditQuery, status: str) -> tuple[str, list[Any]]:
    """`_failed_changes`'s walk of one status, through the partial index of statuses other than
    ok in its order: never the whole table, never a sort."""
    tools = [tool for tool in FILE_CHANGING_TOOLS if query.tool in (None, tool)]
    filters = {column: value for column, value in _equalities(query).items() if column != "status"}
    # `+column` keeps SQLite off every index but the partial one, which the NOT_OK term selects.
    where = ["c.status = ?", f"c.{NOT_OK}", f"+c.tool IN ({', '.join('?' * len(tools))})"]
    where += [f"+c.{column} = ?" for column in filters]
    window, bounds = _window(query, "+c.received_at")
    where += window
    where.append("NOT EXISTS (SELECT 1 FROM events AS e WHERE e.command_id = c.id)")
    params: list[Any] = [status, *tools, *filters.values(), *bounds]
    if query.host is not None:
        where.append(_ON_HOST)
        params.append(query.host)
    sql = f"SELECT c.* FROM commands AS c WHERE {' AND '.join(where)} ORDER BY c.received_at DESC, c.id DESC"
    return sql, params


def _each_once(conn: sqlite3.Connection, cursor: sqlite3.Cursor, hosts: bool, batch: int) -> Iterator[AuditEntry]:
    seen: set[int] = set()
    while rows := cursor.fetchmany(batch):
        fresh = []
        for row in rows:
            if row["id"] not in seen:
                seen.add(row["id"])
                fresh.append(row)
        events = _events_of(conn, [row["id"] for row in fresh])
        for row in fresh:
            yield audit_entry(row, events.get(row["id"], []), row["host"] if hosts else None)


def keeps_hosts(conn: sqlite3.Connection) -> bool:
    """Whether the journal records machines: one from before schema 6 that no writer has
    migrated yet (readers never migrate) has no `host` column, and every machine is unknown."""
    found = conn.execute("SELECT 1 FROM pragma_table_info('commands') WHERE name = 'host'").fetchone()
    return found is not None


# A machine's commands, and those recorded before journals kept the machine (shown on every one).
_ON_HOST = "(c.host = ? OR c.host IS NULL)"


def _equalities(query: AuditQuery) -> dict[str, str]:
    """The equality filters, by their column of `commands`."""
    pairs = (
        ("tool", query.tool),
        ("status", query.status),
        ("session_id", query.session),
        ("agent", query.agent),
    )
    return {column: value for column, value in pairs if value is not None}


def _indexed(filters: dict[str, str]) -> list[str]:
    """The filters an index can drive: the tool, and a status other than ok (the partial index
    holds only those). Session and agent are checked along the received_at index, which holds them."""
    return [column for column in filters if column == "tool" or (column == "status" and filters[column] != "ok")]


def _driving_column(conn: sqlite3.Connection, query: AuditQuery) -> str | None:
    """Of several equality filters, the indexed one matching fewest commands in the time window.

    Without statistics SQLite picks an index blindly, and `--tool saveDocument --status failed`
    could walk every save. Counting (up to a cap) through each index is cheap: the count reads
    the index alone. Only indexed filters are counted: counting any other would scan the table."""
    filters = _equalities(query)
    candidates = _indexed(filters)
    if len(filters) < 2 or not candidates or query.paths:
        return None
    if len(candidates) == 1:
        return candidates[0]
    window, bounds = _window(query, "received_at")

    def matches(column: str) -> int:
        where = " AND ".join([f"{column} = ?", *_partial_terms(column, ""), *window])
        sql = f"SELECT count(*) FROM (SELECT 1 FROM commands WHERE {where} LIMIT {_PROBE_CAP})"
        return int(conn.execute(sql, [filters[column], *bounds]).fetchone()[0])

    # When both counts hit the cap, failures are the likelier to be rare.
    return min(candidates, key=lambda column: (matches(column), column != "status"))


def _partial_terms(driving: str | None, alias: str) -> list[str]:
    """When status drives: the term that lets SQLite walk the partial index of statuses other
    than ok (a status filter drives only when it is not ok)."""
    return [f"{alias}{NOT_OK}"] if driving == "status" else []


def _window(query: AuditQuery, column: str) -> tuple[list[str], list[str]]:
    """`--since` / `--until` as SQL conditions on `column`, and their values."""
    clauses, bounds = [], []
    if query.since is not None:
        clauses.append(f"{column} >= ?")
        bounds.append(query.since)
    if query.until is not None:
        clauses.append(f"{column} < ?")
        bounds.append(query.until)
    return clauses, bounds


def _command_sql(query: AuditQuery, driving: str | None = None) -> tuple[str, list[Any]]:
    filters = _equalities(query)
    if driving is None and len(filters) == 1:
        driving = next(iter(_indexed(filters)), None)  # a lone filter drives when it can
    # `+column` keeps SQLite off that column's index, so it walks the driving one.
    where = [f"{'+' if driving and column != driving else ''}c.{column} = ?" for column in filters]
    where += _partial_terms(driving, "c.")
    window, bounds = _window(query, "c.received_at")
    where += window
    params: list[Any] = [*filters.values(), *bounds]
    if query.host is not None:
        where.append(_ON_HOST)
        params.append(query.host)
    if query.paths:
        # Walk the file's events (index on stream, position), never the whole command table.
        marks = ", ".join("?" * len(query.paths))
        sql = (
            "SELECT c.* FROM events AS e CROSS JOIN commands AS c ON c.id = e.command_id"
            f" WHERE e.stream IN ({marks})" + "".join(f" AND {w}" for w in where) + " ORDER BY e.position DESC"
        )
        params = [*query.paths, *params]
    else:
        sql = (
            "SELECT c.* FROM commands AS c"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY c.received_at DESC, c.id DESC"
        )
    if query.limit is not None and not query.paths:
        sql += " LIMIT ?"
        params.append(query.limit)
    return sql, params


def _events_of(conn: sqlite3.Connection, command_ids: Sequence[int]) -> dict[int, list[StoredEvent]]:
    if not command_ids:
        return {}
    marks = ", ".join("?" * len(command_ids))
    cursor = conn.execute(f"SELECT * FROM events WHERE command_id IN ({marks}) ORDER BY position", list(command_ids))
    cursor.row_factory = sqlite3.Row
    stored = stored_events(conn, cursor.fetchall())
    grouped: dict[int, list[StoredEvent]] = {}
    for event in stored:
        if event.command_id is not None:
            grouped.setdefault(event.command_id, []).append(event)
    return grouped


# --- a file's history --------------------------------------------------------------------


def history(
    conn: sqlite3.Connection, path: str, limit: int | None = None, host: str | None = None
) -> list[HistoryEntry]:
    """Every event about one file (saves, refused saves, closes, restores), newest first; with
    `host`, only that machine's and those whose machine is unknown."""
    streams = file_streams(path)
    marks = ", ".join("?" * len(streams))
    hosts = keeps_hosts(conn)
    on_host = host is not None and hosts
    sql = (
        "SELECT e.*, c.tool AS c_tool, c.status AS c_status, c.agent AS c_agent, c.session_id AS c_session,"
        f" {'c.host' if hosts else 'NULL'} AS c_host"
        f" FROM events AS e LEFT JOIN commands AS c ON c.id = e.command_id WHERE e.stream IN ({marks})"
        + (f" AND {_ON_HOST}" if on_host else "")
        + " ORDER BY e.position DESC"
        + (" LIMIT ?" if limit else "")
    )
    params: list[Any] = [*streams, *([host] if on_host else []), *([limit] if limit else [])]
    cursor = conn.execute(sql, params)
    cursor.row_factory = sqlite3.Row
    rows = cursor.fetchall()
    return [history_entry(row, event) for row, event in zip(rows, stored_events(conn, rows), strict=True)]


# --- single events and their text --------------------------------------------------------


def event_at(conn: sqlite3.Connection, position: int) -> StoredEvent:
    return _one_event(conn, "position", position, str(position))


def event_by_id(conn: sqlite3.Connection, event_id: str) -> StoredEvent:
    return _one_event(conn, "event_id", event_id.lower(), event_id)


def _one_event(conn: sqlite3.Connection, column: str, value: object, shown: str) -> StoredEvent:
    cursor = conn.execute(f"SELECT * FROM events WHERE {column} = ?", (value,))
    cursor.row_factory = sqlite3.Row
    found = cursor.fetchall()
    if not found:
        raise NoSuchEvent(f"no event {shown} in the journal")
    return stored_events(conn, found)[0]


def events_between(
    conn: sqlite3.Connection, types: Sequence[str], start: int, end: int | None
) -> Iterator[StoredEvent]:
    marks = ", ".join("?" * len(types))
    cursor = conn.execute(
        f"SELECT * FROM events WHERE type IN ({marks}) AND position BETWEEN ? AND ? ORDER BY position",
        (*types, start, end if end is not None else SQLITE_INT_MAX),
    )
    cursor.row_factory = sqlite3.Row
    while rows := cursor.fetchmany(_BATCH):
        yield from stored_events(conn, rows)


def blob_if_any(conn: sqlite3.Connection, digest: str) -> bytes | None:
    row = conn.execute("SELECT content FROM blobs WHERE hash = ?", (digest,)).fetchone()
    return None if row is None else bytes(row[0])


# --- decoding ----------------------------------------------------------------------------


def stored_events(conn: sqlite3.Connection, rows: Sequence[sqlite3.Row]) -> list[StoredEvent]:
    """Rows of `events` as StoredEvents, with the sizes of the blobs they name."""
    return decode_stored_events(rows, lambda digests: _blob_sizes(conn, digests))


def _blob_sizes(conn: sqlite3.Connection, digests: set[str]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    remaining = iter(sorted(digests))
    while chunk := list(islice(remaining, 500)):
        marks = ", ".join("?" * len(chunk))
        for digest, size in conn.execute(f"SELECT hash, size FROM blobs WHERE hash IN ({marks})", chunk):
            sizes[digest] = size
    return sizes
