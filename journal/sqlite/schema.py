"""The journal's tables, created and migrated through sqlite-utils; version in `PRAGMA user_version`.

Migrations are steps appended to `MIGRATIONS`, never edited. They add tables, columns and views,
and add or drop indexes; they never change a stored row. A journal written by an older toolbus
opens in a newer one.
"""

from __future__ import annotations

import importlib
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from toolbus.bus.errors import JournalUnavailable
from toolbus.journal.sqlite.memory import (
    add_audience_table,
    create_memory_tables,
    create_missing_indexes,
    keep_audience_by_trigger,
)

if TYPE_CHECKING:  # loaded only to create or migrate a journal (40 ms a command would pay)
    import sqlite_utils

# 'tbus': marks a SQLite file as a toolbus journal, so toolbus never writes into a stranger's database.
APPLICATION_ID = 0x74627573


def _v1_core(db: sqlite_utils.Database) -> None:
    db["commands"].create(  # type: ignore[union-attr]
        {
            "id": int,
            "tool": str,
            "arguments": str,  # JSON, as the client sent it
            "agent": str,
            "department": str,
            "client_name": str,
            "client_version": str,
            "session_id": str,
            "pid": int,  # the toolbus process that ran it
            "received_at": str,  # ISO 8601, UTC, microseconds: sorts as text
            "finished_at": str,
            "duration_ms": float,
            "status": str,  # ok | rejected | failed | in_doubt | cancelled
            "error": str,
        },
        pk="id",
        not_null={"tool", "received_at", "status"},
    )
    db["events"].create(  # type: ignore[union-attr]
        {
            "position": int,  # the rowid: gapless, in commit order, across processes
            "event_id": str,
            "command_id": int,
            "type": str,
            "version": int,
            "stream": str,
            "recorded_at": str,
            "data": str,  # JSON
        },
        pk="position",
        not_null={"event_id", "type", "version", "stream", "recorded_at", "data"},
        foreign_keys=[("command_id", "commands", "id")],
    )
    db["blobs"].create(  # type: ignore[union-attr]
        {"hash": str, "size": int, "content": bytes},
        pk="hash",
        not_null={"size", "content"},
    )
    db["commands"].create_index(["received_at"])  # type: ignore[union-attr]
    db["commands"].create_index(["tool", "received_at"])  # type: ignore[union-attr]
    db["commands"].create_index(["status", "received_at"])  # type: ignore[union-attr]
    db["commands"].create_index(["session_id", "received_at"])  # type: ignore[union-attr]
    db["commands"].create_index(["agent", "received_at"])  # type: ignore[union-attr]
    db["events"].create_index(["event_id"], unique=True)  # type: ignore[union-attr]
    db["events"].create_index(["stream", "position"])  # type: ignore[union-attr]
    db["events"].create_index(["command_id"])  # type: ignore[union-attr]
    db["events"].create_index(["type", "position"])  # type: ignore[union-attr]


def _memory_tables(db: sqlite_utils.Database) -> None:
    create_memory_tables(db)


# What an event about a file leaves to recover: the text a save, restore or accepted diff
# replaced, a close discarded, a rejected diff proposed, or a failed acceptance would have written.
_RECOVERABLE = """CASE e.type
           WHEN 'DiffRejected' THEN json_extract(e.data, '$.proposed_blob')
           WHEN 'DiffAcceptFailed' THEN json_extract(e.data, '$.final_blob')
           WHEN 'DiffAcceptInDoubt' THEN json_extract(e.data, '$.final_blob')
           ELSE coalesce(json_extract(e.data, '$.replaced_blob'), json_extract(e.data, '$.discarded_blob'))
       END"""

# Views for reading the journal with any SQLite tool; documented in journal/SCHEMA.md.
AUDIT_VIEWS = {
    # One row per command and event (a command without events: one row, event columns NULL).
    "audit_log": """
SELECT c.id AS command_id, c.received_at, c.tool, c.status, c.duration_ms, c.error,
       c.agent, c.department, c.session_id, c.host, c.client_name, c.arguments,
       e.position, e.event_id, e.type AS event_type, e.stream, e.data AS event_data
FROM commands AS c LEFT JOIN events AS e ON e.command_id = c.id""",
    # Saves, refused saves, closes, restores, replays and diffs, per file; `stream = 'file:' || path`
    # is indexed.
    "file_history": f"""
SELECT e.position, e.recorded_at, substr(e.stream, 6) AS path, e.stream, e.type AS event_type,
       c.tool, c.agent, c.session_id, c.host, e.command_id,
       json_extract(e.data, '$.bytes_written') AS bytes_written,
       json_extract(e.data, '$.disk_changed') AS disk_changed,
       json_extract(e.data, '$.was_modified') AS was_modified,
       json_extract(e.data, '$.reason') AS refused_because,
       json_extract(e.data, '$.written_blob') AS written_blob,
       {_RECOVERABLE} AS recoverable_blob,
       b.size AS recoverable_bytes
FROM events AS e
LEFT JOIN commands AS c ON c.id = e.command_id
LEFT JOIN blobs AS b ON b.hash = {_RECOVERABLE}
WHERE e.stream >= 'file:' AND e.stream < 'file;'""",
}


def _audit_views(db: sqlite_utils.Database) -> None:
    for name, sql in AUDIT_VIEWS.items():
        db.create_view(name, sql.strip())


# The WHERE of `_fewer_indexes`'s partial index, word for word: SQLite uses that index only for
# a query whose WHERE has this very term.
NOT_OK = "status != 'ok'"


def _fewer_indexes(db: sqlite_utils.Database) -> None:
    """Keep only the indexes that readers walk: every index costs each append a page write.

    Commands: by received_at, the index also holding agent and session_id, so that filters on
    them (which have no index of their own) read the index alone until a row matches; by
    (tool, received_at); and, in a partial index, the rare commands whose status is not ok.
    Events: by event_id, (stream, position) and command_id; `replay` reads them in position order.
    """
    for name in (
        "idx_commands_received_at",
        "idx_commands_status_received_at",
        "idx_commands_session_id_received_at",
        "idx_commands_agent_received_at",
        "idx_events_type_position",
    ):
        db.execute(f"DROP INDEX IF EXISTS {name}")
    db.execute(
        "CREATE INDEX idx_commands_received_at_id_agent_session_id ON commands (received_at, id, agent, session_id)"
    )
    db.execute(
        "CREATE INDEX idx_commands_not_ok_status_received_at ON commands (status, received_at) WHERE status != 'ok'"
    )


def _diff_history(db: sqlite_utils.Database) -> None:
    """`file_history` names what a diff decision leaves to recover: a rejected proposal, and
    the text a user accepted that could not be written."""
    db.execute("DROP VIEW IF EXISTS file_history")
    db.create_view("file_history", AUDIT_VIEWS["file_history"].strip())


def _host(db: sqlite_utils.Database) -> None:
    """Commands record the machine they ran on, and both views show it: a team's journal holds
    one file path of several machines. Rows from before stay NULL (machine unknown)."""
    for name in AUDIT_VIEWS:
        db.execute(f"DROP VIEW IF EXISTS {name}")
    db["commands"].add_column("host", str)  # type: ignore[union-attr]
    _audit_views(db)


def _search_index(db: sqlite_utils.Database) -> None:
    """The memory store's indexes an older journal lacks. It added `observations_visible`,
    which `_audience_table` replaced: since then there is none to add to a journal of schema 6."""
    create_missing_indexes(db.conn)


def _audience_table(db: sqlite_utils.Database) -> None:
    """Who may see each observation, in a narrow table a search checks its matches against."""
    add_audience_table(db.conn)


def _audience_trigger(db: sqlite_utils.Database) -> None:
    """That table kept in step by a trigger, whatever toolbus saves an observation."""
    keep_audience_by_trigger(db.conn)


def _pending(db: sqlite_utils.Database) -> None:
    """A command under way records what its action may do (`journal.abandoned`), so that the
    next `toolbus serve` can say so if the process dies before the outcome. Rows from before
    stay NULL: nothing pending."""
    db["commands"].add_column("pending", str)  # type: ignore[union-attr]


def _accept_in_doubt_history(db: sqlite_utils.Database) -> None:
    """`file_history` names the text a user accepted whose write is in doubt."""
    _diff_history(db)


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _v1_core,
    _memory_tables,
    _audit_views,
    _fewer_indexes,
    _diff_history,
    _host,
    _search_index,
    _audience_table,
    _audience_trigger,
    _pending,
    _accept_in_doubt_history,
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database up to `SCHEMA_VERSION`, refusing files that are not toolbus journals.

    Runs inside `BEGIN IMMEDIATE`, so several processes opening one new journal at once
    create it exactly once.
    """
    if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
        # Loaded (40 ms) before the lock that other toolbus processes would wait for meanwhile.
        importlib.import_module("sqlite_utils")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if steps := MIGRATIONS[check_identity(conn) :]:
            import sqlite_utils

            # SQLite's default, as on every connection that does not migrate.
            db = sqlite_utils.Database(conn, recursive_triggers=False)
            for step in steps:
                step(db)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def check_identity(conn: sqlite3.Connection) -> int:
    """The schema version of a toolbus journal (0 for an empty file); raises for anything else."""
    application_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if application_id == APPLICATION_ID:
        if version > SCHEMA_VERSION:
            raise JournalUnavailable(
                f"the journal has schema version {version}, newer than this toolbus understands "
                f"({SCHEMA_VERSION}): upgrade toolbus"
            )
        return int(version)
    has_tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if application_id != 0 or has_tables:
        raise JournalUnavailable("not a toolbus journal: the file is a SQLite database of something else")
    return 0
