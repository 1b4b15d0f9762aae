"""`toolbus history` and `toolbus recover`: a save that replaced text and a close that discarded
unsaved text, both recorded by real tool calls, told and given back — and written back with
`--apply`, itself journaled."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from tests.conftest import JournalReader, NeovimProcess, json_of, text_of, toolbus
from tests.faults_helpers import deny_writes
from tests.journal_contract import saved
from tests.journal_helpers import EditorSession, OutcomesFail, cli, record_editor_session
from toolbus.adapters.bootstrap import Services
from toolbus.adapters.files import LocalFiles
from toolbus.adapters.nvim import NvimEditor
from toolbus.bus import Bus, Caller, CommandRecord, Fault, JournalUnavailable, JournalWriter, RestoreFile, blob_hash
from toolbus.handlers import HANDLERS, Files
from toolbus.handlers.restore import Restored
from toolbus.journal import SqliteJournal
from toolbus.journal.sqlite import JournalTexts
from toolbus.journal.sqlite.memory import SqliteMemoryStore


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EditorSession]:
    recorded = record_editor_session(tmp_path_factory.mktemp("history"))
    recorded.nvim.kill()
    yield recorded


@pytest.fixture
def live_session(tmp_path: Path) -> Iterator[EditorSession]:
    """A session whose Neovim is still running, for tests that change things."""
    recorded = record_editor_session(tmp_path / "live")
    yield recorded
    recorded.nvim.kill()


# --- history -----------------------------------------------------------------------------


def test_history_tells_each_save_newest_first(session: EditorSession) -> None:
    run = cli("history", session.files["a.txt"], "--journal", session.journal)
    assert run.code == 0, run.err
    title, header, newest, oldest, *hint = run.out.splitlines()
    assert title == f"{os.path.realpath(session.files['a.txt'])}: 2 events on {socket.gethostname()}, newest first"
    assert header.split()[:4] == ["EVENT", "TIME", "(UTC)", "BY"]
    later, first = session.position("DocumentSaved", "a.txt"), 1
    assert newest.startswith(f"@{later} ") and "reviewer" in newest
    assert "saved 25 B, replaced 25 B, file had changed on disk (reloaded first)" in newest
    assert oldest.startswith(f"@{first} ") and "writer" in oldest
    assert "saved 8 B, replaced 8 B" in oldest and "8 B replaced" in oldest
    assert "toolbus recover EVENT" in "\n".join(hint)


def test_history_says_when_its_limit_left_events_out(session: EditorSession) -> None:
    path, here = os.path.realpath(session.files["a.txt"]), socket.gethostname()
    newest = cli("history", path, "--limit", "1", "--journal", session.journal).out.splitlines()
    assert newest[0] == f"{path}: the newest 1 event on {here} (--limit 0 for all)" and len(newest) == 2 + 1 + 2
    assert newest[2].startswith(f"@{session.position('DocumentSaved', 'a.txt')} ")
    whole = cli("history", path, "--limit", "2", "--journal", session.journal).out.splitlines()
    assert whole[0] == f"{path}: 2 events on {here}, newest first"


def test_history_tells_a_close_that_discarded_unsaved_text(session: EditorSession) -> None:
    run = cli("history", session.files["b.txt"], "--journal", session.journal)
    assert run.code == 0, run.err
    [row] = run.out.splitlines()[2:3]
    assert "closed, discarded 14 B unsaved" in row and "14 B unsaved, discarded" in row


def test_history_json_lines(session: EditorSession) -> None:
    run = cli("history", session.files["c.txt"], "--journal", session.journal, "--json")
    assert run.code == 0, run.err
    saved, refused = run.json_lines()
    assert set(saved) == {"event", "tool", "status", "agent", "session_id", "host"}
    assert saved["event"]["type"] == "DocumentSaved" and saved["agent"] == "reviewer"
    assert saved["host"] == socket.gethostname()
    assert saved["event"]["data"]["disk_changed"] is False
    assert refused["event"]["type"] == "DocumentSaveRefused"
    assert refused["event"]["data"]["reason"] == "not_open"


def test_history_and_audit_of_an_absolute_path_need_no_current_directory(
    session: EditorSession, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    path, journal = str(session.files["a.txt"]), str(session.journal.resolve())

    def in_a_deleted_directory(*args: str) -> subprocess.CompletedProcess[str]:
        script = f'cd "{gone}" && rmdir "{gone}" && exec "$0" -m toolbus.adapters.cli "$@"'
        return subprocess.run(["sh", "-c", script, sys.executable, *args], capture_output=True, text=True, timeout=60)

    history = in_a_deleted_directory("history", path, "--journal", journal)
    assert history.returncode == 0 and history.stdout.startswith(f"{os.path.realpath(path)}: 2 events"), history.stderr
    gone.mkdir()
    audit = in_a_deleted_directory("audit", "--path", path, "--journal", journal)
    assert audit.returncode == 0 and len(audit.stdout.splitlines()) == 3, audit.stderr


def test_history_of_a_file_never_touched(session: EditorSession) -> None:
    run = cli("history", session.root / "nothing.txt", "--journal", session.journal)
    assert (run.code, run.out) == (0, "")
    assert "no saves or closes" in run.err


# --- one path on two machines: two files ---------------------------------------------------


async def save_elsewhere(journal: Path, path: str, text: bytes, replaced: bytes | None = None) -> None:
    """A save of `path` on another machine, as a team's shared journal holds it."""
    writer = SqliteJournal(journal, create=False)
    event, blobs = saved(path, replaced, text)
    caller = Caller(agent="colleague", host="other-machine")
    call = CommandRecord(tool="saveDocument", arguments={"filePath": path}, caller=caller, received_ns=time.time_ns())
    try:
        await writer.finish(call, None, "ok", events=[event], blobs=blobs)
    finally:
        writer.close()


def test_a_path_an_agent_named_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    """Not only in tables: replay's steps, recover's lines and every error quote paths too."""
    journal = tmp_path / "journal.db"
    SqliteJournal(journal).close()
    path = str(tmp_path / "x\x1b[2J\x1b]0;owned\x07.txt")
    anyio.run(save_elsewhere, journal, path, b"theirs\n", b"before\n")
    escaped = str(tmp_path / "x\\x1b[2J\\x1b]0;owned\\x07.txt")
    replay = cli("replay", "editor", "--dry-run", "--all-hosts", "--journal", journal)
    assert replay.out.splitlines()[0] == f"would @1 save {escaped}: write 7 bytes"
    printed = cli("recover", "1", "--journal", journal)
    assert printed.raw == b"before\n" and f"(event @1, {escaped})" in printed.err
    applied = cli("recover", "1", "--apply", "--journal", journal)
    assert applied.code == 2 and f"writes this machine's {escaped}:" in applied.err
    for run in (replay, printed, applied):
        assert "\x1b" not in run.out + run.err and "\x07" not in run.out + run.err


def test_serve_records_this_machine_and_history_keeps_to_it(
    tmp_path: Path, nvim: NeovimProcess, journal_path: Path
) -> None:
    here, journal = socket.gethostname(), journal_path
    (tmp_path / "notes.txt").write_text("one\n")
    path = os.path.realpath(tmp_path / "notes.txt")

    async def save_here() -> None:
        with anyio.fail_after(60):
            async with toolbus(journal, nvim.address) as client:
                nvim.edit(path)
                nvim.set_lines(path, ["two"])
                assert json_of(await client.call_tool("saveDocument", {"filePath": path}))["saved"]

    anyio.run(save_here)
    assert [row["host"] for row in JournalReader(journal).commands()] == [here]
    anyio.run(save_elsewhere, journal, path, b"theirs\n")
    mine, theirs = (row["position"] for row in JournalReader(journal).events("DocumentSaved"))

    def history(*args: str) -> list[int]:
        run = cli("history", path, "--json", "--journal", journal, *args)
        assert run.code == 0, run.err
        return [line["event"]["position"] for line in run.json_lines()]

    assert history() == [mine]
    assert history("--host", "other-machine") == [theirs]
    assert history("--all-hosts") == [theirs, mine]
    title, header, row = cli("history", path, "--journal", journal).out.splitlines()[:3]
    assert title == f"{path}: 1 event on {here}, newest first" and row.startswith(f"@{mine} ")
    assert "HOST" not in header
    _, header, *rows = cli("history", path, "--all-hosts", "--journal", journal).out.splitlines()
    assert header.split()[:4] == ["EVENT", "TIME", "(UTC)", "HOST"]
    assert rows[0].split()[3] == "other-machine" and rows[1].split()[3] == here

    def audited(*args: str) -> list[str]:
        run = cli("audit", "--json", "--path", path, "--journal", journal, *args)
        assert run.code == 0, run.err
        return [line["host"] for line in run.json_lines()]

    assert audited() == [here]
    assert audited("--host", "other-machine") == ["other-machine"]
    assert audited("--all-hosts") == ["other-machine", here]
    table = cli("audit", "--path", path, "--all-hosts", "--journal", journal).out.splitlines()
    assert table[0].split()[:3] == ["TIME", "(UTC)", "HOST"] and "other-machine" in table[1]

    def replayed(*args: str) -> list[str]:
        run = cli("replay", "editor", "--dry-run", "--journal", journal, *args)
        assert run.code == 0, run.err
        return run.out.splitlines()[:-1]

    assert replayed() == [f"would @{mine} save {path}: write 4 bytes"]
    assert replayed("--host", "other-machine") == [f"would @{theirs} save {path}: write 7 bytes"]
    assert len(replayed("--all-hosts")) == 2
    nowhere = cli("replay", "editor", "--dry-run", "--host", "nowhere", "--journal", journal)
    assert (nowhere.code, nowhere.out) == (0, "")
    assert nowhere.err == "0 steps on nowhere; 2 on other machines (--host NAME or --all-hosts)\n"
    assert cli("history", path, "--host", "x", "--all-hosts", "--journal", journal).code == 2


# --- recover: printing -------------------------------------------------------------------


def test_recover_prints_the_text_a_save_replaced(session: EditorSession) -> None:
    run = cli("recover", "1", "--journal", session.journal)
    assert run.code == 0, run.err
    assert run.raw == b"alpha 1\n"
    assert "the text on disk that the save replaced" in run.err


def test_recover_prints_the_text_a_close_discarded(session: EditorSession) -> None:
    position = session.position("TabClosed", "b.txt")
    run = cli("recover", f"@{position}", "--journal", session.journal)
    assert run.code == 0, run.err
    assert run.raw == b"bravo unsaved\n"
    assert "the unsaved text that the close discarded" in run.err


def test_recover_by_event_id(session: EditorSession) -> None:
    [row] = session.reader.events("TabClosed")
    run = cli("recover", row["event_id"], "--journal", session.journal)
    assert (run.code, run.raw) == (0, b"bravo unsaved\n")


def test_recover_to_a_file(session: EditorSession, tmp_path: Path) -> None:
    out = tmp_path / "recovered.txt"
    run = cli("recover", "1", "-o", out, "--journal", session.journal)
    assert (run.code, run.out) == (0, "")
    assert out.read_bytes() == b"alpha 1\n"
    home = cli("recover", "1", "-o", "~/recovered.txt", "--journal", session.journal, env={"HOME": str(tmp_path / "h")})
    assert home.code == 2 and home.err.startswith(f"toolbus recover: -o: {tmp_path / 'h'} does not exist"), home.err
    (tmp_path / "h").mkdir()
    home = cli("recover", "1", "-o", "~/recovered.txt", "--journal", session.journal, env={"HOME": str(tmp_path / "h")})
    assert home.code == 0 and (tmp_path / "h" / "recovered.txt").read_bytes() == b"alpha 1\n", home.err


@pytest.mark.parametrize(
    ("output", "said"),
    [
        ("", "-o: expected a file's name, got '' (leave -o out to print the text)"),  # printed it
        ("newdir/", "-o: newdir/ is a directory: name a file"),  # wrote a file named newdir
    ],
)
def test_recover_refuses_an_output_that_names_no_file(session: EditorSession, output: str, said: str) -> None:
    run = cli("recover", "1", "-o", output, "--journal", session.journal, cwd=session.journal.parent)
    assert (run.code, run.out, run.err) == (2, "", f"toolbus recover: {said}\n")
    assert not (session.journal.parent / "newdir").exists()


def test_recover_of_an_event_without_text_says_why(session: EditorSession) -> None:
    [refused] = session.reader.events("DocumentSaveRefused")
    run = cli("recover", str(refused["position"]), "--journal", session.journal)
    assert run.code == 2 and run.out == ""
    assert run.err == (
        f"toolbus recover: event @{refused['position']} (DocumentSaveRefused) holds no recoverable text: "
        "only saves, closes, restores and diff decisions do\n"
    )


# --- recover --apply ---------------------------------------------------------------------


def test_apply_restores_a_discarded_close_and_journals_it(live_session: EditorSession) -> None:
    s = live_session
    b = s.files["b.txt"]
    b.chmod(0o640)
    assert b.read_text() == "bravo\n"  # the close threw the unsaved text away
    closed = s.position("TabClosed", "b.txt")

    run = cli("recover", str(closed), "--apply", "--journal", s.journal, "--agent", "rescuer")
    assert run.code == 0, run.err
    assert b.read_text() == "bravo unsaved\n"
    assert stat.S_IMODE(b.stat().st_mode) == 0o640

    [command] = s.reader.commands("recover")
    [restored] = s.reader.events("FileRestored")
    assert command["status"] == "ok" and command["agent"] == "rescuer"
    assert restored["command_id"] == command["id"]
    assert restored["data"]["from_position"] == closed
    assert restored["data"]["path"] == os.path.realpath(b)
    assert s.reader.blob(restored["data"]["written_blob"]) == b"bravo unsaved\n"
    assert s.reader.blob(restored["data"]["replaced_blob"]) == b"bravo\n"
    assert f"journaled as event @{restored['position']}" in run.out
    s.reader.assert_gapless()

    # the restore is in the file's story and the audit, and can itself be undone
    history = cli("history", b, "--journal", s.journal).out.splitlines()
    assert history[2].startswith(f"@{restored['position']} ") and f"from @{closed}" in history[2]
    audited = cli("audit", "--journal", s.journal, "--tool", "recover", "--json").json_lines()
    assert [line["events"][0]["type"] for line in audited] == ["FileRestored"]
    undo = cli("recover", str(restored["position"]), "--apply", "--journal", s.journal)
    assert undo.code == 0, undo.err
    assert b.read_text() == "bravo\n"


def test_apply_restores_replaced_text_and_neovim_keeps_it(live_session: EditorSession) -> None:
    s = live_session
    a = s.files["a.txt"]
    run = cli("recover", "1", "--apply", "--journal", s.journal)
    assert run.code == 0, run.err
    assert a.read_text() == "alpha 1\n"

    async def save_again() -> None:
        async with toolbus(s.journal, s.nvim.address) as client:
            reply = json_of(await client.call_tool("saveDocument", {"filePath": str(a)}))
            assert reply["saved"]

    anyio.run(save_again)  # Neovim had the old text, unmodified: it reloads the restored file
    assert a.read_text() == "alpha 1\n"
    assert s.nvim.lines(a) == ["alpha 1"]
    [*_, last] = s.reader.events("DocumentSaved")
    assert last["data"]["disk_changed"] is True


def test_apply_of_another_machines_event_is_refused(live_session: EditorSession) -> None:
    """One path on two machines is two files: another machine's text is printed, not applied."""
    s = live_session
    a = s.files["a.txt"]
    before = a.read_bytes()
    with sqlite3.connect(s.journal) as conn:
        conn.execute(
            "UPDATE commands SET host = 'otherbox' WHERE id = (SELECT command_id FROM events WHERE position = 1)"
        )
    run = cli("recover", "1", "--apply", "--journal", s.journal)
    assert run.code == 2
    assert run.err == (
        f"toolbus recover: event @1 happened on otherbox, and --apply writes this machine's {os.path.realpath(a)}:"
        " print the text (or -o FILE) and take it there\n"
    )
    assert a.read_bytes() == before and s.reader.commands("recover") == []
    assert cli("recover", "1", "--journal", s.journal).out == "alpha 1\n"


def test_apply_to_a_path_that_cannot_be_written_fails_and_journals_why(live_session: EditorSession) -> None:
    s = live_session
    a = s.files["a.txt"]
    a.unlink()
    a.mkdir()  # a directory where the file was: no user, not even root, may write it as a file
    run = cli("recover", "1", "--apply", "--journal", s.journal)
    # 1, not 2 (bad input, nothing changed): it tried, and the journal says how that went
    assert run.code == 1 and run.err.startswith(f"toolbus recover: cannot write {os.path.realpath(a)}")
    [command] = s.reader.commands("recover")
    assert command["status"] == "failed" and "cannot write" in command["error"]
    assert command["host"] == socket.gethostname()  # the machine whose file it was
    assert s.reader.events("FileRestored") == []
    assert a.is_dir() and list(a.iterdir()) == []
    a.rmdir()
    os.mkfifo(a)  # a FIFO: reading what it holds before the write would wait for a writer
    run = cli("recover", "1", "--apply", "--journal", s.journal)
    assert run.code == 1 and run.err.startswith(f"toolbus recover: cannot write {os.path.realpath(a)}")
    assert "not a regular file" in run.err
    assert stat.S_ISFIFO(a.stat().st_mode)
    run = cli("audit", "--journal", a)  # nor is a FIFO read as a journal
    assert run.code == 2 and run.err.strip() == f"toolbus audit: not a toolbus journal: {a} is not a regular file"


# --- recover --apply is a bus command, and only the command line's ----------------------

RECORDED = b"recorded\n"


async def restore_in_process(
    journal_path: Path,
    target: Path,
    files: Files,
    wrap: Callable[[SqliteJournal], JournalWriter] = lambda journal: journal,
) -> Restored:
    """`recover --apply` of RECORDED to `target`, through a bus wired as the command line's."""
    store = SqliteJournal(journal_path)
    try:
        await store.keep_blobs({blob_hash(RECORDED): RECORDED})
        services = Services(
            editor=NvimEditor(lambda: None),
            memory=SqliteMemoryStore(store),
            files=files,
            texts=JournalTexts(store),
        )
        bus = Bus({RestoreFile.tool: RestoreFile}, HANDLERS, wrap(store), services)
        arguments = {"path": str(target), "blob": blob_hash(RECORDED), "event": 1}
        with anyio.fail_after(30):
            reply = await bus.handle("recover", arguments, Caller(agent="rescuer"))
    finally:
        store.close()
    assert isinstance(reply, Restored)
    return reply


@pytest.mark.anyio
async def test_apply_keeps_the_text_it_replaces_before_writing(tmp_path: Path) -> None:
    target, journal = tmp_path / "notes.txt", tmp_path / "journal.db"
    target.write_bytes(b"current\n")
    reader = JournalReader(journal)

    class Checked(LocalFiles):
        async def replace(self, path: str, content: bytes) -> bytes | None:
            assert reader.blob(blob_hash(b"current\n")) == b"current\n"  # durable before the write
            return await super().replace(path, content)

    reply = await restore_in_process(journal, target, Checked())
    assert target.read_bytes() == RECORDED
    [restored] = reader.events("FileRestored")
    assert reply.position == restored["position"]
    assert restored["data"]["replaced_blob"] == blob_hash(b"current\n")


@pytest.mark.anyio
async def test_apply_through_a_symlink_replaces_the_file_it_leads_to(tmp_path: Path) -> None:
    real, link = tmp_path / "real.txt", tmp_path / "notes.txt"
    real.write_bytes(b"current\n")
    link.symlink_to(real)
    await restore_in_process(tmp_path / "journal.db", link, LocalFiles())
    assert link.is_symlink() and real.read_bytes() == RECORDED


@pytest.mark.anyio
async def test_apply_leaves_a_file_it_may_not_write_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even though a rename in a writable directory would get past the file's permissions
    (root's writes are allowed, so the answer of `os.access` is played here)."""
    target = tmp_path / "notes.txt"
    target.write_bytes(b"current\n")
    target.chmod(0o444)
    deny_writes(monkeypatch)
    with pytest.raises(Fault, match="Permission denied"):
        await restore_in_process(tmp_path / "journal.db", target, LocalFiles())
    assert target.read_bytes() == b"current\n"
    [command] = JournalReader(tmp_path / "journal.db").commands("recover")
    assert command["status"] == "failed" and command["error"] == f"cannot write {target}: Permission denied"


@pytest.mark.anyio
async def test_apply_whose_outcome_cannot_be_journaled_stays_in_doubt_and_loses_nothing(
    tmp_path: Path,
) -> None:
    target, journal = tmp_path / "notes.txt", tmp_path / "journal.db"
    target.write_bytes(b"current\n")
    with pytest.raises(JournalUnavailable):
        await restore_in_process(journal, target, LocalFiles(), OutcomesFail)
    assert target.read_bytes() == RECORDED  # the write happened; the journal could not say so
    reader = JournalReader(journal)
    [command] = reader.commands("recover")
    assert command["status"] == "in_doubt"
    assert reader.blob(blob_hash(b"current\n")) == b"current\n"  # what it overwrote is kept
    assert reader.events() == []
    # ...and the row says what it may have done, for the next server should this process die now.
    [doubt] = [event for _, _, event in json.loads(command["pending"])["events"]]
    assert doubt == {"event": "FileWriteInDoubt", "path": str(target), "replaced_blob": blob_hash(b"current\n")}


@pytest.mark.anyio
async def test_an_agent_can_neither_see_nor_call_recover(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    with anyio.fail_after(60):
        async with toolbus(tmp_path / "journal.db", None) as client:
            assert "recover" not in {tool.name for tool in (await client.list_tools()).tools}
            arguments = {"path": str(target), "blob": "0" * 64, "event": 1}
            result = await client.call_tool("recover", arguments)
    assert result.is_error and "unknown tool" in text_of(result)
    assert target.read_text() == "mine\n"
