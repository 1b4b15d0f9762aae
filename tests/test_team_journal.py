"""A team journal on PostgreSQL, end to end: `toolbus serve --journal postgresql://...` driven
by an MCP client as each agent, the `toolbus journal` commands, and the faults of a server that
stops under a running toolbus."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from tests.conftest import NeovimProcess, json_of, text_of, toolbus
from tests.journal_contract import HERE, begin_and_die, observation, record, saved
from tests.postgres_server import Team, with_database
from tests.test_cli_errors import damaged_journal
from toolbus.bus import (
    AuditQuery,
    Caller,
    DiffAccepted,
    DiffProposed,
    FileReplayed,
    FileRestored,
    FileWriteInDoubt,
    blob_hash,
)
from toolbus.bus.moments import iso_time
from toolbus.journal.postgres import PostgresJournal, connect, init_schema, register_agent
from toolbus.journal.postgres.copy import COMMANDS_PER_BATCH as copy_batch
from toolbus.journal.sqlite import SqliteJournal, SqliteReader

pytestmark = pytest.mark.anyio
# A lock waited on for 1 s, a silent server for 2 s (5 and 10 by default).
QUICK_TIMEOUTS = {"TOOLBUS_JOURNAL_TIMEOUT": "1"}


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolbus.adapters.cli", *args], capture_output=True, text=True, timeout=60, env=env
    )


def admin_rows(team: Team, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus") as conn:
        return conn.execute(sql, params).fetchall()


async def save_note(client: Any, title: str, visibility: str) -> int:
    reply = json_of(
        await client.call_tool(
            "save", {"title": title, "text": "shared across machines", "project": "toolbus", "visibility": visibility}
        )
    )
    return int(reply["id"])


async def titles(client: Any, query: str) -> list[str]:
    reply = json_of(await client.call_tool("search", {"query": query, "project": "toolbus"}))
    return sorted(row["title"] for row in reply["results"])


async def test_agents_on_a_team_journal_share_memory_as_visibility_allows(
    team: Team, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "a.py"
    path.write_text("old\n")
    nvim.edit(path)
    nvim.set_lines(path, ["new"])
    async with toolbus(team.url("alice"), nvim.address) as alice:
        await save_note(alice, "deploy checklist", "department")
        await save_note(alice, "alice scratch", "private")
        assert json_of(await alice.call_tool("saveDocument", {"filePath": str(path)}))["saved"] is True
    assert path.read_text() == "new\n"
    async with toolbus(team.url("bob"), nvim.address) as bob:
        assert await titles(bob, "checklist") == ["deploy checklist"]
        assert await titles(bob, "scratch") == []
    async with toolbus(team.url("carol"), nvim.address) as carol:
        assert await titles(carol, "checklist") == []
    # What the admin sees: every call in its agent's name, and gapless positions.
    commands = admin_rows(team, "SELECT tool, agent, department, status FROM commands ORDER BY id")
    assert commands[:3] == [
        ("save", team.roles["alice"], "platform", "ok"),
        ("save", team.roles["alice"], "platform", "ok"),
        ("saveDocument", team.roles["alice"], "platform", "ok"),
    ]
    assert {agent for _, agent, _, _ in commands[3:]} == {team.roles["bob"], team.roles["carol"]}
    positions = [row[0] for row in admin_rows(team, "SELECT position FROM events ORDER BY position")]
    assert positions == list(range(1, len(positions) + 1))
    assert admin_rows(team, "SELECT type FROM events WHERE position = 3") == [("DocumentSaved",)]


async def test_a_note_in_another_agents_name_is_an_invalid_argument_not_a_database_error(team: Team) -> None:
    alice = team.roles["alice"]
    async with toolbus(team.url("alice"), None) as client:
        for field, value in (("agent", team.roles["bob"]), ("department", "sales")):
            result = await client.call_tool("save", {"title": "t", "text": "x", field: value})
            assert result.is_error and text_of(result) == (
                f"Invalid arguments for save: {field}: on a team journal notes are saved as the login's, "
                f"{alice if field == 'agent' else 'platform'!r}; got {value!r}"
            )
        mine = await client.call_tool("save", {"title": "t", "text": "x", "agent": alice, "department": "platform"})
        assert not mine.is_error
    assert admin_rows(team, "SELECT status FROM commands ORDER BY id") == [("rejected",), ("rejected",), ("ok",)]


async def test_a_note_holding_nul_is_saved_with_u_fffd_in_its_place(team: Team) -> None:
    """PostgreSQL's text and jsonb cannot hold NUL: the note, its event and a replay agree on U+FFFD."""
    note = {
        "title": "nul\x00title",
        "text": "before\x00after",
        "facts": ["a\x00b", "\\u0000"],
        "files_read": ["c\x00d"],
    }
    async with toolbus(team.url("alice"), None) as alice:
        saved = json_of(await alice.call_tool("save", note))
        [stored] = json_of(await alice.call_tool("get_observations", {"ids": [saved["id"]]}))["observations"]
        assert (stored["title"], stored["text"], stored["facts"], stored["files_read"]) == (
            "nul\ufffdtitle",
            "before\ufffdafter",
            ["a\ufffdb", "\\u0000"],  # the six characters a backslash begins are text, kept
            ["c\ufffdd"],
        )
        assert [row["id"] for row in json_of(await alice.call_tool("search", {"query": "after"}))["results"]] == [
            saved["id"]
        ]
    [(data,)] = admin_rows(team, "SELECT data::jsonb FROM events WHERE position = %s", saved["id"])
    assert data["text"] == "before\ufffdafter"


def test_an_agent_flag_that_differs_from_the_login_is_refused(team: Team) -> None:
    done = cli("serve", "--journal", team.url("alice"), "--agent", "mallory")
    assert done.returncode == 2
    assert "--agent 'mallory' does not match" in done.stderr and team.roles["alice"] in done.stderr
    assert "s3cret" not in done.stderr
    assert admin_rows(team, "SELECT count(*) FROM commands") == [(0,)]
    # doctor judges it as serve does
    checked = cli("doctor", "--journal", team.url("alice"), "--agent", "mallory")
    assert checked.returncode == 1 and "✗ identity: --agent 'mallory' does not match" in checked.stdout
    checked = cli("doctor", "--journal", team.url("alice"), "--department", "platform")
    assert f"identity: agent {team.roles['alice']!r}, department 'platform' (from the login)" in checked.stdout


def test_doctor_says_what_a_team_journal_of_an_older_schema_lacks_until_init(team: Team) -> None:
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus") as conn:  # as toolbus left it at 2
        conn.execute("DROP FUNCTION latest_observation_time()")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    checked = cli("doctor", "--journal", team.url("alice"))
    [warning] = [line for line in checked.stdout.splitlines() if line.startswith("⚠ journal:")]
    assert "`toolbus journal init URL`" in warning and "it lacks notes timed in the order of their ids" in warning
    assert "commands.pending" not in warning  # schema 2 has that
    with connect(team.admin_url) as conn:
        init_schema(conn)
    assert "⚠" not in cli("doctor", "--journal", team.url("alice")).stdout


def test_a_role_that_is_not_a_registered_agent_is_refused(team: Team) -> None:
    with psycopg.connect(team.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "dave_{team.database}" LOGIN')
    try:
        url = team.url("alice").replace(team.roles["alice"], f"dave_{team.database}")
        done = cli("serve", "--journal", url)
        assert done.returncode == 2 and "not an agent of the team journal" in done.stderr, done.stderr
        assert "toolbus journal agent" in done.stderr
    finally:
        with psycopg.connect(team.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "dave_{team.database}"')


def test_journal_init_and_agent_from_the_command_line(team: Team) -> None:
    assert cli("journal", "init", team.admin_url).returncode == 0  # again: nothing changes
    with psycopg.connect(team.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "erin_{team.database}" LOGIN')
    try:
        done = cli("journal", "agent", team.admin_url, f"erin_{team.database}", "--department", "sales")
        assert done.returncode == 0, done.stderr
        role_department = admin_rows(team, "SELECT department FROM agents WHERE role = %s", f"erin_{team.database}")
        assert role_department == [("sales",)]
        [(settings,)] = admin_rows(
            team,
            "SELECT setconfig FROM pg_db_role_setting WHERE setrole = (SELECT oid FROM pg_roles WHERE rolname = %s)"
            " AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
            f"erin_{team.database}",
        )
        assert "idle_in_transaction_session_timeout=30s" in settings  # an idle transaction cannot hold the team up
        missing = cli("journal", "agent", team.admin_url, "nobody_at_all", "--department", "sales")
        assert missing.returncode == 2 and "there is no role 'nobody_at_all'" in missing.stderr
        blank = cli("journal", "agent", team.admin_url, f"erin_{team.database}", "--department", " ")
        assert blank.returncode == 2 and "--department: expected a department's name" in blank.stderr
        # Row-level security does not bind the owner of the tables, a role with its privileges,
        # nor one that bypasses it: never an agent.
        admin = psycopg.connect(team.admin_url).info.user
        with psycopg.connect(team.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE ROLE "bypass_{team.database}" LOGIN BYPASSRLS')
            conn.execute(f'CREATE ROLE "member_{team.database}" LOGIN IN ROLE "{admin}"')
        for unbound in (admin, f"bypass_{team.database}", f"member_{team.database}"):
            refused = cli("journal", "agent", team.admin_url, unbound, "--department", "sales")
            assert refused.returncode == 2 and "give each agent a login role of its own" in refused.stderr, unbound
        # An agent may not register anyone: one line that says who may, no traceback.
        by_agent = cli("journal", "agent", team.url("alice"), f"erin_{team.database}", "--department", "platform")
        assert by_agent.returncode == 2 and "run this as the team's admin" in by_agent.stderr, by_agent.stderr
        assert "Traceback" not in by_agent.stderr and "s3cret" not in by_agent.stderr
        assert admin_rows(team, "SELECT department FROM agents WHERE role = %s", f"erin_{team.database}") == [
            ("sales",)
        ]
        # Removed, erin is refused by the journal; removing her again says she is none.
        removed = cli("journal", "agent", team.admin_url, f"erin_{team.database}", "--remove")
        assert removed.returncode == 0 and "no longer an agent (of sales)" in removed.stdout, removed.stderr
        erin = team.url("alice").replace(team.roles["alice"], f"erin_{team.database}")
        refused = cli("serve", "--journal", erin)
        assert refused.returncode == 2 and f"'erin_{team.database}' is not an agent" in refused.stderr, refused.stderr
        again = cli("journal", "agent", team.admin_url, f"erin_{team.database}", "--remove")
        assert again.returncode == 2 and "is not an agent of this team journal" in again.stderr
        # Nor may she, no agent and no admin, set the journal up: one line, no traceback.
        init = cli("journal", "init", erin)
        assert (init.returncode, init.stdout) == (2, ""), init.stderr
        assert init.stderr.endswith(
            "may not use the team journal: run this as the team's admin (the role that ran "
            "`toolbus journal init`, allowed to create roles)\n"
        ), init.stderr
    finally:
        with psycopg.connect(team.admin_url, autocommit=True) as conn:
            conn.execute("DROP OWNED BY " + f'"erin_{team.database}"')
            for role in ("erin", "bypass", "member"):
                conn.execute(f'DROP ROLE IF EXISTS "{role}_{team.database}"')


def test_copy_brings_a_local_journal_once(team: Team, tmp_path: Path) -> None:
    local = tmp_path / "journal.db"
    writer = SqliteJournal(local)
    me = Caller(agent="legacy", department="default", host="laptop")
    save, blobs = saved("/src/a.py", b"before\n", b"after\n")

    async def work() -> None:
        await writer.finish(
            record("save", caller=me), None, "ok", events=[observation("local note", "kept", caller=me)]
        )
        await writer.finish(record("saveDocument", caller=me), None, "ok", events=[save], blobs=blobs)
        await writer.finish(record("search", caller=me), None, "ok")  # left no events: not copied
        ops = Caller(agent="zed", department="ops", host="laptop")  # a note for another department alone
        note = observation("ops only", "for ops", visibility="department", caller=ops)
        await writer.finish(record("save", caller=ops), None, "ok", events=[note])

    anyio.run(work)
    writer.close()
    first = cli("journal", "copy", str(local), team.url("alice"))
    assert first.returncode == 0, first.stderr
    assert "copied 3 commands (3 events, 2 observations)" in first.stdout
    assert "1 observation(s) for another department alone were copied as private" in first.stdout
    again = cli("journal", "copy", str(local), team.url("alice"))
    assert "copied 0 commands" in again.stdout and "3 were there already" in again.stdout
    assert "private" not in again.stdout
    alice = team.roles["alice"]
    assert admin_rows(team, "SELECT agent, title, visibility FROM observations ORDER BY id") == [
        (alice, "local note", "project"),
        (alice, "ops only", "private"),  # alice's department, platform, never was to see it
    ]
    assert admin_rows(team, "SELECT DISTINCT agent, host FROM commands") == [(alice, "laptop")]
    here = cli("history", "/src/a.py", "--journal", team.url("alice"), "--json")
    assert here.returncode == 0 and here.stdout == ""  # the laptop's history, not this machine's
    history = cli("history", "/src/a.py", "--journal", team.url("alice"), "--json", "--host", "laptop")
    assert history.returncode == 0, history.stderr
    assert '"DocumentSaved"' in history.stdout
    [(saved_at,)] = admin_rows(team, "SELECT position FROM events WHERE type = 'DocumentSaved'")
    recovered = cli("recover", str(saved_at), "--journal", team.url("alice"))
    assert recovered.returncode == 0 and recovered.stdout == "before\n", recovered.stderr
    # The admin reads every login's calls, but is no agent: what it would do is refused, unrecorded.
    admins = cli("recover", str(saved_at), "--journal", team.admin_url)
    assert admins.returncode == 0 and admins.stdout == "before\n", admins.stderr
    assert '"DocumentSaved"' in cli("history", "/src/a.py", "--journal", team.admin_url, "--json", "--all-hosts").stdout
    none = cli("history", "/src/none.py", "--journal", team.admin_url, "--host", "laptop")  # every login's
    assert none.returncode == 0 and "no saves or closes on laptop" in none.stderr, none.stderr
    refused = cli("serve", "--journal", team.admin_url)
    assert refused.returncode == 2 and "administers the team journal" in refused.stderr, refused.stderr
    assert "run this with an agent's login" in refused.stderr, refused.stderr
    checked = cli("doctor", "--journal", team.admin_url)
    assert checked.returncode == 1 and "✗ identity: the role" in checked.stdout, checked.stdout
    assert "administers the team journal" in checked.stdout
    assert admin_rows(team, "SELECT count(*) FROM commands") == [(3,)]
    # Bob copies the same journal: alice's copy brought it; he sees none of it, and adds nothing.
    by_bob = cli("journal", "copy", str(local), team.url("bob"))
    assert by_bob.returncode == 0 and "copied 0 commands" in by_bob.stdout, by_bob.stderr
    assert "3 were there already" in by_bob.stdout
    assert admin_rows(team, "SELECT count(*) FROM commands") == [(3,)]
    # ...and his history of the file says it is his login's that there are none of
    of_bob = cli("history", "/src/a.py", "--journal", team.url("bob"), "--host", "laptop")
    assert of_bob.returncode == 0 and "no saves or closes of this login's on laptop" in of_bob.stderr
    alices = cli("recover", str(saved_at), "--journal", team.url("bob"))
    assert alices.returncode == 2 and f"no event {saved_at} of this login's in the journal" in alices.stderr
    # replay editor says the same: each login replays its own saves and closes
    for login, steps in (("alice", "1 step"), ("bob", "0 steps")):
        dry = cli("replay", "editor", "--dry-run", "--journal", team.url(login), "--host", "laptop")
        assert dry.returncode == 0, dry.stderr
        assert f"{steps} from this login's events to replay (dry run" in dry.stdout


@pytest.mark.parametrize(
    "command",
    [["replay", "memory", "--check"], ["replay", "editor", "--dry-run"], ["recover", "1"]],
    ids=["replay memory --check", "replay editor --dry-run", "recover"],
)
@pytest.mark.parametrize("option", [("--agent", "bob"), ("--department", "sales")])
def test_a_dry_run_refuses_another_logins_name_as_the_run_would(
    team: Team, command: list[str], option: tuple[str, str]
) -> None:
    """They were accepted and ignored: the output was alice's, where bob's was asked for."""
    run = cli(*command, *option, "--journal", team.url("alice"))
    assert run.returncode == 2, run.stderr
    assert f"{option[0]} '{option[1]}' does not match" in run.stderr, run.stderr


def test_the_texts_the_admins_copy_brings_are_for_the_agent_whose_command_it_was(team: Team, tmp_path: Path) -> None:
    local = tmp_path / "journal.db"
    writer = SqliteJournal(local)
    alice = Caller(agent=team.roles["alice"], department="platform", host="laptop")
    save, blobs = saved("/src/a.py", b"before\n", b"after\n")
    anyio.run(lambda: writer.finish(record("saveDocument", caller=alice), None, "ok", events=[save], blobs=blobs))
    writer.close()
    copied = cli("journal", "copy", str(local), team.admin_url)
    assert copied.returncode == 0, copied.stderr
    [(saved_at,)] = admin_rows(team, "SELECT position FROM events WHERE type = 'DocumentSaved'")
    recovered = cli("recover", str(saved_at), "--journal", team.url("alice"))
    assert recovered.returncode == 0 and recovered.stdout == "before\n", recovered.stderr


def test_copy_keeps_an_empty_text_a_save_replaced(team: Team, tmp_path: Path) -> None:
    """A file that was empty on disk is a text like any other: recoverable after the copy."""
    local = tmp_path / "journal.db"
    writer = SqliteJournal(local)
    me = Caller(agent="legacy", department="default", host="laptop")
    save, blobs = saved("/src/empty.py", b"", b"hello\n")
    anyio.run(lambda: writer.finish(record("saveDocument", caller=me), None, "ok", events=[save], blobs=blobs))
    writer.close()
    assert cli("journal", "copy", str(local), team.url("alice")).returncode == 0
    [(saved_at,)] = admin_rows(team, "SELECT position FROM events WHERE type = 'DocumentSaved'")
    recovered = cli("recover", str(saved_at), "--journal", team.url("alice"))
    assert (recovered.returncode, recovered.stdout) == (0, ""), recovered.stderr


def test_copy_names_each_event_by_its_position_in_the_team_journal(team: Team, tmp_path: Path) -> None:
    """A restore and a replayed step name the event they come from by its position, which is
    the local journal's own: the copy names it by its place in the team journal."""
    local = tmp_path / "journal.db"
    writer = SqliteJournal(local)
    me = Caller(agent="legacy", department="default", host="laptop")
    save, blobs = saved("/src/a.py", b"before\n", b"after\n")
    restore = FileRestored(path="/src/a.py", from_position=1, written_blob=save.replaced_blob or "", replaced_blob=None)
    replayed = FileReplayed(path="/src/a.py", from_position=1, action="write", written_blob=save.written_blob)
    recover = {"path": "/src/a.py", "blob": restore.written_blob, "event": 1}

    async def work() -> None:
        await writer.finish(record("saveDocument", caller=me), None, "ok", events=[save], blobs=blobs)
        await writer.finish(record("recover", recover, caller=me), None, "ok", events=[restore])
        await writer.finish(record("replay_write", {**recover, "known": []}, caller=me), None, "ok", events=[replayed])

    anyio.run(work)
    writer.close()
    # The team journal's positions run ahead of the laptop's: alice's first copy of another journal.
    other = tmp_path / "other.db"
    earlier = SqliteJournal(other)
    anyio.run(lambda: earlier.finish(record("save", caller=me), None, "ok", events=[observation("n", "t")]))
    earlier.close()
    assert cli("journal", "copy", str(other), team.url("alice")).returncode == 0
    copied = cli("journal", "copy", str(local), team.url("alice"))
    assert copied.returncode == 0, copied.stderr
    [(saved_at,)] = admin_rows(team, "SELECT position FROM events WHERE type = 'DocumentSaved'")
    assert saved_at != 1
    named_events = "SELECT type, data::jsonb->>'from_position' FROM events WHERE type LIKE 'FileRe%%' ORDER BY 1 DESC"
    assert admin_rows(team, named_events) == [("FileRestored", str(saved_at)), ("FileReplayed", str(saved_at))]
    named_by_calls = "SELECT tool, arguments::jsonb->>'event' FROM commands WHERE tool LIKE 're%%' ORDER BY id"
    assert admin_rows(team, named_by_calls) == [("recover", str(saved_at)), ("replay_write", str(saved_at))]
    # the process that ran each command is the laptop's, not the copy's
    assert admin_rows(team, "SELECT DISTINCT pid FROM commands") == [(os.getpid(),)]
    # Bob copies it too: alice's copy brought every command, those that name an event he cannot see included.
    by_bob = cli("journal", "copy", str(local), team.url("bob"))
    assert by_bob.returncode == 0 and "copied 0 commands" in by_bob.stdout, by_bob.stderr
    assert "3 were there already" in by_bob.stdout
    # A restore since, from alice's save: bob cannot name her event, and his copy leaves no row.
    writer = SqliteJournal(local)
    anyio.run(lambda: writer.finish(record("recover", recover, caller=me), None, "ok", events=[restore]))
    writer.close()
    refused = cli("journal", "copy", str(local), team.url("bob"))
    assert refused.returncode != 0 and "under another login: copy this journal with that login" in refused.stderr
    assert admin_rows(team, "SELECT count(*) FROM commands") == [(4,)]  # other.db's and the laptop's first 3


def test_a_second_copy_brings_what_a_command_gained_since(team: Team, tmp_path: Path) -> None:
    """An openDiff copied while it waited for the user: the decision, made after, comes with the
    next copy, and the command is finished there as it is here (it was copied as finished, in
    doubt, and the decision never came)."""
    local = tmp_path / "journal.db"
    writer = SqliteJournal(local)
    me = Caller(agent="legacy", department="default", host="laptop")
    old, new = b"old\n", b"new\n"
    blobs = {blob_hash(old): old, blob_hash(new): new}
    opened = record("openDiff", {"new_file_path": "/src/a.py", "tab_name": "t"}, caller=me)
    proposed = DiffProposed(
        path="/src/a.py", tab_name="t", old_path="/src/a.py", proposed_blob=blob_hash(new), shown_blob=blob_hash(old)
    )
    accepted = DiffAccepted(
        path="/src/a.py",
        tab_name="t",
        written_blob=blob_hash(new),
        bytes_written=len(new),
        replaced_blob=blob_hash(old),
        user_edited=False,
    )

    async def propose() -> int:
        command_id = await writer.begin(opened, blobs)
        await writer.append(command_id, [proposed], blobs)
        return command_id

    command_id = anyio.run(propose)
    first = cli("journal", "copy", str(local), team.url("alice"))
    assert first.returncode == 0 and "copied 1 commands (1 events, 0 observations)" in first.stdout, first.stderr
    command = "SELECT status, finished_at IS NULL FROM commands"
    assert admin_rows(team, command) == [("in_doubt", True)]  # under way, as it was
    anyio.run(lambda: writer.finish(opened, command_id, "ok", events=[accepted], blobs=blobs))
    writer.close()
    again = cli("journal", "copy", str(local), team.url("alice"))
    assert again.returncode == 0, again.stderr
    assert "copied 0 commands (1 events, 0 observations)" in again.stdout
    assert "1 were there already, 1 of them brought up to date" in again.stdout
    assert admin_rows(team, command) == [("ok", False)]
    events = "SELECT type, recorded_at FROM events ORDER BY position"
    reader = SqliteReader(local)
    [entry] = list(reader.audit(AuditQuery()))
    reader.close()
    local_events = [(event.type, event.recorded_at) for event in entry.events]
    assert [(kind, iso) for kind, iso in admin_rows(team, events)] == local_events  # each at its own time
    history = cli("history", "/src/a.py", "--journal", team.url("alice"), "--host", "laptop")
    assert history.returncode == 0 and "diff accepted" in history.stdout, history.stderr
    third = cli("journal", "copy", str(local), team.url("alice"))
    assert "copied 0 commands (0 events, 0 observations)" in third.stdout
    assert "1 were there already\n" in third.stdout


# A toolbus killed while the user decided on its openDiff, after the proposal was recorded.
_PROPOSE_AND_DIE = """
import anyio, os, sys
from pathlib import Path
from toolbus.bus import Caller, CommandRecord, DiffAcceptInDoubt, DiffProposed, FileWriteInDoubt, blob_hash
from toolbus.journal.sqlite import SqliteJournal

async def work() -> None:
    writer = SqliteJournal(Path(sys.argv[1]))
    caller = Caller(agent="legacy", department="default", host="laptop")
    opened = CommandRecord(tool="openDiff", arguments={"tab_name": "b"}, caller=caller, received_ns=1)
    command_id = await writer.begin(opened, durable=False)
    new = blob_hash(b"new\\n")
    proposed = DiffProposed(path="/src/b.py", tab_name="b", old_path="/src/b.py", proposed_blob=new, shown_blob=new)
    await writer.append(command_id, [proposed], {new: b"new\\n"})
    doubt = [
        FileWriteInDoubt(path="/src/b.py", replaced_blob=None),
        DiffAcceptInDoubt(path="/src/b.py", tab_name="b", final_blob=new),
    ]
    await writer.keep_blobs({}, command_id=command_id, pending=doubt)

anyio.run(work)
os._exit(0)
"""


def test_the_admins_copy_brings_an_agents_commands_up_to_date_in_the_agents_name(team: Team, tmp_path: Path) -> None:
    """A command settled after its process died gains its events and why it has no outcome; one an
    earlier copy recorded as finished in doubt gains its events, keeps its row, and the copy says
    so. The admin's copy adds them in the name of the agent whose command they are."""
    local = tmp_path / "journal.db"
    died = subprocess.run([sys.executable, "-c", _PROPOSE_AND_DIE, str(local)], capture_output=True, text=True)
    assert died.returncode == 0, died.stderr
    writer = SqliteJournal(local)
    me = Caller(agent="legacy", department="default", host="laptop")
    new = b"new\n"
    opened = record("openDiff", {"tab_name": "c"}, caller=me)
    proposed = DiffProposed(
        path="/src/c.py", tab_name="c", old_path="/src/c.py", proposed_blob=blob_hash(new), shown_blob=blob_hash(new)
    )
    command_id = anyio.run(lambda: writer.begin(opened))
    anyio.run(lambda: writer.append(command_id, [proposed], {blob_hash(new): new}))
    assert "copied 2 commands (2 events" in cli("journal", "copy", str(local), team.url("alice")).stdout
    assert anyio.run(writer.settle_abandoned, "laptop") == 1
    accepted = DiffAccepted(
        path="/src/c.py",
        tab_name="c",
        written_blob=blob_hash(new),
        bytes_written=4,
        replaced_blob=None,
        user_edited=False,
    )
    anyio.run(lambda: writer.finish(opened, command_id, "ok", events=[accepted]))
    writer.close()
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus", autocommit=True) as conn:
        # as a copy before toolbus copied commands under way as such did
        conn.execute("UPDATE commands SET finished_at = received_at, duration_ms = 0 WHERE arguments LIKE '%%\"c\"%%'")
    copied = cli("journal", "copy", str(local), team.admin_url)
    assert copied.returncode == 0, copied.stderr
    assert "copied 0 commands (3 events, 0 observations)" in copied.stdout
    assert "2 were there already, 2 of them brought up to date" in copied.stdout
    assert "1 command(s) an earlier copy recorded as finished in doubt have an outcome here since" in copied.stdout
    rows = admin_rows(
        team,
        "SELECT c.arguments::jsonb->>'tab_name', c.status, c.error LIKE 'the toolbus process %%', e.type, e.agent"
        " FROM events AS e JOIN commands AS c ON c.id = e.command_id ORDER BY e.position",
    )
    alice = team.roles["alice"]
    assert rows == [
        ("b", "in_doubt", True, "DiffProposed", alice),
        ("c", "in_doubt", None, "DiffProposed", alice),
        ("b", "in_doubt", True, "FileWriteInDoubt", alice),
        ("b", "in_doubt", True, "DiffAcceptInDoubt", alice),
        ("c", "in_doubt", None, "DiffAccepted", alice),
    ]
    again = cli("journal", "copy", str(local), team.url("alice"))
    assert "copied 0 commands (0 events, 0 observations)" in again.stdout and "up to date" not in again.stdout


def test_a_copy_stopped_part_way_says_what_it_copied_and_exits_1(team: Team, tmp_path: Path) -> None:
    local = tmp_path / "journal.db"
    writer = SqliteJournal(local)
    me = Caller(agent="legacy", department="default", host="laptop")
    lost = FileRestored(path="/src/a.py", from_position=9999, written_blob="0" * 64, replaced_blob=None)

    async def work() -> None:
        for number in range(copy_batch):
            await writer.finish(record("save", caller=me), None, "ok", events=[observation(f"n{number}", "t")])
        await writer.finish(record("recover", caller=me), None, "ok", events=[lost])  # names no event it holds

    anyio.run(work)
    writer.close()
    stopped = cli("journal", "copy", str(local), team.url("alice"))
    assert stopped.returncode == 1, stopped.stderr
    assert "names event 9999, which the journal lacks" in stopped.stderr
    assert f"({copy_batch} commands were copied before it, and stay: copy again" in stopped.stderr
    assert admin_rows(team, "SELECT count(*) FROM observations") == [(copy_batch,)]


@pytest.mark.heavy
async def test_a_stopped_server_gives_errors_then_toolbus_reconnects(tmp_path: Path) -> None:
    import pgserver
    from pgserver.postgres_server import get_server

    # A server of its own, which this test stops and starts.
    server = get_server(tempfile.mkdtemp(prefix="tbpgf"), cleanup_mode="delete")
    admin_url = str(server.get_uri())
    with connect(admin_url) as conn:
        init_schema(conn)
        conn.execute("CREATE ROLE agent LOGIN")
        register_agent(conn, "agent", "ops")
    url = with_database(admin_url, "postgres", user="agent")
    try:
        async with toolbus(url, None) as client:
            assert not (await client.call_tool("save", {"title": "before", "text": "x"})).is_error
            # pg_ctl is made at import, one function per PostgreSQL program: no type information.
            pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)  # type: ignore[attr-defined]
            with anyio.fail_after(20):
                result = await client.call_tool("save", {"title": "during", "text": "x"})
            assert result.is_error and "team journal" in text_of(result)
            server.ensure_postgres_running()
            with anyio.fail_after(20):
                assert not (await client.call_tool("save", {"title": "after", "text": "x"})).is_error
    finally:
        server.cleanup()


def test_kill_9_mid_stream_loses_nothing_acknowledged_on_a_team_journal(team: Team, tmp_path: Path) -> None:
    from tests.rpc_client import StdioServer, result_json, toolbus_argv

    def save(server: StdioServer, title: str) -> int:
        reply = result_json(server.call_tool("save", {"title": title, "text": f"text of {title}"}, deadline=20))
        return int(reply["id"])

    acknowledged: dict[int, str] = {}
    with StdioServer(toolbus_argv(team.url("alice")), stderr=tmp_path / "first.stderr") as server:  # type: ignore[arg-type]
        server.initialize()
        for index in range(30):
            acknowledged[save(server, f"before {index}")] = f"before {index}"
        for index in range(5):  # sent, never answered: the kill comes first
            server.send_request(
                "tools/call", {"name": "save", "arguments": {"title": f"unanswered {index}", "text": "t"}}
            )
        server.kill()
    titles = dict(admin_rows(team, "SELECT id, title FROM observations"))
    assert {i: titles.get(i) for i in acknowledged} == acknowledged
    positions = [row[0] for row in admin_rows(team, "SELECT position FROM events ORDER BY position")]
    assert positions == list(range(1, len(positions) + 1))
    with StdioServer(toolbus_argv(team.url("alice")), stderr=tmp_path / "second.stderr") as server:  # type: ignore[arg-type]
        server.initialize()
        after = [save(server, f"after {index}") for index in range(5)]
    assert after == list(range(positions[-1] + 1, positions[-1] + 6))


def test_an_agent_settles_what_its_own_dead_process_was_doing_and_no_one_else_can(team: Team) -> None:
    """Under row-level security: the agent updates its own row and appends to its own command."""
    alice, carol = (PostgresJournal(team.url(name)) for name in ("alice", "carol"))
    try:
        dead = multiprocessing.get_context("spawn").Process(
            target=begin_and_die, args=(PostgresJournal, team.url("alice"), team.roles["alice"])
        )
        dead.start()
        dead.join(timeout=120)
        assert dead.exitcode == 0
        assert anyio.run(carol.settle_abandoned, HERE) == 0
        assert anyio.run(alice.settle_abandoned, HERE) == 3
    finally:
        alice.close()
        carol.close()
    in_doubt = admin_rows(
        team, "SELECT e.type, e.agent FROM events AS e JOIN commands AS c ON c.id = e.command_id ORDER BY e.position"
    )
    assert in_doubt == [
        (kind, team.roles["alice"])
        for kind in ("FileWriteInDoubt", "TabCloseInDoubt", "FileWriteInDoubt", "DiffAcceptInDoubt")
    ]


def test_a_team_journal_without_the_pending_column_works_until_init_adds_it(team: Team) -> None:
    """A journal of schema 1: an agent of a newer toolbus writes ahead and finishes as before,
    without what it may do, until its admin runs `journal init` again."""
    with connect(team.admin_url) as conn:
        conn.execute("ALTER TABLE toolbus.commands DROP COLUMN pending")
    call = record("saveDocument", {"filePath": "/src/a.py"}, Caller(agent=team.roles["alice"], department="platform"))
    event, blobs = saved("/src/a.py", b"old\n", b"new\n")
    doubt = FileWriteInDoubt(path="/src/a.py", replaced_blob=event.replaced_blob)

    def save(pending_under_way: str) -> None:
        """A save, with what its row holds while it acts (read by the admin) and after."""

        async def work(journal: PostgresJournal) -> list[int]:
            command_id = await journal.begin(call, blobs, pending=[doubt])
            await journal.keep_blobs(blobs, command_id=command_id, pending=[doubt])
            assert admin_rows(team, f"SELECT {pending_under_way} FROM commands WHERE id = %s", command_id) == [(True,)]
            return [appended.position for appended in await journal.finish(call, command_id, "ok", events=[event])]

        journal = PostgresJournal(team.url("alice"))
        try:
            assert len(anyio.run(work, journal)) == 1
        finally:
            journal.close()

    save("true")  # no column to read
    with connect(team.admin_url) as conn:
        init_schema(conn)
    save("pending::jsonb -> 'events' -> 0 ->> 0 = 'FileWriteInDoubt'")
    assert admin_rows(team, "SELECT count(*) FROM commands WHERE status = 'ok' AND pending IS NULL") == [(2,)]


async def test_replay_memory_rebuilds_a_team_journal_and_check_finds_it_whole(team: Team) -> None:
    async with toolbus(team.url("alice"), None) as alice:
        for index in range(3):
            await save_note(alice, f"note {index}", "project")
    check = cli("replay", "memory", "--check", "--journal", team.admin_url)
    assert check.returncode == 0 and "3 saved observations: no differences" in check.stdout, check.stdout
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus", autocommit=True) as conn:
        conn.execute("DELETE FROM observations WHERE title = 'note 1'")
        conn.execute("UPDATE observations SET title = 'changed' WHERE title = 'note 2'")
    check = cli("replay", "memory", "--check", "--journal", team.admin_url)
    assert check.returncode == 1 and "2 difference(s)" in check.stdout, check.stdout
    refused = cli("replay", "memory", "--journal", team.url("alice"))  # an agent may not rewrite the store
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.endswith(
        "only the team's admin may rebuild the memory store (every agent's notes): run it with the admin's URL;"
        " `toolbus replay memory --check` works for any agent\n"
    ), refused.stderr
    rebuilt = cli("replay", "memory", "--journal", team.admin_url)
    assert rebuilt.returncode == 0 and "from 3 saved observations" in rebuilt.stdout, rebuilt.stderr
    assert sorted(row[0] for row in admin_rows(team, "SELECT title FROM observations")) == [
        "note 0",
        "note 1",
        "note 2",
    ]
    async with toolbus(team.url("bob"), None) as bob:
        assert await titles(bob, "note") == ["note 0", "note 1", "note 2"]


async def test_a_lock_held_by_another_session_fails_a_save_in_seconds_not_never(team: Team) -> None:
    async with toolbus(team.url("alice"), None, env=QUICK_TIMEOUTS) as alice:
        await save_note(alice, "before", "project")
        with team.sql("bob") as bob:  # an agent's session that appends, and keeps its transaction open
            bob.execute("BEGIN")
            bob.execute(
                "INSERT INTO events (event_id, type, version, stream, recorded_at, data, agent, department,"
                " visibility) VALUES ('held', 'Held', 1, 's', '2026', '{}', current_user, 'platform', 'private')"
            )
            with anyio.fail_after(20):
                result = await alice.call_tool("save", {"title": "blocked", "text": "x"})
            assert result.is_error and "lock timeout" in text_of(result)
            bob.execute("ROLLBACK")
            # The lock is a row only the journal's owner may lock: no session-long advisory lock
            # of any key (the one schemas before 4 used: 'tbus') holds it.
            bob.execute("SELECT pg_advisory_lock(x'74627573'::int)")
            await save_note(alice, "after", "project")
    titles = sorted(row[0] for row in admin_rows(team, "SELECT title FROM observations"))
    assert titles == ["after", "before"]
    with team.sql("bob") as bob, pytest.raises(psycopg.errors.InsufficientPrivilege):
        bob.execute("SELECT FROM append_lock FOR UPDATE")


async def test_a_server_that_stops_answering_gives_an_error_not_a_hang(team: Team) -> None:
    import os
    import signal

    async with toolbus(team.url("alice"), None, env=QUICK_TIMEOUTS) as alice:
        await save_note(alice, "before", "project")
        [(backend,)] = admin_rows(
            team,
            "SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name = 'toolbus'",
            team.roles["alice"],
        )
        os.kill(backend, signal.SIGSTOP)  # alive, silent
        try:
            with anyio.fail_after(30):
                result = await alice.call_tool("search", {"query": "before"})
            assert result.is_error and "did not answer within 2 s" in text_of(result)
            # The next call does not queue behind the one still waiting: it is told so at once.
            with anyio.fail_after(30):
                during = await alice.call_tool("save", {"title": "during", "text": "x"})
            assert during.is_error and "has not yet answered a call" in text_of(during)
        finally:
            resumed = iso_time(time.time_ns())
            os.kill(backend, signal.SIGCONT)
        with anyio.fail_after(30):  # once it answers, calls go through again
            while (await alice.call_tool("search", {"query": "before"})).is_error:
                await anyio.sleep(0.05)
    # The held call committed once the server went on; no second row says it failed, and the
    # calls refused meanwhile reached no server. (A search retried above may have been refused
    # while the held call finished, and then journaled as failed: that is what happened to it.)
    statuses = admin_rows(
        team,
        "SELECT tool, status FROM commands WHERE (tool <> 'search' OR status <> 'ok') AND received_at < %s",
        resumed,
    )
    assert statuses == [("save", "ok")]


def test_a_server_that_stops_answering_does_not_keep_toolbus_from_exiting(team: Team, tmp_path: Path) -> None:
    """The client hangs up while the silent server still holds a call: toolbus exits all the same."""
    import os
    import signal

    from tests.rpc_client import StdioServer, clean_env, result_text, toolbus_argv

    argv = toolbus_argv(team.url("alice"))  # type: ignore[arg-type]
    with StdioServer(argv, env=clean_env(QUICK_TIMEOUTS), stderr=tmp_path / "serve.stderr") as server:
        server.initialize()
        server.call_tool("save", {"title": "before", "text": "x"}, deadline=20)
        [(backend,)] = admin_rows(
            team,
            "SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name = 'toolbus'",
            team.roles["alice"],
        )
        os.kill(backend, signal.SIGSTOP)
        try:
            stuck = server.call_tool("search", {"query": "before"}, deadline=30)
            assert stuck.get("isError") and "did not answer" in result_text(stuck)
            assert server.close(timeout=30) == 0  # not killed: it ended by itself
        finally:
            os.kill(backend, signal.SIGCONT)


async def test_a_running_server_follows_its_agent_removed_re_added_or_moved_by_the_admin(team: Team) -> None:
    """The admin changes a running agent's registration: re-added, it goes on as before; no
    agent any more, or moved to another department, each call says so and to restart."""

    def admin(*args: str) -> None:
        done = cli("journal", "agent", team.admin_url, *args)
        assert done.returncode == 0, done.stderr

    alice = team.roles["alice"]
    async with toolbus(team.url("alice"), None) as client:
        await save_note(client, "before", "project")
        admin(alice, "--remove")
        gone = await client.call_tool("save", {"title": "gone", "text": "x"})
        assert gone.is_error and "any more: the team's admin removed it" in text_of(gone), text_of(gone)
        admin(alice, "--department", "platform")
        await save_note(client, "re-added", "project")
        assert await titles(client, "added") == ["re-added"]
        admin(alice, "--department", "sales")
        for tool, arguments in (("save", {"title": "moved", "text": "x"}), ("search", {"query": "before"})):
            moved = await client.call_tool(tool, arguments)
            assert moved.is_error, text_of(moved)
            assert "moved it from department 'platform' to 'sales'" in text_of(moved), text_of(moved)
            assert "restart toolbus" in text_of(moved)
    assert admin_rows(team, "SELECT title, department FROM observations ORDER BY id") == [
        ("before", "platform"),
        ("re-added", "platform"),
    ]


def test_a_team_journal_failing_mid_read_is_said_in_one_line(team: Team) -> None:
    """An error PostgreSQL gives once connected (here a privilege taken away; a lock waited for,
    a server restarting) ends the command with its words, not a traceback."""
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus", autocommit=True) as conn:
        conn.execute(f'REVOKE SELECT ON commands FROM "toolbus_agent_{team.database}"')
    for command in (("audit",), ("history", "/src/a.py")):
        run = cli(*command, "--journal", team.url("alice"))
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        [line] = run.stderr.splitlines()
        assert line.startswith(f"toolbus {command[0]}: the team journal at ") and "permission denied" in line


def test_a_team_journal_of_a_newer_schema_is_refused_and_never_brought_down(team: Team) -> None:
    """As a SQLite journal is: this toolbus would read it wrong, and `init` would put its own
    functions and policies over the newer ones."""
    with psycopg.connect(team.admin_url, options="-c search_path=toolbus", autocommit=True) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for command in (("audit", "--journal", team.url("alice")), ("journal", "init", team.admin_url)):
        run = cli(*command)
        assert run.returncode == 2 and "has schema version 99, newer than this toolbus understands" in run.stderr
        assert "upgrade toolbus" in run.stderr and "Traceback" not in run.stderr
    assert admin_rows(team, "SELECT value FROM meta WHERE key = 'schema_version'") == [("99",)]


def test_a_copy_of_a_damaged_journal_names_it(team: Team, tmp_path: Path) -> None:
    """Not the journal --journal names (the user's own), which the copy never read."""
    source = damaged_journal(tmp_path / "laptop.db")
    run = cli("journal", "copy", str(source), team.url("alice"))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith(f"toolbus journal: the journal at {source} is damaged")
