"""The journal: one SQLite file, append-only, shared safely by several toolbus processes.

WAL, `BEGIN IMMEDIATE` for every write, a busy timeout, `synchronous=FULL` by default, but
for the records of calls that change nothing (`_Flusher` says how those reach the disk). A
commit that waits for no disk is made on the event loop when nothing is in its way
(`_commit_at_once`).
Event positions are the `events` rowid: gapless and in commit order across processes,
because every append happens inside an immediate (exclusive-writer) transaction.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TypeVar

from toolbus.bus import Appended, CommandRecord, Event, JournalNotFound, JournalUnavailable, ObservationSaved, Status
from toolbus.bus.events import encode_event_data
from toolbus.bus.moments import iso_time
from toolbus.journal.abandoned import Abandoned, dead_commands, pending_text, why_abandoned
from toolbus.journal.location import Synchronous
from toolbus.journal.rows import Outcome, command_row, event_ids, timed_in_order, valid_text
from toolbus.journal.sqlite.memory import apply_observation
from toolbus.journal.sqlite.replay import rebuild_memory
from toolbus.journal.sqlite.schema import NOT_OK, check_identity, migrate
from toolbus.journal.sqlite.sql import transaction
from toolbus.journal.worker import Worker

T = TypeVar("T")
E = TypeVar("E", bound=Event)
# FULL: every commit durable across power loss; NORMAL: safe from a crash of toolbus, not of the machine.

Projection = Callable[[sqlite3.Connection, int, Event], None]
PROJECTIONS: dict[type[Event], Projection] = {
    ObservationSaved: apply_observation,  # type: ignore[dict-item]
}

log = logging.getLogger("toolbus.journal")

# Background checkpoints: how long after a commit, and the WAL size (in pages) at which a
# commit checkpoints by itself because the background thread has not (SQLite's default: 1000).
CHECKPOINT_DELAY = 0.05
FALLBACK_CHECKPOINT_PAGES = 10_000
# How long after a read's unsynced commit the WAL is fsynced (SPEC: within one second at most).
READ_FLUSH_DELAY = 0.2
# The most text a commit that waits for no disk may carry and still be written on the event loop.
AT_ONCE_BYTES = 64 * 1024
# Work that waited its turn longer than this has its wait for another process's lock shortened.
_QUEUED_NOTICEABLY = 0.01

# Whether the task's last work on the journal found it held by another process (`run`).
_found_held: ContextVar[bool] = ContextVar("toolbus_journal_found_held", default=False)


class _HeldElsewhere(JournalUnavailable):
    """Another process held the journal for as long as this work could wait."""


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
        self._synchronous = synchronous
        self._conn = self._open(create, synchronous)
        self._identity = _identity(path)
        self._worker: Worker | None = None
        self._checkpointer = _Checkpointer(path, synchronous, self._lock)
        self._flusher = _Flusher(Path(f"{path}-wal"))
        self._changes = self._conn.total_changes

    # --- opening ----------------------------------------------------------------------

    def _open(self, create: bool, synchronous: Synchronous) -> sqlite3.Connection:
        if not self.path.exists():
            if not create:
                raise JournalNotFound(f"no journal at {self.path}: check --journal / $TOOLBUS_JOURNAL")
            self._create_file()
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as error:
            raise JournalUnavailable(explain_sqlite(self.path, error)) from error
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            _check_identity_in_one_snapshot(conn)  # before WAL mode, which would change a stranger's file
            if self._enter_wal_mode(conn).lower() != "wal":
                raise JournalUnavailable(f"the journal at {self.path} cannot use WAL mode")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
            # Checkpoints run on their own thread (`_Checkpointer`); a commit checkpoints only
            # if that thread has fallen far behind.
            conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_CHECKPOINT_PAGES}")
            migrate(conn)
        except BaseException as error:
            conn.close()
            if isinstance(error, sqlite3.DatabaseError):
                raise JournalUnavailable(explain_sqlite(self.path, error)) from error
            raise
        return conn

    def _enter_wal_mode(self, conn: sqlite3.Connection) -> str:
        """`PRAGMA journal_mode = WAL`, retried: when several processes open a new journal at
        once, the switch can answer "locked" at once, without waiting out the busy timeout."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as error:
                if not is_contention(error) or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def _create_file(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as error:
            raise JournalUnavailable(
                f"cannot create the journal at {self.path}: {why_not_creatable(self.path) or error.strerror}; "
                "choose a writable place with --journal or $TOOLBUS_JOURNAL"
            ) from error

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
        self._checkpointer.stop()
        self._flusher.stop()
        with self._lock:
            self._conn.close()

    # --- running SQL off the event loop -----------------------------------------------

    def run_sync(self, work: Callable[[sqlite3.Connection], T], deadline: float | None = None) -> T:
        """Run `work` with the connection, serialised with every other use of it. Another
        process's lock is waited for until `deadline` (`time.monotonic()`), else for the busy
        timeout."""
        with self._lock:
            self._check_same_file()
            shortened = deadline is not None and self._wait_until(deadline)
            try:
                return work(self._conn)
            except sqlite3.DatabaseError as error:
                if is_contention(error):
                    raise _HeldElsewhere(explain_sqlite(self.path, error)) from error
                raise JournalUnavailable(explain_sqlite(self.path, error)) from error
            finally:
                if shortened:
                    self._conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                if self._conn.total_changes != self._changes:
                    self._changes = self._conn.total_changes
                    self._checkpointer.nudge()

    def _wait_until(self, deadline: float) -> bool:
        """Shorten the busy timeout to what is left before `deadline`, if it has run down:
        whether it was."""
        left = deadline - time.monotonic()
        if left > self.busy_timeout - _QUEUED_NOTICEABLY:
            return False
        self._conn.execute(f"PRAGMA busy_timeout = {max(0, int(left * 1000))}")
        return True

    def _check_same_file(self) -> None:
        """Refuse to go on if the journal file was removed or replaced since it was opened: the
        connection would write to a file nobody can see any more, and its commits would be lost."""
        try:
            same = _identity(self.path) == self._identity
        except FileNotFoundError:
            raise JournalUnavailable(
                f"the journal at {self.path} was removed while toolbus was running; nothing was "
                "written: restore the file, or restart toolbus to start a new journal"
            ) from None
        if not same:
            raise JournalUnavailable(
                f"the journal at {self.path} was replaced by another file while toolbus was running; "
                "nothing was written to either: restart toolbus to use the new file"
            )

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """`run_sync` on the journal's own thread: SQLite never blocks the event loop.

        Shielded: once handed over, the work completes and its outcome is awaited even if the
        caller is cancelled, so a commit is never left unobserved.

        The busy timeout runs from the hand-over, not from the work's turn: while another
        process holds the journal, the calls queued behind one waiting for it fail with it,
        not one timeout after another. A task whose last work found the journal held tries its
        next (the record of its failure) once, without waiting again.
        """
        import anyio

        if self._worker is None:
            self._worker = Worker()
        deadline = time.monotonic() + (0.0 if _found_held.get() else self.busy_timeout)
        future = self._worker.submit(lambda job: self.run_sync(job, deadline), work)
        with anyio.CancelScope(shield=True):
            try:
                result = await future
            except _HeldElsewhere:
                _found_held.set(True)
                raise
        _found_held.set(False)
        return result

    transaction = staticmethod(transaction)

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection, *, sync: bool) -> Iterator[None]:
        """`transaction`, whose commit waits for the disk (`sync`: a change's record) or not (the
        record of a call that changed nothing: committed, so it survives a crash of toolbus, and
        brought to the disk by `_Flusher`). `PRAGMA synchronous` may change between transactions;
        with `--journal-sync NORMAL` nothing waits for the disk, as the user chose."""
        relaxed = not sync and self._synchronous == "FULL"
        if relaxed:
            conn.execute("PRAGMA synchronous = NORMAL")
        try:
            with self.transaction(conn):
                yield
        finally:
            if relaxed:
                conn.execute("PRAGMA synchronous = FULL")
        if relaxed:
            self._flusher.unsynced()
        elif self._synchronous == "FULL":
            self._flusher.synced()

    # --- the bus's side (bus.Journal) ---------------------------------------------------

    async def begin(
        self,
        record: CommandRecord,
        keep: Mapping[str, bytes] | None = None,
        *,
        durable: bool = True,
        pending: Sequence[Event] = (),
    ) -> int:
        def work(conn: sqlite3.Connection) -> int:
            if keep:
                _insert_blobs(conn, keep)
            return _insert_begun(conn, record, pending_text(pending))

        return await self._commit(work, sync=durable, blobs=keep)

    async def finish(
        self,
        record: CommandRecord,
        command_id: int | None,
        status: Status,
        *,
        error: str | None = None,
        events: Sequence[E] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> list[Appended[E]]:
        return await self._commit(
            lambda conn: _record(conn, record, status, error, events, blobs, command_id, time.time_ns()),
            sync=record.changes,
            blobs=blobs,
        )

    async def _commit(
        self, work: Callable[[sqlite3.Connection], T], *, sync: bool, blobs: Mapping[str, bytes] | None
    ) -> T:
        """`work` in one transaction, committed; it waits for the disk if `sync` and the journal is
        FULL. One that waits for no disk and writes little is committed at once, on the caller's
        thread (`_commit_at_once`)."""
        at_once = (not sync or self._synchronous == "NORMAL") and _size(blobs) <= AT_ONCE_BYTES
        if at_once and (done := self._commit_at_once(work, sync=sync)) is not None:
            return done[0]

        def on_thread(conn: sqlite3.Connection) -> T:
            with self._transaction(conn, sync=sync):
                return work(conn)

        return await self.run(on_thread)

    def _commit_at_once(self, work: Callable[[sqlite3.Connection], T], *, sync: bool) -> tuple[T] | None:
        """`work` committed here and now, on the event loop, if nothing stands in the way: its
        result, boxed, or None when it must go the usual way (nothing was written).

        A commit that waits for no disk writes a few pages to the -wal file (~30 µs); the hop to
        the journal's thread and back costs more: two thread wake-ups. It is made on the journal's
        own connection, whose page cache (and FTS5's) a commit of another connection would make
        stale, costing the next search ~0.7 ms. It never waits: the writers' lock is taken only if
        free, another process writing makes it give up at once, and no checkpoint runs in its
        commit. Whatever goes wrong, it rolls back and the commit goes to the journal's thread,
        which waits and reports as it always does."""
        if not self._lock.acquire(blocking=False):  # the journal's thread is at work: queue behind it
            return None
        try:
            try:
                self._check_same_file()
                self._wait_for_others(False)
            except (sqlite3.Error, JournalUnavailable):  # nothing was written
                with contextlib.suppress(sqlite3.Error):
                    self._wait_for_others(True)
                return None
            try:
                done = (self._committed(work, sync=sync),)
            except sqlite3.Error:
                log.debug("a commit goes to the journal's thread", exc_info=True)
                if self._conn.in_transaction:  # a failed COMMIT: never hold the write lock
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                return None
            finally:
                # Outside the `except` above: once committed, a failure here must not send the
                # same record to the journal's thread a second time.
                self._wait_for_others(True)
        finally:
            self._lock.release()
        self._checkpointer.nudge()
        return done

    def _committed(self, work: Callable[[sqlite3.Connection], T], *, sync: bool) -> T:
        with self._transaction(self._conn, sync=sync):
            return work(self._conn)

    def _wait_for_others(self, wait: bool) -> None:
        """The connection as configured (`wait`), or with no busy timeout and no checkpoint in a
        commit, for a commit made on the event loop."""
        busy_ms = int(self.busy_timeout * 1000) if wait else 0
        self._conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_CHECKPOINT_PAGES if wait else 0}")

    def finish_sync(
        self,
        conn: sqlite3.Connection,
        record: CommandRecord,
        command_id: int | None,
        status: Status,
        error: str | None = None,
        events: Sequence[E] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> list[Appended[E]]:
        """One transaction: the command's final row, its blobs, its events and their projections.
        A change's record waits for the disk as configured (FULL by default); any other is
        committed without waiting, and reaches the disk within a second (`_Flusher`)."""
        with self._transaction(conn, sync=record.changes):
            return _record(conn, record, status, error, events, blobs, command_id, time.time_ns())

    async def append(self, command_id: int, events: Sequence[E], blobs: Mapping[str, bytes]) -> list[Appended[E]]:
        def work(conn: sqlite3.Connection) -> list[Appended[E]]:
            with self.transaction(conn):
                _insert_blobs(conn, blobs)
                timed = timed_in_order(events, lambda: _latest_observation(conn))
                positions = _append(conn, [(command_id, event) for event in timed], iso_time(time.time_ns()))
                return list(map(Appended, positions, timed))

        return await self.run(work)

    async def keep_blobs(
        self, blobs: Mapping[str, bytes], *, command_id: int | None = None, pending: Sequence[Event] = ()
    ) -> None:
        def work(conn: sqlite3.Connection) -> bool:
            before = conn.total_changes
            _insert_blobs(conn, blobs)
            if command_id is not None:
                conn.execute("UPDATE commands SET pending = ? WHERE id = ?", (pending_text(pending), command_id))
            return conn.total_changes != before

        if not await self._commit(work, sync=True, blobs=blobs) and self._synchronous == "FULL":
            # Texts kept already leave the transaction empty, and SQLite then writes and syncs
            # nothing: a write-ahead row committed without a sync before it would stay off the disk.
            await self.run(lambda conn: self._flusher.sync_now())

    async def settle_abandoned(self, host: str) -> int:
        def work(conn: sqlite3.Connection) -> int:
            gone = dead_commands(conn.execute(_ABANDONED_HERE, (host,)).fetchall())
            if not gone:
                return 0
            with self._transaction(conn, sync=True):
                return _settle(conn, gone)

        return await self.run(work)

    def rebuild_memory(self) -> int:
        """Drop the memory store and rebuild it from the journal's events; the observation count."""
        return self.run_sync(rebuild_memory)

    def record_many_sync(self, conn: sqlite3.Connection, outcomes: Sequence[Outcome]) -> list[list[int]]:
        """Several finished commands in one transaction (imports, benchmarks): one fsync for all,
        their observations at the times they hold. Returns each command's event positions."""
        finished_ns = time.time_ns()
        with self.transaction(conn):
            return _record_new(conn, outcomes, finished_ns)


def _record(
    conn: sqlite3.Connection,
    record: CommandRecord,
    status: Status,
    error: str | None,
    events: Sequence[E],
    blobs: Mapping[str, bytes] | None,
    command_id: int | None,
    finished_ns: int,
) -> list[Appended[E]]:
    """A call's outcome as it happens, inside its transaction: the command's final row, its
    blobs, its events (an observation timed after the journal's latest) and their projections."""
    timed = timed_in_order(events, lambda: _latest_observation(conn))
    outcome = Outcome(record, status, error, timed, blobs)
    positions = _record_outcome(conn, outcome, command_id, finished_ns)
    return list(map(Appended, positions, timed))


# The latest time of the observations: read inside a write transaction, no other commits before it.
_LATEST_OBSERVATION = "SELECT max(created_at_epoch) FROM observations"


def _latest_observation(conn: sqlite3.Connection) -> int | None:
    latest: int | None = conn.execute(_LATEST_OBSERVATION).fetchone()[0]
    return latest


def _record_outcome(conn: sqlite3.Connection, outcome: Outcome, command_id: int | None, finished_ns: int) -> list[int]:
    """The command's final row, its blobs, its events and their projections (inside a transaction)."""
    if command_id is None:
        return _record_new(conn, (outcome,), finished_ns)[0]
    conn.execute(
        "UPDATE commands SET status = ?, error = ?, finished_at = ?, duration_ms = ?, pending = NULL WHERE id = ?",
        (
            outcome.status,
            valid_text(outcome.error),
            iso_time(finished_ns),
            (finished_ns - outcome.record.received_ns) / 1e6,
            command_id,
        ),
    )
    if outcome.blobs:
        _insert_blobs(conn, outcome.blobs)
    return _append(conn, [(command_id, event) for event in outcome.events], iso_time(finished_ns))


def _record_new(conn: sqlite3.Connection, outcomes: Sequence[Outcome], finished_ns: int) -> list[list[int]]:
    """Finished commands that were never begun, with their blobs, events and projections (inside
    a transaction); each command's event positions. One `executemany` per table: per-row Python
    work is most of what a batch costs."""
    finished_at = iso_time(finished_ns)
    pid = os.getpid()
    rows = [command_row(o.record, o.status, o.error, pid, finished_ns, finished_at) for o in outcomes]
    first_id = _insert_consecutive(conn, _INSERT_COMMAND, rows)
    events: list[tuple[int, Event]] = []
    for command_id, outcome in enumerate(outcomes, first_id):
        if outcome.blobs:
            _insert_blobs(conn, outcome.blobs)
        events += [(command_id, event) for event in outcome.events]
    positions = _append(conn, events, finished_at)
    by_command: list[list[int]] = []
    for outcome in outcomes:
        by_command.append(positions[: len(outcome.events)])
        del positions[: len(outcome.events)]
    return by_command


# Begun on this machine and not finished, with events pending (`journal.abandoned`). Through the
# partial index of commands that are not `ok`: an in-doubt command is one of the few there.
_ABANDONED_HERE = (
    "SELECT id, pid, pending FROM commands"
    f" WHERE {NOT_OK} AND status = 'in_doubt' AND finished_at IS NULL AND pending IS NOT NULL AND host = ?"
)


def _settle(conn: sqlite3.Connection, gone: Sequence[Abandoned]) -> int:
    """Append the pending events of commands whose process is gone, each once (inside a transaction)."""
    settled = 0
    for command_id, pid, events in gone:
        claimed = conn.execute(
            "UPDATE commands SET pending = NULL, error = coalesce(error, ?)"
            " WHERE id = ? AND pending IS NOT NULL AND finished_at IS NULL",
            (why_abandoned(pid), command_id),
        )
        if claimed.rowcount:  # not settled meanwhile by another toolbus starting
            _append(conn, [(command_id, event) for event in events], iso_time(time.time_ns()))
            settled += 1
    return settled


def _insert_consecutive(conn: sqlite3.Connection, sql: str, rows: Sequence[tuple[object, ...]]) -> int:
    """Insert `rows`, returning the first one's rowid. SQLite gives each new row the largest rowid
    plus one, and inside `BEGIN IMMEDIATE` no other writer comes between: the rows get consecutive
    rowids, so ids and positions stay gapless and in commit order."""
    if len(rows) == 1:
        cursor = conn.execute(sql, rows[0])
        assert cursor.lastrowid is not None
        return cursor.lastrowid
    conn.executemany(sql, rows)
    return int(conn.execute("SELECT last_insert_rowid()").fetchone()[0]) - len(rows) + 1


def _insert_blobs(conn: sqlite3.Connection, blobs: Mapping[str, bytes]) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO blobs (hash, size, content) VALUES (?, ?, ?)",
        [(digest, len(content), content) for digest, content in blobs.items()],
    )


_INSERT_EVENT = (
    "INSERT INTO events (event_id, command_id, type, version, stream, recorded_at, data) VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _append(conn: sqlite3.Connection, events: Sequence[tuple[int, Event]], recorded_at: str) -> list[int]:
    """Events (each with its command id) at the next positions, then their projections."""
    if not events:
        return []
    ids = event_ids(len(events))
    rows = [
        (
            ids[index],
            command_id,
            event.type_name(),
            type(event).version,
            event.stream,
            recorded_at,
            encode_event_data(event).decode(),
        )
        for index, (command_id, event) in enumerate(events)
    ]
    first = _insert_consecutive(conn, _INSERT_EVENT, rows)
    for position, (_, event) in enumerate(events, first):
        if projection := PROJECTIONS.get(type(event)):
            projection(conn, position, event)
    return list(range(first, first + len(events)))


def _size(blobs: Mapping[str, bytes] | None) -> int:
    return sum(map(len, blobs.values())) if blobs else 0


def _check_identity_in_one_snapshot(conn: sqlite3.Connection) -> None:
    """`check_identity` inside one read transaction. Its statements would otherwise each see
    the file as it is then, and another process's migration committing between them would
    make a half-seen journal (tables, no application id yet) look like a stranger's database."""
    conn.execute("BEGIN")
    try:
        check_identity(conn)
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def _identity(path: Path) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_dev, status.st_ino


class _Checkpointer:
    """Copies committed pages from the WAL into the database file, on its own connection and
    thread, a little after writes happen. A PASSIVE checkpoint never blocks writers, so no
    tool call's commit waits for the bulk of one; and batching them copies each hot page once."""

    def __init__(self, path: Path, synchronous: Synchronous, writers: threading.Lock) -> None:
        self._path = path
        self._synchronous = synchronous
        self._writers = writers
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def nudge(self) -> None:
        """Something was committed: checkpoint soon."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="toolbus-checkpoint", daemon=True)
            self._thread.start()
        _wake(self._wake)

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            log.warning("no background checkpoints for %s: commits will checkpoint", self._path)
            return
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            while not self._stopping:
                self._wake.wait()
                time.sleep(CHECKPOINT_DELAY)  # let a burst of commits finish first
                self._wake.clear()
                self._checkpoint(conn)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            # Commits made during that pass leave the WAL unfinished, and SQLite restarts the WAL
            # from its start only when a writer finds it fully copied; under steady calls that
            # never happens, so the WAL grew to the fallback size and every commit extended the
            # file (a slower fsync than overwriting). Copying those last few frames while this
            # process's writers wait lets the next commit wrap. The wait is an fsync of the WAL and
            # one of the database file when frames arrived during the first pass: a few
            # milliseconds under steady writes (median 4 ms in the append benchmark), once per pass.
            with self._writers:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:  # another process is checkpointing, or the disk is unhappy: next time
            log.debug("background checkpoint of %s failed", self._path, exc_info=True)


class _Flusher:
    """Brings the records committed without a sync (reads') to the disk within a second.

    Such a commit has written its frames to the -wal file: a crash of toolbus cannot lose them,
    a power cut can until the file is fsynced. The next change's commit does that (SQLite syncs
    the whole -wal file at FULL, earlier frames with it); if none comes, this thread fsyncs the
    file READ_FLUSH_DELAY after the first unsynced commit, whatever else the journal is doing
    (a checkpoint pass may take longer than a second, so it is not done on that thread). An
    fsync on our own descriptor flushes the pages other descriptors wrote; and SQLite keeps no
    POSIX lock on the -wal file (WAL locks live in -shm), so closing ours releases none of its.
    Called under the writers' lock (`unsynced`, `synced`), so a commit is written before it is
    counted; a flag cleared before the fsync can only cause one fsync too many, never one too few.
    """

    def __init__(self, wal: Path) -> None:
        self._wal = wal
        self._pending = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def unsynced(self) -> None:
        """A commit did not wait for the disk: fsync soon."""
        self._pending = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="toolbus-flush", daemon=True)
            self._thread.start()
        _wake(self._wake)

    def synced(self) -> None:
        """A commit synced the -wal file, with every earlier frame in it."""
        self._pending = False

    def sync_now(self) -> None:
        """fsync the -wal file here and now, every commit in it with it; raises if that fails."""
        self._pending = False
        try:
            _fsync(self._wal)
        except OSError as error:
            raise JournalUnavailable(f"could not bring the journal to the disk ({self._wal}): {error}") from error

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._flush()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._stopping.wait(READ_FLUSH_DELAY)  # gather a burst of reads into one fsync
            self._wake.clear()
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        self._pending = False
        try:
            _fsync(self._wal)
        except FileNotFoundError:  # the last connection closed: checkpointed, synced and removed
            pass
        except OSError:
            log.warning("could not fsync %s: reads' records wait for the next change", self._wal, exc_info=True)


def _wake(event: threading.Event) -> None:
    """Set `event` unless it is set already, as it is under steady commits: `set` takes the
    event's lock, which its thread contends for (4 µs a commit in the append benchmark, with
    syncs off). Its thread clears it before its pass, which sees what was committed before."""
    if not event.is_set():
        event.set()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_COMMAND_COLUMNS = (
    "tool, arguments, agent, department, client_name, client_version, session_id,"
    " host, pid, received_at, finished_at, duration_ms, status, error"
)
_INSERT_COMMAND = f"INSERT INTO commands ({_COMMAND_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_BEGUN = f"INSERT INTO commands ({_COMMAND_COLUMNS}, pending) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"


def _insert_begun(conn: sqlite3.Connection, record: CommandRecord, pending: str | None) -> int:
    """A command under way, `in_doubt` until its outcome, with the events it leaves if its process dies."""
    row = (*command_row(record, "in_doubt", None, os.getpid(), None, None), pending)
    return _insert_consecutive(conn, _INSERT_BEGUN, [row])


def _writable(path: Path) -> bool:
    """Whether toolbus could write the journal and its -wal/-shm files (access(2) also says
    no on a read-only file system, even to root)."""
    return os.access(path.parent, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))


def _primary_code(error: sqlite3.Error) -> int | None:
    """SQLite's primary result code of `error` (its extended code's low byte), or None for an
    error Python raised itself."""
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_contention(error: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection (busy or locked)."""
    return _primary_code(error) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def explain_sqlite(path: Path, error: sqlite3.DatabaseError) -> str:
    """toolbus's words for a SQLite failure, chosen by its result code, never by its text."""
    code = _primary_code(error)
    if is_contention(error):
        return f"the journal at {path} is locked by another process (waited for it): try again"
    if code == sqlite3.SQLITE_READONLY:
        return f"the journal at {path} is read-only: fix its permissions or choose another with --journal"
    if code == sqlite3.SQLITE_FULL:
        return f"the disk holding the journal at {path} is full: free space, nothing was written"
    if code == sqlite3.SQLITE_NOTADB:
        return f"not a toolbus journal: {path} is not a SQLite database ({error})"
    if code == sqlite3.SQLITE_CORRUPT:
        return (
            f"the journal at {path} is damaged ({error}); nothing was written: keep a copy of it "
            "and check it with: sqlite3 JOURNAL 'PRAGMA integrity_check'"
        )
    if code == sqlite3.SQLITE_IOERR:
        return f"the journal at {path} could not be written (disk I/O error); check the disk holding it"
    if code == sqlite3.SQLITE_CANTOPEN and not _writable(path):
        return (
            f"the journal at {path} is read-only (it or its directory cannot be written, or the "
            "file system is read-only): fix that, or choose another place with --journal"
        )
    if code == sqlite3.SQLITE_CANTOPEN and path.is_dir():
        return f"not a toolbus journal: {path} is a directory; choose a file with --journal"
    if code == sqlite3.SQLITE_CANTOPEN:
        return f"cannot open the journal at {path}: {error}; check the path and its permissions"
    return f"the journal at {path} failed: {error}"


def why_not_creatable(path: Path) -> str | None:
    """Why a journal could not be made at `path`, where there is none yet, as far as one can
    tell without making it (its nearest existing folder, and what is wrong with it); None when
    nothing is seen against it."""
    nearest = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if nearest is not None and nearest.is_dir() and os.access(nearest, os.W_OK):
        return None
    return f"{nearest} {'is not writable' if nearest is None or nearest.is_dir() else 'is a file, not a folder'}"
