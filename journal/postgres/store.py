"""The team journal's writer on PostgreSQL: one connection, driven by its own thread.

Every write is one transaction whose rows carry keys chosen before it starts (the command's
`request_key`, the events' ids), so a transaction whose commit was cut off by a lost
connection can be sent again: what it already wrote conflicts and is found, not doubled.
A change's record is durable when the commit returns (PostgreSQL's default
`synchronous_commit`); the record of a call that changed nothing commits without waiting
for the disk, which the WAL writer reaches within a fraction of a second.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict

from toolbus.bus import Appended, CommandRecord, Event, JournalNotFound, JournalUnavailable, ObservationSaved, Status
from toolbus.bus.events import decode_event, encode_event_data
from toolbus.bus.moments import iso_time
from toolbus.journal.abandoned import Abandoned, dead_commands, pending_text, why_abandoned
from toolbus.journal.location import ambiguous_login, shown
from toolbus.journal.postgres.memory import INSERT_OBSERVATION, observation_params
from toolbus.journal.postgres.schema import (
    LOGIN_ADMINISTERS,
    SCHEMA,
    SCHEMA_VERSION,
    keeps_pending,
    newer_schema,
    schema_version,
    times_observations,
)
from toolbus.journal.rows import (
    Outcome,
    command_row,
    event_ids,
    json_without_nul,
    storable_row,
    timed_in_order,
    without_nul,
)
from toolbus.journal.worker import Worker

T = TypeVar("T")
E = TypeVar("E", bound=Event)
Connection = psycopg.Connection[tuple[Any, ...]]
log = logging.getLogger("toolbus.journal")

CONNECT_TIMEOUT = 5  # seconds: a server that is down is reported, never waited on
# A lock held by another session (an agent's open transaction, an admin's) fails a
# write after this many seconds instead of blocking it; and a call waits twice as long at most
# for a server that does not answer at all (stopped, or its machine gone).
LOCK_TIMEOUT = 5.0
_PRIVATE = "private"  # the visibility of every event but an observation's


def connect(url: str, lock_timeout: float = LOCK_TIMEOUT) -> Connection:
    """A connection in autocommit mode (transactions are explicit) with the journal's schema
    on its search path; `JournalUnavailable` when the server cannot be reached. libpq's own
    words about a URL it cannot read may quote the password: those are never repeated."""
    if ambiguous_login(url) or not _readable(url):
        raise JournalUnavailable(
            f"the team journal's URL cannot be read ({shown(url)}): a password or name holding "
            "special characters must be percent-encoded"
        )
    try:
        return psycopg.connect(
            url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name="toolbus",
            # READ COMMITTED, whatever the database's default: the position trigger's max()
            # must see the newest commit (a REPEATABLE READ snapshot would not).
            options=f"-c search_path={SCHEMA} -c lock_timeout={int(lock_timeout * 1000)}"
            " -c default_transaction_isolation=read\\ committed",
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=2,
            tcp_user_timeout=int(2 * lock_timeout * 1000),
        )
    except psycopg.Error as error:
        why = reason(error)
        if "password" in why:  # "password authentication failed", "no password supplied"
            why += " (the password comes from the URL, $PGPASSWORD or ~/.pgpass)"
        raise JournalUnavailable(f"cannot reach the team journal at {shown(url)}: {why}") from None


# How long a reader waits for the server to answer one statement (as a writer's call waits).
ANSWER_TIMEOUT = 2 * LOCK_TIMEOUT


@contextlib.contextmanager
def answered_within(
    conn: Connection, seconds: float, location: str, alive: Callable[[], bool] | None = None
) -> Iterator[None]:
    """Give up on the server if the work has not ended within `seconds`: the connection's socket
    is shut, and the wait ends in `JournalUnavailable`. A server that stopped (a hung disk, a
    paused process) has its kernel acknowledge every packet, so no TCP timeout or keepalive
    ends that wait; a network that dropped them is ended by `tcp_user_timeout` too.

    Without `alive`, `seconds` bounds the whole of the work (a login's check). With it, long
    work (an audit of everything, a rebuild) goes on for as long as `alive()`, asked every
    `seconds`, finds the server answering others: only a server that answers nobody is given
    up on."""
    ended = threading.Event()
    gave_up = threading.Event()
    deciding = threading.Lock()  # the work's end and the giving up: one or the other

    def give_up() -> None:
        with deciding:
            if ended.is_set():
                return
            gave_up.set()
            with contextlib.suppress(OSError, psycopg.Error), socket.socket(fileno=os.dup(conn.fileno())) as copy:
                copy.shutdown(socket.SHUT_RDWR)  # the socket itself: every descriptor of it

    def watch() -> None:
        while not ended.wait(seconds):
            if alive is None or not alive():
                give_up()
                return

    watcher = threading.Thread(target=watch, name="toolbus-answer-watch", daemon=True)
    watcher.start()
    unanswered = JournalUnavailable(
        f"the team journal at {location} did not answer within {seconds:g} s: check the server, and try again"
        if alive is None
        else f"the team journal at {location} stopped answering: a statement waited {seconds:g} s, and a new "
        "connection to the server was not answered either: check the server, and try again"
    )
    try:
        yield
    except psycopg.Error:
        if not gave_up.is_set():
            raise
        raise unanswered from None
    finally:
        with deciding:
            ended.set()
    if gave_up.is_set():  # the answer came as the socket was shut: the connection is gone all the same
        raise unanswered


def server_answers(conn: Connection, url: str, location: str) -> Callable[[], bool]:
    """`answered_within`'s `alive` for `conn`: whether the server it reached (that address, not
    another of the URL's hosts) answers a new connection. A busy server does, if only to refuse
    it (too many connections); a stopped one lets the login time out."""
    info = conn.info
    host, port, hostaddr = info.host, info.port, info.hostaddr or None  # a socket's has none

    def answers() -> bool:
        try:
            probe = psycopg.connect(
                url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, host=host, port=port, hostaddr=hostaddr
            )
        except psycopg.errors.ConnectionTimeout:
            return False
        except psycopg.Error:  # refused in the server's words; a network gone ends `conn` by itself
            return True
        try:
            with probe, answered_within(probe, CONNECT_TIMEOUT, location):
                probe.execute("SELECT 1")
        except (JournalUnavailable, psycopg.Error):
            return False
        return True

    return answers


class NotAnAgent(JournalUnavailable):
    """The login may not use the team journal: its admin has not registered it as an agent."""


def check_journal(conn: Connection, location: str) -> Login:
    """Check that the database holds a toolbus journal this login may use; return who the
    login is. Closes `conn` if not."""
    try:
        version = schema_version(conn)
    except PermissionError:
        role = conn.execute("SELECT current_user").fetchone()
        conn.close()
        raise NotAnAgent(
            f"the role {role[0] if role else '?'!r} is not an agent of the team journal at {location}: its admin "
            f"registers it with `toolbus journal agent URL ROLE --department NAME`"
        ) from None
    if version is None:
        conn.close()
        raise JournalNotFound(
            f"no toolbus journal in {location}: the team's admin creates it with `toolbus journal init URL`"
        )
    if version > SCHEMA_VERSION:
        conn.close()
        raise JournalUnavailable(newer_schema(location, version))
    row = conn.execute(f"SELECT current_user, my_department(), {LOGIN_ADMINISTERS}").fetchone()
    assert row is not None
    return Login(str(row[0]), row[1], bool(row[2]))


def _readable(url: str) -> bool:
    try:
        conninfo_to_dict(url)
    except psycopg.Error:
        return False
    return True


def reason(error: psycopg.Error) -> str:
    """What went wrong, in PostgreSQL's words (for a URL libpq could read: they do not quote it)."""
    if primary := error.diag.message_primary:
        return primary
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


class Login(NamedTuple):
    """Who a login is on the team journal: its role, the department the team's admin
    registered it in (None for a role that is no agent, such as the admin's), and whether it
    administers the journal (owns it or bypasses its row-level security)."""

    agent: str
    department: str | None
    administers: bool


class AlreadyRecorded(JournalUnavailable):
    """A row with this key or event id exists, but this login may not see it: another agent's
    (or the admin's) copy of the same journal brought it first."""


class PostgresJournal:
    """`bus.JournalWriter` on a PostgreSQL database initialised by `toolbus journal init`.

    `agent`, `department` and `administers` are the login's identity (`Login`)."""

    def __init__(self, url: str, lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.url = url
        self.lock_timeout = lock_timeout
        self.answer_timeout = 2 * lock_timeout
        self.location = shown(url)
        self._lock = threading.Lock()
        self._worker: Worker | None = None
        # Set once the work that last outlasted `answer_timeout` has ended: work sent before then
        # would only queue behind it.
        self._unanswered: threading.Event | None = None
        self._conn: Connection | None = None
        with answered_within(self._connection(), self.answer_timeout, self.location):
            self.agent, self.department, self.administers = check_journal(self._connection(), self.location)
            self._keeps_pending = keeps_pending(self._connection())
            self._times_observations = times_observations(self._connection())

    # --- the connection and its thread ------------------------------------------------------

    def _connection(self) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, self.lock_timeout)
        return self._conn

    def run_sync(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in this thread with the connection, serialised with every other use, for
        a caller with no timeout of its own (a copy, a rebuild): a server that stops answering
        anyone is given up on (`answered_within`)."""
        return self._attempts(work, watched=True)

    def _attempts(self, work: Callable[[Connection], T], watched: bool) -> T:
        """`work` with the connection. A connection found broken, or refused in a way a change
        of this login's registration explains, is opened again and `work` sent once more:
        every `work` here is safe to repeat (its keys make a second commit find the first)."""
        with self._lock:
            for attempt in (1, 2):
                conn = self._connection()
                try:
                    if not watched:
                        return work(conn)
                    alive = server_answers(conn, self.url, self.location)
                    with answered_within(conn, self.answer_timeout, self.location, alive):
                        return work(conn)
                except psycopg.OperationalError as error:
                    if not conn.closed and not conn.broken:
                        raise self._unavailable(error) from error
                    self._conn = None
                    if attempt == 2:
                        raise self._unavailable(error) from error
                    log.warning("the team journal's connection broke (%s); connecting again", reason(error))
                except (
                    psycopg.errors.UndefinedTable,
                    psycopg.errors.UndefinedFunction,  # the schema out of reach: its functions too
                    psycopg.errors.InsufficientPrivilege,
                ) as error:
                    if attempt == 2:
                        raise self._unavailable(error) from error
                    self._check_registration()
                except psycopg.Error as error:
                    raise self._unavailable(error) from error
            raise AssertionError("unreachable")

    def _check_registration(self) -> None:
        """Raise if the team's admin has made this login no agent, or moved it to another
        department, since it connected: its calls could no longer be recorded as its own.
        Otherwise the connection is a new one: an old one could have lost the journal's schema
        from its search path when the admin removed the agent and added it again."""
        if self._conn is not None:
            self._conn.close()
        try:
            login = check_journal(self._connection(), self.location)
        except NotAnAgent:
            login = Login(self.agent, None, administers=False)
        if login.department == self.department:
            return
        if login.department is None:
            raise JournalUnavailable(
                f"{self.agent!r} is no agent of the team journal at {self.location} any more: the team's "
                "admin removed it since toolbus started, and nothing can be recorded in its name; ask the admin"
            )
        raise JournalUnavailable(
            f"since toolbus started, the team's admin moved it from department {self.department!r} to "
            f"{login.department!r}: restart toolbus to record calls as {login.department!r}"
        )

    def _unavailable(self, error: psycopg.Error) -> JournalUnavailable:
        return JournalUnavailable(f"the team journal at {self.location} failed: {reason(error)}")

    async def run(self, work: Callable[[Connection], T]) -> T:
        """`run_sync` on the journal's own thread, shielded: once handed over, the work
        completes and its outcome is awaited even if the caller is cancelled; but not for
        longer than `answer_timeout`, when the server has stopped answering."""
        import anyio

        if self._unanswered is not None and not self._unanswered.is_set():
            # Queued behind it, this would wait out a timeout of its own, and the next one too.
            raise JournalUnavailable(
                f"the team journal at {self.location} has not yet answered a call that waited "
                f"{self.answer_timeout:g} s for it; nothing of this call was sent: try again later"
            )
        if self._worker is None:
            self._worker = Worker()
        answered = threading.Event()

        def run_and_note(work: Callable[[Connection], T]) -> T:
            try:  # bounded by the wait below, not watched
                return self._attempts(work, watched=False)
            finally:
                answered.set()

        future = self._worker.submit(run_and_note, work)
        try:
            with anyio.fail_after(self.answer_timeout, shield=True):
                return await future
        except TimeoutError:
            self._unanswered = answered
            raise JournalUnavailable(
                f"the team journal at {self.location} did not answer within {self.answer_timeout:g} s; "
                "what this call sent may yet be recorded (toolbus audit shows it)"
            ) from None

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
        # Work a silent server still holds keeps the connection: leave it to the process's end
        # rather than hang there (a stopped server acknowledges packets, so nothing times out).
        if not self._lock.acquire(timeout=self.answer_timeout):
            log.warning("the team journal at %s still holds a call: its connection closes with toolbus", self.location)
            return
        try:
            if self._conn is not None:
                self._conn.close()
        finally:
            self._lock.release()

    # --- bus.JournalWriter --------------------------------------------------------------------

    async def begin(
        self,
        record: CommandRecord,
        keep: Mapping[str, bytes] | None = None,
        *,
        durable: bool = True,
        pending: Sequence[Event] = (),
    ) -> int:
        # Always durable, `durable` or not: the journal is another machine's, whose crash or
        # failover Neovim would outlive, and the outcome would then update a row that is gone.
        key = uuid.uuid4()
        pending_events, keeps_pending = pending_text(pending), self._keeps_pending

        def work(conn: Connection) -> int:
            with conn.transaction():
                if keep:
                    insert_blobs(conn, keep)
                return insert_command(
                    conn, key, record, "in_doubt", None, None, pending_events, keeps_pending=keeps_pending
                )

        return await self.run(work)

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
        outcome = Outcome(record, status, error, events, blobs)
        key, ids, finished_ns = uuid.uuid4(), event_ids(len(events)), time.time_ns()
        keeps_pending = self._keeps_pending

        def work(conn: Connection) -> list[Appended[Event]]:
            times = self._times(conn, events)
            return _record(
                conn, outcome, command_id, key, ids, finished_ns, keeps_pending=keeps_pending, times_observations=times
            )

        appended = await self.run(work)
        return cast(list[Appended[E]], appended)  # as stored: each event of the type it was given

    def _times(self, conn: Connection, events: Sequence[Event]) -> bool:
        """Whether to time `events`' observations after the journal's latest: the journal has
        `latest_observation_time()` (schema 3), known at start or learnt since, when an admin
        ran `journal init` while this server ran. Asked again only of a save on an older one."""
        if not self._times_observations and any(isinstance(event, ObservationSaved) for event in events):
            self._times_observations = times_observations(conn)
        return self._times_observations

    async def append(self, command_id: int, events: Sequence[E], blobs: Mapping[str, bytes]) -> list[Appended[E]]:
        ids, recorded_at = event_ids(len(events)), iso_time(time.time_ns())

        def work(conn: Connection) -> list[Appended[Event]]:
            with conn.transaction():
                insert_blobs(conn, blobs)
                # The events are the command's: in its agent's name.
                owner = conn.execute("SELECT agent, department FROM commands WHERE id = %s", (command_id,)).fetchone()
                if owner is None:
                    raise JournalUnavailable(f"no command {command_id} in the team journal to append to")
                timed = _timed(conn, events) if self._times(conn, events) else events
                return append_events(conn, command_id, owner[0], owner[1], timed, ids, recorded_at)

        return cast(list[Appended[E]], await self.run(work))

    async def keep_blobs(
        self, blobs: Mapping[str, bytes], *, command_id: int | None = None, pending: Sequence[Event] = ()
    ) -> None:
        def work(conn: Connection) -> None:
            with conn.transaction():
                insert_blobs(conn, blobs)
                if command_id is not None and self._keeps_pending:
                    conn.execute("UPDATE commands SET pending = %s WHERE id = %s", (pending_text(pending), command_id))

        await self.run(work)

    async def settle_abandoned(self, host: str) -> int:
        if not self._keeps_pending:
            return 0

        def work(conn: Connection) -> int:
            # Safe to send again: a command settled by a first attempt is claimed no more.
            gone = dead_commands(conn.execute(_ABANDONED_HERE, (host,)).fetchall())
            if not gone:
                return 0
            with conn.transaction():
                return _settle(conn, gone)

        return await self.run(work)

    def rebuild_memory(self) -> int:
        """Drop the memory store's rows and project every saved observation again (the admin's)."""
        from toolbus.journal.postgres.replay import rebuild_memory

        return self.run_sync(rebuild_memory)

    def record_many_sync(self, outcomes: Sequence[Outcome]) -> list[list[int]]:
        """Several finished commands in one transaction (copies, benchmarks), their observations
        at the times they hold; each one's positions."""
        finished_ns = time.time_ns()
        prepared = [(outcome, uuid.uuid4(), event_ids(len(outcome.events))) for outcome in outcomes]

        def work(conn: Connection) -> list[list[int]]:
            with conn.transaction():
                return [
                    [appended.position for appended in insert_outcome(conn, outcome, None, key, ids, finished_ns)]
                    for outcome, key, ids in prepared
                ]

        return self.run_sync(work)


# --- the transactions ---------------------------------------------------------------------------


def _record(
    conn: Connection,
    outcome: Outcome,
    command_id: int | None,
    key: uuid.UUID,
    ids: list[str],
    finished_ns: int,
    *,
    keeps_pending: bool = False,
    times_observations: bool = False,
) -> list[Appended[Event]]:
    """A call's outcome as it happens (`insert_outcome`, with `times_observations` for a journal
    of schema 3)."""
    with conn.transaction():
        if not outcome.record.changes:
            # Committed without waiting for the disk: nothing changed, and the WAL writer
            # flushes it within wal_writer_delay.
            conn.execute("SET LOCAL synchronous_commit = off")
        return insert_outcome(
            conn,
            outcome,
            command_id,
            key,
            ids,
            finished_ns,
            keeps_pending=keeps_pending,
            times_observations=times_observations,
        )


def _timed(conn: Connection, events: Sequence[E]) -> list[E]:
    """`events`, an observation timed after the latest of the journal, read by
    `latest_observation_time()` under the append lock (`timed_in_order`)."""

    def latest() -> int | None:
        row = conn.execute("SELECT latest_observation_time()").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    return timed_in_order(events, latest)


def insert_outcome(
    conn: Connection,
    outcome: Outcome,
    command_id: int | None,
    key: uuid.UUID,
    ids: list[str],
    finished_ns: int,
    *,
    keeps_pending: bool = False,
    times_observations: bool = False,
) -> list[Appended[Event]]:
    """The command's final row, its blobs, its events and their projections (in a transaction);
    the events as appended.
    `keeps_pending`: the journal has `commands.pending`, which a command's outcome clears.
    `times_observations`: a call's outcome as it happens, on a journal with
    `latest_observation_time()`: an observation is timed after the journal's latest
    (`JournalWriter.finish`); otherwise they keep their times."""
    record, finished_at = outcome.record, iso_time(finished_ns)
    if command_id is None:
        command_id = insert_command(conn, key, record, outcome.status, outcome.error, finished_ns)
    else:
        status, error = outcome.status, outcome.error
        finish_command(conn, command_id, status, error, record.received_ns, finished_ns, keeps_pending=keeps_pending)
    if outcome.blobs:
        insert_blobs(conn, outcome.blobs)
    # Timed last: it takes the append lock, which every other save then waits for until commit.
    events = _timed(conn, outcome.events) if times_observations else outcome.events
    caller = record.caller
    return append_events(conn, command_id, caller.agent, caller.department, events, ids, finished_at)


def finish_command(
    conn: Connection,
    command_id: int,
    status: Status,
    error: str | None,
    received_ns: int,
    finished_ns: int,
    *,
    keeps_pending: bool = False,
) -> None:
    """Give a command begun before its outcome: status, error, end and duration."""
    conn.execute(
        _FINISH_CLEARING_PENDING if keeps_pending else _FINISH,
        (status, error and without_nul(error), iso_time(finished_ns), (finished_ns - received_ns) / 1e6, command_id),
    )


_FINISHED = "status = %s, error = %s, finished_at = %s, duration_ms = %s"
_FINISH = f"UPDATE commands SET {_FINISHED} WHERE id = %s"
# Whatever it had pending is settled by its outcome (a journal without the column never had any).
_FINISH_CLEARING_PENDING = f"UPDATE commands SET {_FINISHED}, pending = NULL WHERE id = %s"

# Begun on this machine and not finished, with events pending (`journal.abandoned`): an agent's
# own, as row-level security shows it only those. The admin, whom it does not bind, settles any
# agent's, in that agent's name; `dead_commands` lets through only the `*InDoubt` events an
# agent may append to its own command itself.
_ABANDONED_HERE = (
    "SELECT id, pid, pending FROM commands WHERE pending IS NOT NULL AND host = %s"
    " AND status = 'in_doubt' AND finished_at IS NULL"
)


def _settle(conn: Connection, gone: Sequence[Abandoned]) -> int:
    """Append the pending events of commands whose process is gone, each once (in a transaction)."""
    settled = 0
    for command_id, pid, events in gone:
        claimed = conn.execute(
            "UPDATE commands SET pending = NULL, error = coalesce(error, %s)"
            " WHERE id = %s AND pending IS NOT NULL AND finished_at IS NULL RETURNING agent, department",
            (why_abandoned(pid), command_id),
        ).fetchone()
        if claimed is not None:  # not settled meanwhile by another toolbus starting
            ids, recorded_at = event_ids(len(events)), iso_time(time.time_ns())
            append_events(conn, command_id, claimed[0], claimed[1], events, ids, recorded_at)
            settled += 1
    return settled


_COMMAND_COLUMNS = (
    "request_key, tool, arguments, agent, department, client_name, client_version,"
    " session_id, host, pid, received_at, finished_at, duration_ms, status, error"
)
_NEW = " ON CONFLICT (request_key) DO NOTHING RETURNING id"
_INSERT_COMMAND = f"INSERT INTO commands ({_COMMAND_COLUMNS}) VALUES ({', '.join(['%s'] * 15)}){_NEW}"
_INSERT_BEGUN = f"INSERT INTO commands ({_COMMAND_COLUMNS}, pending) VALUES ({', '.join(['%s'] * 16)}){_NEW}"


def insert_command(
    conn: Connection,
    key: uuid.UUID,
    record: CommandRecord,
    status: Status,
    error: str | None,
    finished_ns: int | None,
    pending: str | None = None,
    *,
    keeps_pending: bool = False,
    pid: int | None = None,
) -> int:
    """A command's row; with its `pending` events if the journal `keeps_pending`."""
    finished_at = iso_time(finished_ns) if finished_ns is not None else None
    row = (*command_row(record, status, error, pid or os.getpid(), finished_ns, finished_at), pending)
    sql, row = (_INSERT_BEGUN, row) if keeps_pending else (_INSERT_COMMAND, row[:-1])
    inserted = conn.execute(sql, (key, *storable_row(row))).fetchone()
    if inserted is None:  # sent before, by a commit whose answer was lost
        inserted = conn.execute("SELECT id FROM commands WHERE request_key = %s", (key,)).fetchone()
    if inserted is None:
        raise AlreadyRecorded("the command is in the team journal already, under another login")
    return int(inserted[0])


def insert_blobs(conn: Connection, blobs: Mapping[str, bytes], keeper: str | None = None) -> None:
    """Texts, each kept for one agent to read: the login by default (row-level security lets an
    agent keep none for another); the admin's copy of a journal keeps them for their agent."""
    if blobs:
        conn.cursor().executemany(
            "INSERT INTO blobs (hash, agent, size, content) VALUES (%s, coalesce(%s, current_user), %s, %s)"
            " ON CONFLICT DO NOTHING",
            [(digest, keeper, len(content), content) for digest, content in blobs.items()],
        )


_INSERT_EVENT = (
    "INSERT INTO events (event_id, command_id, type, version, stream, recorded_at, data, agent, department,"
    " visibility) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (event_id) DO NOTHING RETURNING position"
)


def append_events(
    conn: Connection,
    command_id: int | None,
    agent: str,
    department: str | None,
    events: Sequence[Event],
    ids: list[str],
    recorded_at: str,
) -> list[Appended[Event]]:
    """Events at the next positions (the trigger gives them), then their projections; the events
    as stored (their data as this attempt wrote it, or as an earlier one did)."""
    appended = []
    for event_id, event in zip(ids, events, strict=True):
        data = encode_event_data(event).decode()
        if "\\u0000" in data:  # PostgreSQL holds no NUL: the event and its row get U+FFFD in its place
            data = json_without_nul(data)
            event = decode_event(event.type_name(), type(event).version, data)
        owner = (event.agent, event.department, event.visibility) if isinstance(event, ObservationSaved) else None
        row = (
            event_id,
            command_id,
            event.type_name(),
            type(event).version,
            event.stream,
            recorded_at,
            data,
            *(owner or (agent, department, _PRIVATE)),
        )
        inserted = conn.execute(_INSERT_EVENT, storable_row(row)).fetchone()
        if inserted is None:  # written by an earlier attempt of this very transaction, perhaps timed otherwise
            appended.append(_written_before(conn, event_id))
            continue
        position = int(inserted[0])
        appended.append(Appended(position, event))
        if isinstance(event, ObservationSaved):
            conn.execute(INSERT_OBSERVATION, observation_params(position, event))
    return appended


def _written_before(conn: Connection, event_id: str) -> Appended[Event]:
    found = conn.execute("SELECT position, type, version, data FROM events WHERE event_id = %s", (event_id,)).fetchone()
    if found is None:
        raise AlreadyRecorded(f"the event {event_id} is in the team journal already, under another login")
    position, type_name, version, data = found
    return Appended(int(position), decode_event(type_name, version, data))
