"""Journals written by an earlier toolbus stay readable: new event fields get their defaults,
older event versions are upcast on read, and stored rows are never rewritten.

`tests/fixtures/journal-schema*.db` were made by real tool calls (tests/fixtures/make_journal.py).
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec
import pytest

from tests.journal_contract import saved
from tests.journal_helpers import cli
from toolbus.adapters.cli import main
from toolbus.bus import Caller, CommandRecord
from toolbus.bus import events as bus_events
from toolbus.bus.events import EVENT_TYPES, DocumentSaved, Event, TabClosed, decode_event, upcaster
from toolbus.journal import SCHEMA_VERSION, SqliteJournal

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("journal-schema*.db"))
NOTES = "/tmp/toolbus-fixture/work/b.md"  # closed with unsaved text, then restored, in every fixture
RECORDED_TYPES = {
    "DocumentSaved",
    "DocumentSaveRefused",
    "TabClosed",
    "TabCloseSkipped",
    "FileRestored",
    "ObservationSaved",
}


@pytest.fixture(params=FIXTURES, ids=[path.stem for path in FIXTURES])
def old_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A copy: the committed fixture itself is never opened for writing."""
    copy = tmp_path / "journal.db"
    shutil.copyfile(request.param, copy)
    return copy


def stored_events(journal: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(journal)
    try:
        return conn.execute(
            "SELECT position, event_id, type, version, stream, data FROM events ORDER BY position"
        ).fetchall()
    finally:
        conn.close()


def audit_json(journal: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    """`toolbus audit --json` in this process, so it sees the test's event types; of every machine,
    for a fixture recorded on another one."""
    assert main(["audit", "--json", "--all-hosts", "--journal", str(journal), *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_there_is_a_fixture_for_the_current_schema() -> None:
    assert any(path.stem == f"journal-schema{SCHEMA_VERSION}" for path in FIXTURES), (
        "the schema version changed: record a journal with `python -m tests.fixtures.make_journal`"
    )


def test_every_stored_event_decodes_with_the_current_types(old_journal: Path) -> None:
    rows = stored_events(old_journal)
    assert {row[2] for row in rows} >= RECORDED_TYPES
    for _, _, type_name, version, stream, data in rows:
        event = decode_event(type_name, version, data)
        assert type(event) is EVENT_TYPES[type_name]
        assert event.stream == stream


def test_a_field_added_later_with_a_default_reads_old_events(
    old_journal: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class DocumentSavedLater(DocumentSaved, frozen=True, kw_only=True, tag="DocumentSaved"):
        """DocumentSaved as a later toolbus might write it: same version, one more field."""

        line_endings: str = "unix"

    monkeypatch.setitem(EVENT_TYPES, "DocumentSaved", DocumentSavedLater)
    before = stored_events(old_journal)
    [row] = [row for row in before if row[2] == "DocumentSaved"]
    event = decode_event(row[2], row[3], row[5])
    assert isinstance(event, DocumentSavedLater)
    assert event.line_endings == "unix"
    assert event.bytes_written == json.loads(row[5])["bytes_written"]

    [line] = audit_json(old_journal, capsys, "--path", json.loads(row[5])["path"])
    assert line["events"][0]["data"]["line_endings"] == "unix"
    assert stored_events(old_journal) == before


class TabClosedV3(Event, frozen=True, kw_only=True, tag="TabClosed"):
    """TabClosed two versions on: v2 renamed `tab_name` to `closed_as`; v3 replaced the flag
    `was_modified` by `outcome` and added `closed_by`, which v1 data cannot know."""

    version: ClassVar[int] = 3

    path: str
    closed_as: str
    outcome: str  # "discarded unsaved text" | "clean"
    discarded_blob: str | None
    closed_by: str = "agent"

    @property
    def stream(self) -> str:
        return f"file:{self.path}"


def register_tab_closed_v3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EVENT_TYPES, "TabClosed", TabClosedV3)
    monkeypatch.setattr(bus_events, "UPCASTERS", {})

    @upcaster("TabClosed", 1)
    def rename_tab_name(data: dict[str, Any]) -> dict[str, Any]:
        data["closed_as"] = data.pop("tab_name")
        return data

    @upcaster("TabClosed", 2)
    def outcome_from_flag(data: dict[str, Any]) -> dict[str, Any]:
        data["outcome"] = "discarded unsaved text" if data.pop("was_modified") else "clean"
        return data


def test_an_older_event_version_is_upcast_on_read_and_never_rewritten(
    old_journal: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    register_tab_closed_v3(monkeypatch)
    before = stored_events(old_journal)
    [row] = [row for row in before if row[2] == "TabClosed"]
    assert row[3] == 1
    stored = json.loads(row[5])

    event = decode_event("TabClosed", 1, row[5])
    assert event == TabClosedV3(
        path=stored["path"],
        closed_as=stored["tab_name"],
        outcome="discarded unsaved text",
        discarded_blob=stored["discarded_blob"],
    )
    [line] = audit_json(old_journal, capsys, "--tool", "close_tab", "--status", "ok", "--path", stored["path"])
    data = line["events"][0]["data"]
    assert (data["closed_as"], data["outcome"], data["closed_by"]) == (
        "b.md",
        "discarded unsaved text",
        "agent",
    )
    assert "tab_name" not in data and line["events"][0]["version"] == 1

    # the upcast event still leads back to its text, and the stored row is as it was
    assert main(["recover", str(row[0]), "--journal", str(old_journal)]) == 0
    assert capsys.readouterr().out == "# Notes\nunsaved line\n"
    assert stored_events(old_journal) == before


def test_a_missing_upcaster_is_a_clear_error(old_journal: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register_tab_closed_v3(monkeypatch)
    monkeypatch.setattr(bus_events, "UPCASTERS", {})
    [row] = [row for row in stored_events(old_journal) if row[2] == "TabClosed"]
    with pytest.raises(ValueError, match="no upcaster for TabClosed from version 1 to 2"):
        decode_event("TabClosed", 1, row[5])


def test_events_of_a_version_this_toolbus_does_not_know_still_show_in_the_audit(
    old_journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer toolbus may add event types; an older one lists them with their stored data."""
    conn = sqlite3.connect(old_journal)
    with conn:
        conn.execute(
            "INSERT INTO events (event_id, command_id, type, version, stream, recorded_at, data)"
            " VALUES ('f' || hex(randomblob(15)), 1, 'BufferRenamed', 1, 'file:/x', '2030-01-01T00:00:00.000000Z',"
            ' \'{"from":"/x","to":"/y"}\')'
        )
    conn.close()
    [line] = audit_json(old_journal, capsys, "--limit", "0", "--path", "/tmp/toolbus-fixture/work/a.py")
    types = [event["type"] for event in line["events"]]
    assert types == ["DocumentSaved", "BufferRenamed"]
    assert line["events"][1]["data"] == {"from": "/x", "to": "/y"}


def test_an_old_journal_opens_migrates_and_works(old_journal: Path) -> None:
    before = stored_events(old_journal)
    read_only = cli("audit", "--json", "--limit", "0", "--journal", old_journal)
    assert read_only.code == 0, read_only.err
    assert {line["tool"] for line in read_only.json_lines()} >= {
        "saveDocument",
        "close_tab",
        "save",
        "recover",
    }

    SqliteJournal(old_journal, create=False).close()  # a writer migrates it to the current schema
    conn = sqlite3.connect(old_journal)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    assert stored_events(old_journal) == before
    migrated = cli("replay", "memory", "--check", "--journal", old_journal)  # its derived tables filled
    assert migrated.code == 0, migrated.out

    assert cli("replay", "memory", "--journal", old_journal).code == 0
    check = cli("replay", "memory", "--check", "--journal", old_journal)
    assert check.code == 0, check.out
    assert cli("recover", "3", "--journal", old_journal).raw == b"# Notes\nunsaved line\n"
    history = cli("history", NOTES, "--all-hosts", "--journal", old_journal)
    assert "restored 21 B from @3" in history.out and "closed, discarded 21 B unsaved" in history.out


def command_hosts(journal: Path) -> list[str | None]:
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("SELECT host FROM commands ORDER BY id")]
    finally:
        conn.close()


def history_positions(journal: Path, *args: str) -> list[int]:
    run = cli("history", NOTES, "--json", "--journal", journal, *args)
    assert run.code == 0, run.err
    return [line["event"]["position"] for line in run.json_lines()]


def test_a_schema_5_journal_keeps_its_commands_of_unknown_machine_on_every_machine(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    shutil.copyfile(Path(__file__).parent / "fixtures" / "journal-schema5.db", journal)
    unmigrated = history_positions(journal)  # read as it is: no host column yet
    assert unmigrated == [10, 3] and history_positions(journal, "--host", "anywhere") == unmigrated
    assert {line["host"] for line in cli("audit", "--json", "--journal", journal).json_lines()} == {None}

    async def save_elsewhere() -> list[int]:
        """The same path saved on another machine, by a toolbus that knows machines."""
        writer = SqliteJournal(journal, create=False)  # migrates to schema 6
        event, blobs = saved(NOTES, None, b"elsewhere\n")
        call = CommandRecord(
            tool="saveDocument", arguments={}, caller=Caller(host="other-machine"), received_ns=time.time_ns()
        )
        try:
            return [
                appended.position for appended in await writer.finish(call, None, "ok", events=[event], blobs=blobs)
            ]
        finally:
            writer.close()

    [elsewhere] = anyio.run(save_elsewhere)
    assert command_hosts(journal) == [None] * 11 + ["other-machine"]
    assert history_positions(journal) == unmigrated  # unknown machine: shown on this one too
    assert history_positions(journal, "--host", "other-machine") == [elsewhere, *unmigrated]
    text = cli("history", NOTES, "--all-hosts", "--journal", journal).out
    assert text.splitlines()[1].split()[:4] == ["EVENT", "TIME", "(UTC)", "HOST"] and " ? " in text


def test_the_current_fixture_records_the_machine_of_each_command() -> None:
    journal = Path(__file__).parent / "fixtures" / f"journal-schema{SCHEMA_VERSION}.db"
    [recorded_on] = set(command_hosts(journal))
    assert recorded_on, "every command names its machine"
    assert history_positions(journal, "--host", recorded_on) == [10, 3]
    if recorded_on != socket.gethostname():
        assert history_positions(journal) == []  # another machine's b.md is not this one's


def schema_of(journal: Path) -> list[tuple[str, str, str | None]]:
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
    finally:
        conn.close()


def test_a_migrated_journal_has_the_tables_views_and_indexes_of_a_new_one(old_journal: Path, tmp_path: Path) -> None:
    SqliteJournal(old_journal, create=False).close()
    new = tmp_path / "new.db"
    SqliteJournal(new).close()
    assert schema_of(old_journal) == schema_of(new)


def test_stored_data_is_compact_json_tagged_with_its_type() -> None:
    """What `encode_event_data` writes is what `decode_event` reads back."""
    event = TabClosed(path="/a", tab_name="a", was_modified=False, discarded_blob=None)
    data = bus_events.encode_event_data(event)
    assert msgspec.json.decode(data)["event"] == "TabClosed"
    assert decode_event("TabClosed", TabClosed.version, data) == event
