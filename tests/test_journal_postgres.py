"""The PostgreSQL backend passes the journal contract, and keeps what only it promises: identity
from the login, visibility and append-only rows enforced by the database, idempotent appends."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest

from tests.journal_contract import NEW_YEAR_MS, JournalContract, observation, record, saved
from tests.postgres_server import Team, drop_database, initialised_database, server_url, with_database
from toolbus.bus import (
    Appended,
    AuditQuery,
    Caller,
    Event,
    JournalReader,
    JournalUnavailable,
    JournalWriter,
    ObservationSaved,
)
from toolbus.handlers import MemoryStore
from toolbus.journal.postgres import (
    PostgresJournal,
    PostgresMemoryStore,
    PostgresReader,
    connect,
    init_schema,
    register_agent,
    unregister_agent,
)
from toolbus.journal.postgres import reader as reader_module
from toolbus.journal.postgres import store as store_module
from toolbus.journal.postgres.store import _record, answered_within, server_answers
from toolbus.journal.rows import Outcome, event_ids


def open_postgres_writer(location: str) -> PostgresJournal:
    return PostgresJournal(location)


class TestPostgresJournal(JournalContract):
    writer_factory = staticmethod(open_postgres_writer)

    @pytest.fixture
    def location(self, tmp_path: Path) -> Iterator[str]:
        name, url = initialised_database()
        yield url
        drop_database(name)

    def open_reader(self, location: str) -> JournalReader:
        return PostgresReader(location)

    def memory_store(self, writer: JournalWriter) -> MemoryStore:
        assert isinstance(writer, PostgresJournal)
        return PostgresMemoryStore(writer)


# --- what only the team journal promises ------------------------------------------------------


def _as(team: Team, name: str) -> Caller:
    writer = PostgresJournal(team.url(name))
    try:
        return Caller(agent=writer.agent, department=writer.department or "")
    finally:
        writer.close()


def test_the_agent_is_the_login_and_its_department_the_admins_table(team: Team) -> None:
    writer = PostgresJournal(team.url("carol"))
    try:
        assert (writer.agent, writer.department) == (team.roles["carol"], "sales")
    finally:
        writer.close()


def _save_notes(team: Team, name: str) -> dict[str, int]:
    """Notes of every visibility, and a file save with its texts, written as `name`."""
    caller = _as(team, name)
    writer = PostgresJournal(team.url(name))
    notes = {
        visibility: observation(f"{name} {visibility}", "a note", visibility=visibility, caller=caller)
        for visibility in ("public", "project", "department", "private")
    }
    save, blobs = saved(f"/src/{name}.py", b"before\n", b"after\n")

    async def work() -> dict[str, int]:
        positions = {}
        for visibility, note in notes.items():
            [(positions[visibility], _)] = await writer.finish(record("save", caller=caller), None, "ok", events=[note])
        [(positions["save"], _)] = await writer.finish(
            record("saveDocument", caller=caller), None, "ok", events=[save], blobs=blobs
        )
        return positions

    try:
        return anyio.run(work)
    finally:
        writer.close()


def test_row_level_security_shows_each_agent_only_what_it_may_see(team: Team) -> None:
    _save_notes(team, "alice")
    seen: dict[str, set[str]] = {}
    for name in ("alice", "bob", "carol"):
        with team.sql(name) as conn:
            seen[name] = {row[0] for row in conn.execute("SELECT title FROM observations")}
            events = conn.execute("SELECT type, data FROM events").fetchall()
            commands = conn.execute("SELECT count(*) FROM commands").fetchone()
            texts = conn.execute("SELECT count(*) FROM blobs").fetchone()
            # The search's functions, which run as the owner, find only what the login may see too.
            found = {row[0] for row in conn.execute("SELECT id FROM matching_observations('note', 'note')")}
            assert found == {row[0] for row in conn.execute("SELECT id FROM observations")}, name
        if name != "alice":
            assert commands == (0,) and texts == (0,), name  # another's commands and texts: never
            assert "DocumentSaved" not in {type_ for type_, _ in events}, name
        assert len(events) == len(seen[name]) + (1 if name == "alice" else 0)
    assert seen["alice"] == {"alice public", "alice project", "alice department", "alice private"}
    assert seen["bob"] == {"alice public", "alice project", "alice department"}
    assert seen["carol"] == {"alice public", "alice project"}


def test_an_agent_cannot_write_in_anothers_name_nor_change_the_past(team: Team) -> None:
    positions = _save_notes(team, "alice")
    alice = team.roles["alice"]
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus") as admin:
        [(alices_command,)] = admin.execute("SELECT min(id) FROM commands").fetchall()
    with team.sql("bob") as conn:
        attempts = [
            ("UPDATE events SET data = '{}' WHERE position = %s", (positions["public"],)),
            ("DELETE FROM events WHERE position = %s", (positions["public"],)),
            ("DELETE FROM observations WHERE id = %s", (positions["public"],)),
            ("UPDATE observations SET title = 'mine' WHERE id = %s", (positions["public"],)),
            ("TRUNCATE events", ()),
            (
                "INSERT INTO commands (tool, arguments, agent, department, received_at, status)"
                " VALUES ('x', '{}', %s, 'platform', '2026', 'ok')",
                (alice,),
            ),
            (
                "INSERT INTO events (event_id, type, version, stream, recorded_at, data, agent, department, visibility)"
                " VALUES ('e1', 'X', 1, 's', '2026', '{}', %s, 'platform', 'public')",
                (alice,),
            ),
            (
                "INSERT INTO events (event_id, type, version, stream, recorded_at, data, agent, department, visibility)"
                " VALUES ('e2', 'X', 1, 's', '2026', '{}', current_user, 'sales', 'public')",
                (),
            ),
            ("INSERT INTO agents (role, department) VALUES (current_user, 'sales')", ()),
            (  # in its own name, but as part of another agent's command
                "INSERT INTO events (event_id, command_id, type, version, stream, recorded_at, data, agent,"
                " department, visibility) VALUES ('e3', %s, 'X', 1, 's', '2026', '{}', current_user, 'platform',"
                " 'public')",
                (alices_command,),
            ),
        ]
        event = (
            "INSERT INTO events (event_id, type, version, stream, recorded_at, data, agent, department, visibility)"
            " VALUES (%s, %s, 1, %s, '2026', %s, current_user, 'platform', %s)"
        )
        attempts += [
            # Another's file history, in one's own name: an editor event is its agent's alone.
            (event, ("e4", "DocumentSaved", "file:/src/alice.py", '{"path": "/src/alice.py"}', "public")),
            # A note whose data names another agent (a rebuild of the memory would believe it).
            (
                event,
                (
                    "e5",
                    "ObservationSaved",
                    "memory:x",
                    json.dumps({"agent": alice, "department": "platform", "visibility": "public"}),
                    "public",
                ),
            ),
            # A projection of an event that is not one's own observation: alice's note, alice's save.
            *(
                (
                    "INSERT INTO observations (id, title, text, type, project, memory_session_id, facts, concepts,"
                    " agent, department, visibility, created_at_epoch, extra, document)"
                    " VALUES (%s, 't', 't', 'x', 'p', 's', '[]', '[]', current_user, 'platform', 'public', 0, '{}',"
                    " '')",
                    (positions[key],),
                )
                for key in ("private", "save")
            ),
            # A text under a hash that is not its own.
            ("INSERT INTO blobs (hash, agent, size, content) VALUES (%s, current_user, 1, 'x')", ("0" * 64,)),
        ]
        for sql, params in attempts:
            with pytest.raises((psycopg.errors.InsufficientPrivilege, psycopg.errors.CheckViolation)):
                conn.execute(sql, params)
        # A finished command of its own is history: its status cannot be rewritten either.
        [(bobs,)] = conn.execute(
            "INSERT INTO commands (tool, arguments, agent, department, received_at, status)"
            " VALUES ('x', '{}', current_user, 'platform', '2026', 'ok') RETURNING id"
        ).fetchall()
        assert conn.execute("UPDATE commands SET status = 'failed' WHERE id = %s", (bobs,)).rowcount == 0
        # Nor one that finished in doubt.
        [(doubted,)] = conn.execute(
            "INSERT INTO commands (tool, arguments, agent, department, received_at, finished_at, status, error)"
            " VALUES ('x', '{}', current_user, 'platform', '2026', '2026', 'in_doubt', 'timed out') RETURNING id"
        ).fetchall()
        rewritten = "UPDATE commands SET status = 'ok', error = NULL WHERE id = %s"
        assert conn.execute(rewritten, (doubted,)).rowcount == 0
        # An agent may finish its own commands: another's it cannot even find.
        assert conn.execute("UPDATE commands SET status = 'failed'").rowcount == 0
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus") as admin:
        assert admin.execute("SELECT count(*) FROM events").fetchone() == (5,)
        assert {row[0] for row in admin.execute("SELECT status FROM commands")} == {"ok", "in_doubt"}
        assert admin.execute("SELECT count(*) FROM observations").fetchone() == (4,)


def test_a_retried_transaction_appends_nothing_twice(team: Team) -> None:
    """Nor times anew what it appended: a note saved since, timed later, changes nothing."""
    writer = PostgresJournal(team.admin_url)
    caller = Caller(agent="claude", department="platform")

    def send(outcome: Outcome, key: uuid.UUID, ids: list[str]) -> list[Appended[Event]]:
        return writer.run_sync(
            lambda conn: _record(conn, outcome, None, key, ids, time.time_ns(), times_observations=True)
        )

    once = Outcome(record("save", caller=caller), "ok", events=[observation("once", "only once", caller=caller)])
    later = Outcome(
        record("save", caller=caller), "ok", events=[observation("later", "x", caller=caller, at=NEW_YEAR_MS + 9)]
    )
    key, ids = uuid.uuid4(), event_ids(1)
    try:
        first = send(once, key, ids)
        send(later, uuid.uuid4(), event_ids(1))
        again = send(once, key, ids)
    finally:
        writer.close()
    assert first == again
    reader = PostgresReader(team.admin_url)
    try:
        assert reader.counts() == (2, 2)
    finally:
        reader.close()


def _save_at(team: Team, name: str, title: str, at: int, visibility: str = "project") -> Appended[ObservationSaved]:
    """A note `name` saves through the journal, its server's clock reading `at`."""
    writer = PostgresJournal(team.url(name))
    note = observation(title, "x", visibility=visibility, caller=_as(team, name), at=at)
    try:
        [appended] = anyio.run(lambda: writer.finish(record("save", caller=_as(team, name)), None, "ok", events=[note]))
    finally:
        writer.close()
    return appended


def test_an_agent_of_one_team_journal_is_none_of_another_on_the_same_server(team: Team) -> None:
    """Roles belong to the whole server: each team journal has its agent group of its own, so
    an agent of one reads nothing of another, and leaving one keeps it in the other."""
    other = Team()  # another team's journal, in another database of the same server
    try:
        _save_at(other, "alice", "the other team's plan", NEW_YEAR_MS)
        alice = team.roles["alice"]
        as_alice_there = with_database(server_url(), other.database, user=alice, password="s3cret-alice")
        with (
            psycopg.connect(as_alice_there, autocommit=True) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("SELECT title FROM toolbus.observations")
        with connect(other.admin_url) as conn:
            register_agent(conn, alice, "platform")  # an agent of both
        with connect(team.admin_url) as conn:
            unregister_agent(conn, alice)  # ... and then of the other only
        with psycopg.connect(as_alice_there, autocommit=True) as conn:
            assert conn.execute("SELECT title FROM toolbus.observations").fetchall() == [("the other team's plan",)]
            # ... where an idle transaction of hers is still ended, as for every agent
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("30s",)
    finally:
        other.drop()


def test_init_takes_an_older_journal_from_the_group_every_team_journal_shared(team: Team) -> None:
    """Before schema 4, agents of every team journal on a server joined `toolbus_agent`, which
    held this journal's grants: `journal init` leaves it nothing here."""
    outsider = f"dave_{team.database}"
    with connect(team.admin_url) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE toolbus_agent NOLOGIN; EXCEPTION WHEN duplicate_object THEN END $$")
        conn.execute("GRANT USAGE ON SCHEMA toolbus TO toolbus_agent")
        conn.execute("GRANT SELECT ON toolbus.commands TO toolbus_agent")
        conn.execute(f"CREATE ROLE \"{outsider}\" LOGIN PASSWORD 'x' IN ROLE toolbus_agent")
        as_outsider = with_database(server_url(), team.database, user=outsider, password="x")
        try:
            with psycopg.connect(as_outsider, autocommit=True) as theirs:
                theirs.execute("SELECT count(*) FROM toolbus.commands")  # another team's agent, let in
            init_schema(conn)
            refused = pytest.raises(psycopg.errors.InsufficientPrivilege)
            with psycopg.connect(as_outsider, autocommit=True) as theirs, refused:
                theirs.execute("SELECT count(*) FROM toolbus.commands")
        finally:
            conn.execute(f'DROP ROLE "{outsider}"')
    _save_at(team, "alice", "registered agents go on", NEW_YEAR_MS)


def test_an_event_no_toolbus_wrote_is_left_out_of_rebuilds_and_checks_not_fatal_to_them(team: Team) -> None:
    """An agent may insert any event in its own name over plain SQL, an ObservationSaved with no
    title too: the team's rebuild and every check go on without it, and the check says so."""
    _save_at(team, "alice", "an ordinary note", NEW_YEAR_MS)
    with team.sql("bob") as conn:
        [(junk,)] = conn.execute(
            "INSERT INTO events (event_id, type, version, stream, recorded_at, data, agent, department, visibility)"
            " VALUES ('junk', 'ObservationSaved', 1, 'memory:p', '2026', %s, current_user, 'platform', 'public')"
            " RETURNING position",
            (json.dumps({"agent": team.roles["bob"], "department": "platform", "visibility": "public"}),),
        ).fetchall()
    journal, checker = PostgresJournal(team.admin_url), PostgresReader(team.url("carol"))
    try:
        check = checker.check_memory()
        assert check.differences == [f"events: @{junk} is an ObservationSaved no toolbus wrote (unreadable): left out"]
        assert journal.rebuild_memory() == 1
    finally:
        journal.close()
        checker.close()


def test_init_adds_the_hash_check_a_journal_of_schema_1_lacks(team: Team) -> None:
    with connect(team.admin_url) as conn:
        [(check,)] = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = 'toolbus.blobs'::regclass AND contype = 'c'"
        ).fetchall()
        conn.execute(f"ALTER TABLE toolbus.blobs DROP CONSTRAINT {check}")  # as schema 1 made it
        init_schema(conn)
    forged = "INSERT INTO blobs (hash, agent, size, content) VALUES (%s, current_user, 6, 'forged')"
    with team.sql("bob") as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(forged, (hashlib.sha256(b"the real text").hexdigest(),))


def test_a_note_is_never_timed_before_one_its_agent_may_not_see(team: Team) -> None:
    """An agent's note comes after another's private note, timed by a clock ahead of its own:
    it is timed after it, or an agent who sees both would miss it asking for the notes after
    the latest time it saw. (That time is all the agent learns of the note it may not see.)"""
    hidden = _save_at(team, "carol", "carol's own", NEW_YEAR_MS + 60_000, visibility="private")
    seen = _save_at(team, "alice", "alice's", NEW_YEAR_MS)
    assert seen.position > hidden.position
    assert seen.event.created_at_epoch == NEW_YEAR_MS + 60_001
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus") as admin:
        stored = admin.execute("SELECT created_at_epoch FROM observations WHERE id = %s", (seen.position,)).fetchall()
    assert stored == [(NEW_YEAR_MS + 60_001,)]


def test_a_team_journal_without_latest_observation_time_saves_at_the_clock_until_init_adds_it(team: Team) -> None:
    """A journal of schema 2: an agent of a newer toolbus saves as before, at its server's
    clock, until its admin runs `journal init` again; then even a server running since before."""
    with connect(team.admin_url) as conn:
        conn.execute("DROP FUNCTION toolbus.latest_observation_time()")
    _save_at(team, "bob", "bob's", NEW_YEAR_MS + 60_000)
    running = PostgresJournal(team.url("alice"))
    try:
        assert _save_at(team, "alice", "as before", NEW_YEAR_MS).event.created_at_epoch == NEW_YEAR_MS
        with connect(team.admin_url) as conn:
            init_schema(conn)
        assert _save_at(team, "alice", "in order", NEW_YEAR_MS).event.created_at_epoch == NEW_YEAR_MS + 60_001
        caller = _as(team, "alice")
        note = observation("by a server running before", "x", caller=caller, at=NEW_YEAR_MS)
        [timed] = anyio.run(lambda: running.finish(record("save", caller=caller), None, "ok", events=[note]))
    finally:
        running.close()
    assert timed.event.created_at_epoch == NEW_YEAR_MS + 60_002


def test_init_runs_again_without_changing_anything(team: Team) -> None:
    _save_notes(team, "alice")
    with connect(team.admin_url) as conn:
        init_schema(conn)
    with team.sql("bob") as conn:
        assert conn.execute("SELECT count(*) FROM observations").fetchone() == (3,)


def test_the_password_never_appears_in_an_error(team: Team) -> None:
    url = team.url("alice").replace(f"/{team.database}", "/no_such_database")
    with pytest.raises(JournalUnavailable) as raised:
        PostgresJournal(url)
    assert "s3cret" not in str(raised.value) and "no_such_database" in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:Sup3r%zzSecret@localhost/db",
        "postgresql://bob:Sup3r Secret@localhost/db",
        "postgresql://bob:Sup3rSecret@[::1/db",
        # Unencoded, an '@' makes the rest of the password libpq's host, and a '#' or '?' ends
        # the URL's authority: the digits before it would be shown as a port.
        "postgresql://bob:p@Sup3rSecret@127.0.0.1:5499/db",
        "postgresql://bob:5432#Sup3rSecret@127.0.0.1:5499/db",
        "postgresql://bob:5432?Sup3rSecret@127.0.0.1:5499/db",
    ],
)
def test_a_url_libpq_cannot_read_is_refused_without_quoting_it(url: str) -> None:
    with pytest.raises(JournalUnavailable) as raised:
        PostgresJournal(url)
    assert "Sup3r" not in str(raised.value) and "5432" not in str(raised.value) and raised.value.__cause__ is None
    assert "cannot be read" in str(raised.value)


def test_a_server_that_stops_answering_is_given_up_on_not_waited_for(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused server (a hung disk) still has its kernel acknowledge every packet: no TCP
    timeout would end the wait. A reader's login check gives up after its answer timeout, in
    one line. Here the server waits on a lock the admin holds, which it gives up on only later."""
    monkeypatch.setattr(reader_module, "ANSWER_TIMEOUT", 0.5)
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus") as admin:
        admin.execute("LOCK TABLE meta IN ACCESS EXCLUSIVE MODE")  # held until the block ends
        with pytest.raises(JournalUnavailable, match=r"did not answer within 0\.5 s: check the server"):
            PostgresReader(team.url("alice"))


@contextlib.contextmanager
def paused_server(team: Team, *roles: str) -> Iterator[None]:
    """The whole server stopped, as on a hung machine: the postmaster (no new connection is
    answered) and the backends of `roles`' toolbus connections to the team's database."""
    with psycopg.connect(team.admin_url) as admin:
        backends = [
            pid
            for (pid,) in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE usename = ANY(%s) AND application_name = 'toolbus'"
                " AND datname = current_database()",
                (list(roles),),
            )
        ]
    assert len(backends) == len(roles)
    postmaster = int(Path(f"/proc/{backends[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    stopped = [postmaster, *backends]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


def raised_within(seconds: float, *works: Callable[[], object]) -> list[BaseException | None]:
    """What each of `works` raised (None if nothing), run side by side on threads; a failure if
    one has not ended within `seconds`."""
    raised: dict[int, BaseException | None] = {}

    def run(index: int, work: Callable[[], object]) -> None:
        try:
            work()
            raised[index] = None
        except BaseException as error:
            raised[index] = error

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in enumerate(works)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert len(raised) == len(works), f"still waiting after {seconds} s"
    return [raised[index] for index in range(len(works))]


def test_a_long_statement_goes_on_while_the_server_answers_others(team: Team) -> None:
    """Past its answer time, a statement is given up on only if a new connection is not answered
    either: a big audit on a busy server is slow, not stopped. A server that refuses the new
    connection (too many of them) answers all the same."""
    asked: list[bool] = []
    with psycopg.connect(team.url("alice")) as conn:
        answers = server_answers(conn, team.url("alice"), "the test's server")

        def alive() -> bool:
            asked.append(answers())
            return asked[-1]

        with answered_within(conn, 0.2, "the test's server", alive):
            assert conn.execute("SELECT pg_sleep(0.7)::text, 1").fetchone() == ("", 1)
        assert asked and all(asked)
        with psycopg.connect(team.admin_url, autocommit=True) as admin:
            admin.execute(f'ALTER ROLE "{team.roles["alice"]}" CONNECTION LIMIT 1')
            try:
                assert answers()
            finally:
                admin.execute(f'ALTER ROLE "{team.roles["alice"]}" CONNECTION LIMIT -1')
    with (
        psycopg.connect(team.admin_url) as conn,
        pytest.raises(JournalUnavailable, match=r"stopped answering: a statement waited 0\.2 s"),
        answered_within(conn, 0.2, "the test's server", lambda: False),
    ):
        conn.execute("SELECT pg_sleep(0.7)")


def test_readers_rebuilds_and_copies_give_up_on_a_server_that_stops_and_go_on_once_it_is_back(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`toolbus audit`, `history`, `recover` read statement after statement, `replay memory` and
    `journal copy` write: one the stopped server never answers ends in an error, not a hang."""
    monkeypatch.setattr(reader_module, "ANSWER_TIMEOUT", 0.5)
    monkeypatch.setattr(store_module, "CONNECT_TIMEOUT", 2)  # the least libpq takes
    _save_notes(team, "alice")
    reader, checker = PostgresReader(team.url("alice")), PostgresReader(team.url("bob"))
    journal = PostgresJournal(team.admin_url, lock_timeout=0.25)
    try:
        audited = list(reader.audit(AuditQuery(limit=None)))
        rebuilt = journal.rebuild_memory()
        assert audited and rebuilt and checker.check_memory().differences == []
        with paused_server(team, team.roles["alice"], team.roles["bob"], journal.agent):
            raised = raised_within(
                30, lambda: list(reader.audit(AuditQuery(limit=None))), checker.check_memory, journal.rebuild_memory
            )
        for error in raised:
            assert isinstance(error, JournalUnavailable), repr(error)
            assert "stopped answering: a statement waited 0.5 s, and a new connection" in str(error)
        assert journal.rebuild_memory() == rebuilt  # a new connection, once the server answers
    finally:
        reader.close()
        checker.close()
        journal.close()
