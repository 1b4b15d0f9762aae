"""The journal: one SQLite file, append-only, shared safely by several toolbus processes.

WAL, `BEGIN IMMEDIATE` for every write, a busy timeout, `synchronous=FULL` by default.
Event positions are the `events` rowid: gapless and in commit order across processes,
because every append happens inside an immediate (exclusive-writer) transaction.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

import anyio
import msgspec

from bus import Caller, CommandRecord, Event, JournalNotFound, JournalUnavailable, ObservationSaved, Status
from bus.events import encode_event_data
from journal.memory import apply_observation
from journal.schema import check_identity, migrate

T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL", "OFF"]

# Arguments of a rejected call are kept for the audit, but never more than this.
REJECTED_ARGUMENTS_LIMIT = 64 * 1024

Projection = Callable[[sqlite3.Connection, int, Event], None]
PROJECTIONS: dict[type[Event], Projection] = {
    ObservationSaved: apply_observation,  # type: ignore[dict-item]
}

_json = msgspec.json.Encoder()


def default_journal_path() -> Path:
    """`$XDG_STATE_HOME/toolbus/journal.db`, i.e. `~/.local/state/toolbus/journal.db`."""
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state_home) / "toolbus" / "journal.db"


def iso_time(ns: int) -> str:
    """UTC ISO 8601 with microseconds and a `Z`: readable, and sorts correctly as text."""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SqliteJournal:
    """The journal file, open for reading and appending."""

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout: float = 5.0,
        synchronous: Synchronous = "FULL",
        create: bool = True,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(1)
        self._conn = self._open(create, synchronous)

    # --- opening ----------------------------------------------------------------------

    def _open(self, create: bool, synchronous: Synchronous) -> sqlite3.Connection:
        if not self.path.exists():
            if not create:
                raise JournalNotFound(f"no journal at {self.path}: check --journal / $TOOLBUS_JOURNAL")
            self._create_file()
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            check_identity(conn)  # before WAL mode, which would change a stranger's file
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                raise JournalUnavailable(f"the journal at {self.path} cannot use WAL mode")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn)
        except sqlite3.DatabaseError as error:
            raise JournalUnavailable(_explain_sqlite(self.path, error)) from error
        return conn

    def _create_file(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as error:
            raise JournalUnavailable(
                f"cannot create the journal at {self.path}: {error.strerror}; "
                "choose a writable place with --journal or $TOOLBUS_JOURNAL"
            ) from error

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- running SQL off the event loop -----------------------------------------------

    def run_sync(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` with the connection, serialised with every other use of it."""
        with self._lock:
            try:
                return work(self._conn)
            except sqlite3.DatabaseError as error:
                raise JournalUnavailable(_explain_sqlite(self.path, error)) from error

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`run_sync` in a worker thread: SQLite never blocks the event loop."""
        return await anyio.to_thread.run_sync(self.run_sync, work, limiter=self._limiter)

    @staticmethod
    @contextmanager
    def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        """An immediate (writer) transaction, rolled back on any error."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- the bus's side (bus.Journal) ---------------------------------------------------

    async def begin(self, record: CommandRecord) -> int:
        def work(conn: sqlite3.Connection) -> int:
            with self.transaction(conn):
                return _insert_command(conn, record, "in_doubt")

        return await self.run(work)

    async def finish(
        self,
        record: CommandRecord,
        command_id: int | None,
        status: Status,
        *,
        error: str | None = None,
        events: Sequence[Event] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> list[int]:
        return await self.run(
            lambda conn: self.finish_sync(conn, record, command_id, status, error, events, blobs)
        )

    def finish_sync(
        self,
        conn: sqlite3.Connection,
        record: CommandRecord,
        command_id: int | None,
        status: Status,
        error: str | None = None,
        events: Sequence[Event] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> list[int]:
        """One transaction: the command's final row, its blobs, its events and their projections."""
        finished_ns = time.time_ns()
        with self.transaction(conn):
            if command_id is None:
                command_id = _insert_command(conn, record, status, error, finished_ns)
            else:
                conn.execute(
                    "UPDATE commands SET status = ?, error = ?, finished_at = ?, duration_ms = ?"
                    " WHERE id = ?",
                    (
                        status,
                        error,
                        iso_time(finished_ns),
                        (finished_ns - record.received_ns) / 1e6,
                        command_id,
                    ),
                )
            if blobs:
                conn.executemany(
                    "INSERT OR IGNORE INTO blobs (hash, size, content) VALUES (?, ?, ?)",
                    [(digest, len(content), content) for digest, content in blobs.items()],
                )
            return [self._append(conn, command_id, event, finished_ns) for event in events]

    def _append(self, conn: sqlite3.Connection, command_id: int | None, event: Event, ns: int) -> int:
        cursor = conn.execute(
            "INSERT INTO events (event_id, command_id, type, version, stream, recorded_at, data)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                uuid.uuid4().hex,
                command_id,
                event.__struct_config__.tag,
                type(event).version,
                event.stream,
                iso_time(ns),
                encode_event_data(event).decode(),
            ),
        )
        position = cursor.lastrowid
        assert position is not None
        if projection := PROJECTIONS.get(type(event)):
            projection(conn, position, event)
        return position


def _insert_command(
    conn: sqlite3.Connection,
    record: CommandRecord,
    status: Status,
    error: str | None = None,
    finished_ns: int | None = None,
) -> int:
    caller: Caller = record.caller
    cursor = conn.execute(
        "INSERT INTO commands (tool, arguments, agent, department, client_name, client_version, session_id,"
        " pid, received_at, finished_at, duration_ms, status, error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            record.tool,
            _arguments_json(record.arguments, status),
            caller.agent,
            caller.department,
            caller.client_name,
            caller.client_version,
            caller.session_id,
            os.getpid(),
            iso_time(record.received_ns),
            iso_time(finished_ns) if finished_ns else None,
            (finished_ns - record.received_ns) / 1e6 if finished_ns else None,
            status,
            error,
        ),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _arguments_json(arguments: object, status: Status) -> str:
    try:
        text = _json.encode(arguments).decode()
    except (TypeError, msgspec.EncodeError):
        text = _json.encode(repr(arguments)).decode()
    if status == "rejected" and len(text) > REJECTED_ARGUMENTS_LIMIT:
        return _json.encode({"_truncated": True, "bytes": len(text), "head": text[:4096]}).decode()
    return text


def _explain_sqlite(path: Path, error: sqlite3.DatabaseError) -> str:
    message = str(error)
    if "locked" in message or "busy" in message:
        return f"the journal at {path} is locked by another process (waited for it): try again"
    if "readonly" in message or "read-only" in message:
        return f"the journal at {path} is read-only: fix its permissions or choose another with --journal"
    if "disk is full" in message or "full" in message:
        return f"the disk holding the journal at {path} is full: free space, nothing was written"
    if "not a database" in message or "malformed" in message:
        return f"not a toolbus journal: {path} is not a SQLite database ({message})"
    if "unable to open" in message:
        return f"cannot open the journal at {path}: {message}; check the path and its permissions"
    return f"the journal at {path} failed: {message}"
