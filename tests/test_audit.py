"""`toolbus audit`: filters and both output formats, on a journal made by real tool calls."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.journal_helpers import EditorSession, cli, record_editor_session
from tests.rpc_client import StdioServer, result_json, toolbus_argv
from toolbus.bus import AuditQuery
from toolbus.journal.sqlite.audit import _command_sql, _driving_column, _failed_changes_sql
from toolbus.journal.sqlite.readonly import open_readonly

JSON_FIELDS = {
    "id",
    "received_at",
    "finished_at",
    "duration_ms",
    "tool",
    "target",
    "status",
    "error",
    "agent",
    "department",
    "client_name",
    "client_version",
    "session_id",
    "host",
    "pid",
    "arguments",
    "events",
}
EVENT_FIELDS = {
    "position",
    "event_id",
    "command_id",
    "type",
    "version",
    "stream",
    "recorded_at",
    "data",
    "blobs",
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EditorSession]:
    recorded = record_editor_session(tmp_path_factory.mktemp("audit"))
    recorded.nvim.kill()
    yield recorded


def audit(session: EditorSession, *args: str) -> list[dict[str, Any]]:
    run = cli("audit", "--journal", session.journal, "--json", *args)
    assert run.code == 0, run.err
    return run.json_lines()


def test_json_lines_hold_every_command_newest_first_with_its_events(session: EditorSession) -> None:
    lines = audit(session)
    commands = session.reader.commands()
    assert sorted(line["id"] for line in lines) == [row["id"] for row in commands]
    received = [line["received_at"] for line in lines]
    assert received == sorted(received, reverse=True)
    for line in lines:
        assert set(line) == JSON_FIELDS
        for event in line["events"]:
            assert set(event) == EVENT_FIELDS
    events = [event for line in lines for event in line["events"]]
    assert sorted(event["position"] for event in events) == [row["position"] for row in session.reader.events()]


def test_json_line_of_a_save_names_its_file_blobs_and_sizes(session: EditorSession) -> None:
    [first_save] = [line for line in audit(session, "--tool", "saveDocument") if line["events"] and line["id"] == 1]
    [event] = first_save["events"]
    a = os.path.realpath(session.files["a.txt"])
    assert first_save["target"] == a
    assert first_save["arguments"] == {"filePath": str(session.files["a.txt"])}
    assert event["type"] == "DocumentSaved" and event["stream"] == f"file:{a}"
    assert event["data"]["bytes_written"] == len("alpha 2\n")
    assert event["blobs"] == {
        event["data"]["written_blob"]: len("alpha 2\n"),
        event["data"]["replaced_blob"]: len("alpha 1\n"),
    }


def test_filter_by_tool(session: EditorSession) -> None:
    lines = audit(session, "--tool", "close_tab")
    assert [line["tool"] for line in lines] == ["close_tab"]
    assert lines[0]["events"][0]["data"]["was_modified"] is True


def test_filter_by_path_gives_the_files_saves_and_closes(session: EditorSession) -> None:
    a_lines = audit(session, "--path", str(session.files["a.txt"]))
    assert [line["events"][0]["type"] for line in a_lines] == ["DocumentSaved", "DocumentSaved"]
    assert [line["agent"] for line in a_lines] == ["reviewer", "writer"]
    b_lines = audit(session, "--path", str(session.files["b.txt"]))
    assert [line["tool"] for line in b_lines] == ["close_tab"]
    c_lines = audit(session, "--path", str(session.files["c.txt"]))
    assert [line["events"][0]["type"] for line in c_lines] == ["DocumentSaved", "DocumentSaveRefused"]


def test_filter_by_path_accepts_a_relative_path_and_combines_with_others(session: EditorSession) -> None:
    work = session.files["a.txt"].parent
    run = cli("audit", "--journal", session.journal, "--json", "--path", "a.txt", "--agent", "writer", cwd=work)
    assert run.code == 0, run.err
    assert [(line["agent"], line["tool"]) for line in run.json_lines()] == [("writer", "saveDocument")]


@pytest.mark.parametrize(("status", "tools"), [("rejected", ["saveDocument"]), ("failed", ["getOpenEditors"])])
def test_filter_by_status(session: EditorSession, status: str, tools: list[str]) -> None:
    lines = audit(session, "--status", status)
    assert [line["tool"] for line in lines] == tools
    assert all(line["status"] == status and line["error"] for line in lines)


def test_filter_by_status_ok_excludes_the_others(session: EditorSession) -> None:
    lines = audit(session, "--status", "ok")
    assert lines and all(line["status"] == "ok" for line in lines)
    assert len(lines) == len(session.reader.rows("SELECT id FROM commands WHERE status = 'ok'"))


def test_filter_by_session_and_agent(session: EditorSession) -> None:
    sessions = [row["session_id"] for row in session.reader.rows("SELECT DISTINCT session_id FROM commands")]
    assert len(sessions) == 3  # one per toolbus process
    for session_id in sessions:
        expected = session.reader.rows("SELECT id FROM commands WHERE session_id = ?", session_id)
        assert sorted(line["id"] for line in audit(session, "--session", session_id)) == sorted(
            row["id"] for row in expected
        )
    reviewer = audit(session, "--agent", "reviewer")
    assert [line["tool"] for line in reviewer] == ["saveDocument", "saveDocument"]
    assert all(line["agent"] == "reviewer" for line in reviewer)


def test_filter_by_time_absolute_and_relative(session: EditorSession) -> None:
    rows = session.reader.commands()
    middle = sorted(row["received_at"] for row in rows)[len(rows) // 2]
    since = audit(session, "--since", middle)
    until = audit(session, "--until", middle)
    assert {line["id"] for line in since} | {line["id"] for line in until} == {row["id"] for row in rows}
    assert not {line["id"] for line in since} & {line["id"] for line in until}
    assert all(line["received_at"] >= middle for line in since)
    assert len(audit(session, "--since", "1h")) == len(rows)
    assert audit(session, "--until", "1h") == []
    assert audit(session, "--since", "2d", "--until", "1d") == []


def test_filter_by_time_with_a_zone_offset(session: EditorSession) -> None:
    rows = session.reader.commands()
    newest = max(row["received_at"] for row in rows)
    moment = datetime.fromisoformat(newest.replace("Z", "+00:00")).astimezone()  # local zone, with offset
    later = (moment + timedelta(microseconds=1)).isoformat()
    assert [line["received_at"] for line in audit(session, "--since", moment.isoformat())] == [newest]
    assert audit(session, "--since", later) == []


def test_limit(session: EditorSession) -> None:
    newest = audit(session)
    assert audit(session, "--limit", "2") == newest[:2]
    assert len(audit(session, "--limit", "0")) == len(newest)
    # the table says when the limit left commands out, and only then
    cut = cli("audit", "--journal", session.journal, "--limit", "2")
    assert len(cut.out.splitlines()) == 1 + 2 and "(the newest 2 shown; --limit 0 for all)" in cut.err
    whole = cli("audit", "--journal", session.journal, "--limit", str(len(newest)))
    assert len(whole.out.splitlines()) == 1 + len(newest) and "shown" not in whole.err


def test_table_for_people(session: EditorSession) -> None:
    run = cli("audit", "--journal", session.journal)
    assert run.code == 0, run.err
    header, *rows = run.out.splitlines()
    # two agents made the session: each row says whose it is
    assert header.split() == ["TIME", "(UTC)", "AGENT", "TOOL", "TARGET", "STATUS", "DURATION", "WHAT", "HAPPENED"]
    assert len(rows) == len(session.reader.commands())
    assert {row.split()[2] for row in rows} == {"writer", "reviewer"}
    one_agent = cli("audit", "--agent", "writer", "--journal", session.journal).out.splitlines()[0]
    assert "AGENT" not in one_agent.split()
    a = os.path.realpath(session.files["a.txt"])
    close = next(row for row in rows if "close_tab" in row)
    assert "ok" in close.split() and "discarded 14 B unsaved" in close
    first_save = rows[-1]
    assert a in first_save and "saved 8 B, replaced 8 B" in first_save and " ms" in first_save
    rejected = next(row for row in rows if "rejected" in row)
    assert 'filePath: expected an absolute path, got "relative/a.txt"' in rejected
    # aligned: every row's STATUS column starts where the header's does
    column = header.index("STATUS")
    assert all(row[column:].split()[0] in ("ok", "rejected", "failed", "in_doubt") for row in rows)


def test_table_shows_control_characters_as_escapes_never_sends_them(tmp_path: Path) -> None:
    """An agent's text must not clear the user's screen or forge a line of the audit."""
    journal = tmp_path / "journal.db"
    title = "\x1b]0;owned\x07\x1b[2Jred\nFAKE 2026-01-01 save ok"
    with StdioServer(toolbus_argv(journal), stderr=tmp_path / "server.stderr") as server:
        server.initialize()
        result_json(server.call_tool("save", {"title": title, "text": "x"}))
    run = cli("audit", "--journal", journal)
    assert run.code == 0, run.err
    [line] = [line for line in run.out.splitlines() if "owned" in line]
    assert "\\x1b]0;owned\\x07\\x1b[2Jred\\nFAKE 2026-01-01 save ok" in line
    assert not any(char in run.out for char in "\x1b\x07")
    assert len(run.out.splitlines()) == 2  # the header and the one command


def test_a_diff_that_failed_before_any_event_is_about_its_file_not_its_tab(tmp_path: Path) -> None:
    journal, file = tmp_path / "journal.db", tmp_path / "a.py"
    arguments = {"old_file_path": str(file), "new_file_path": str(file), "new_file_contents": "x", "tab_name": "t"}
    with StdioServer(toolbus_argv(journal, nvim=str(tmp_path / "gone.sock")), stderr=tmp_path / "s.err") as server:
        server.initialize()
        assert server.call_tool("openDiff", arguments, deadline=30).get("isError")
    [entry] = cli("audit", "--journal", journal, "--json").json_lines()
    assert (entry["tool"], entry["status"], entry["target"]) == ("openDiff", "failed", str(file))


def test_table_says_when_nothing_matches_and_which_filter_may_be_why(session: EditorSession) -> None:
    run = cli("audit", "--journal", session.journal, "--tool", "no-such-tool")
    assert (run.code, run.out, run.err) == (0, "", "no commands match: --tool no-such-tool is no tool\n")
    run = cli("audit", "--journal", session.journal, "--tool", "savedocument")
    assert run.err == "no commands match: --tool savedocument is no tool (did you mean saveDocument?)\n"
    run = cli("audit", "--journal", session.journal, "--path", session.files["a.txt"], "--host", "elsewhere")
    assert run.err == "no commands match on elsewhere (--all-hosts for every machine's)\n"
    run = cli("audit", "--journal", session.journal, "--tool", "recover", "--status", "failed")
    assert run.err == "no commands match\n"  # a tool of the command line's, none of which failed


def test_audit_leaves_the_journal_as_it_was(session: EditorSession, tmp_path: Path) -> None:
    wal = Path(f"{session.journal}-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # every commit is in the main file
    journal = tmp_path / "copy.db"
    shutil.copy2(session.journal, journal)
    before = journal.stat()
    for args in ([], ["--json"], ["--path", str(session.files["a.txt"])], ["--limit", "1"]):
        assert cli("audit", "--journal", journal, *args).code == 0
    after = journal.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db"]  # no -wal or -shm left behind


# --- query plans: every filter walks an index in the order asked ------------------------------


PLANNED = {
    "none": AuditQuery(),
    "tool": AuditQuery(tool="saveDocument"),
    "status": AuditQuery(status="failed"),
    "status ok": AuditQuery(status="ok"),
    "session": AuditQuery(session="s"),
    "agent": AuditQuery(agent="writer"),
    "window": AuditQuery(since="2026-01-01T00:00:00.000000Z", until="2027-01-01T00:00:00.000000Z"),
    "tool and window": AuditQuery(tool="close_tab", since="2026-01-01T00:00:00.000000Z"),
    "path": AuditQuery(paths=("file:/a",)),
    "path and status": AuditQuery(paths=("file:/a",), status="ok"),
    "rare tool and common status": AuditQuery(tool="close_tab", status="ok"),
    "agent and tool": AuditQuery(agent="reviewer", tool="saveDocument"),
    "tool and rare status": AuditQuery(tool="saveDocument", status="failed"),
    "session and rare status": AuditQuery(session="s", status="rejected"),
    "session and agent": AuditQuery(session="s", agent="writer"),
    "host": AuditQuery(host="laptop"),
    "path and host": AuditQuery(paths=("file:/a",), host="laptop"),
    "tool and host": AuditQuery(tool="saveDocument", host="laptop"),
}


@pytest.mark.parametrize("name", PLANNED)
def test_audit_queries_walk_an_index_without_sorting(session: EditorSession, name: str) -> None:
    query = PLANNED[name]
    conn = open_readonly(session.journal)
    try:
        sql, params = _command_sql(query, _driving_column(conn, query))
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    finally:
        conn.close()
    assert plan[0].startswith("SEARCH") or "USING INDEX" in plan[0], plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_a_status_other_than_ok_walks_the_partial_index(session: EditorSession) -> None:
    conn = open_readonly(session.journal)
    try:
        for query in (AuditQuery(status="in_doubt"), AuditQuery(status="failed", agent="writer")):
            sql, params = _command_sql(query, _driving_column(conn, query))
            [step] = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
            assert "idx_commands_not_ok_status_received_at (status=?)" in step, step
    finally:
        conn.close()


@pytest.mark.parametrize(
    "query",
    [
        AuditQuery(paths=("file:/a",)),
        AuditQuery(paths=("file:/a",), since="2026-01-01", until="2027-01-01", agent="writer", session="s"),
        AuditQuery(paths=("file:/a",), status="failed", tool="saveDocument", host="laptop"),
    ],
)
def test_a_files_failed_calls_are_found_through_the_partial_index(session: EditorSession, query: AuditQuery) -> None:
    """Never a walk of every command in the window, or of every save, nor a sort of them."""
    conn = open_readonly(session.journal)
    try:
        sql, params = _failed_changes_sql(query, "failed")
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    finally:
        conn.close()
    assert "USING INDEX idx_commands_not_ok_status_received_at (status=?)" in plan[0], plan
    assert not any("TEMP B-TREE" in step for step in plan), plan  # newest first, read as far as needed


def test_of_two_filters_the_rarer_one_drives(session: EditorSession) -> None:
    conn = open_readonly(session.journal)
    try:
        assert _driving_column(conn, AuditQuery(tool="close_tab", status="ok")) == "tool"
        assert _driving_column(conn, AuditQuery(tool="saveDocument", status="rejected")) == "status"
        assert _driving_column(conn, AuditQuery(tool="saveDocument")) is None
        # session and agent have no index of their own: never counted, never driving
        assert _driving_column(conn, AuditQuery(agent="writer", status="failed")) == "status"
        assert _driving_column(conn, AuditQuery(agent="writer", status="ok")) is None
        assert _driving_column(conn, AuditQuery(session="s", agent="writer")) is None
    finally:
        conn.close()


# --- journal/SCHEMA.md: the documented views and example queries ---------------------------

SCHEMA_DOC = Path(__file__).resolve().parent.parent / "journal" / "SCHEMA.md"
SQLITE_UTILS = Path(sys.executable).with_name("sqlite-utils")


def doc_examples() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", SCHEMA_DOC.read_text(), re.DOTALL)


def sqlite_utils_query(journal: Path, sql: str, **params: str) -> list[dict[str, Any]]:
    args = [str(SQLITE_UTILS), "query", str(journal), sql]
    for name, value in params.items():
        args += ["-p", name, value]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def test_schema_doc_examples_run_in_sqlite_utils(session: EditorSession, tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    shutil.copy2(session.journal, journal)
    went_wrong, story, per_tool, discarded = doc_examples()
    assert {row["status"] for row in sqlite_utils_query(journal, went_wrong)} == {"rejected", "failed"}
    a = os.path.realpath(session.files["a.txt"])
    rows = sqlite_utils_query(journal, story, path=a)
    assert [(row["event_type"], row["agent"], row["disk_changed"]) for row in rows] == [
        ("DocumentSaved", "reviewer", 1),
        ("DocumentSaved", "writer", 0),
    ]
    assert rows[-1]["recoverable_bytes"] == len("alpha 1\n")
    calls = {(row["tool"], row["status"]): row["calls"] for row in sqlite_utils_query(journal, per_tool)}
    assert calls[("saveDocument", "ok")] == 4 and calls[("saveDocument", "rejected")] == 1
    [row] = sqlite_utils_query(journal, discarded)
    assert (row["discarded_text"], row["agent"]) == ("bravo unsaved\n", "writer")


def test_schema_doc_names_every_column_of_the_views(session: EditorSession) -> None:
    text = SCHEMA_DOC.read_text()
    conn = sqlite3.connect(f"file:{session.journal}?mode=ro", uri=True)
    try:
        for view in ("audit_log", "file_history"):
            section = text.split(f"### `{view}`", 1)[1].split("###", 1)[0]
            columns = [row[1] for row in conn.execute(f"PRAGMA table_info({view})")]
            assert columns and all(f"`{column}`" in section for column in columns), (view, columns)
    finally:
        conn.close()
