"""openDiff end to end: `toolbus serve` over stdio (the raw client, to cancel and to read progress
notifications), a real headless Neovim shared by the module, the user acting through a second
connection, and the journal file read as any SQLite tool would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import JournalReader, NeovimProcess
from tests.rpc_client import RpcError, ServerGone, StdioServer, clean_env, toolbus_argv
from toolbus.adapters.nvim import LUA_MODULE

PROGRESS_INTERVAL = 0.2  # seconds, through $TOOLBUS_PROGRESS_INTERVAL: the real one is 9 s


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("diff")


@pytest.fixture(scope="module")
def nvim(root: Path) -> Iterator[NeovimProcess]:
    process = NeovimProcess(root / "nvim")
    yield process
    process.kill()


def start_server(
    root: Path, nvim: NeovimProcess, nvim_timeout: float = 3, env: dict[str, str] | None = None
) -> StdioServer:
    env = clean_env({"TOOLBUS_PROGRESS_INTERVAL": str(PROGRESS_INTERVAL), **(env or {})})
    argv = toolbus_argv(root / "journal.db", "--nvim-timeout", f"{nvim_timeout:g}", nvim=nvim.address)
    server = StdioServer(argv, env=env)
    server.initialize()
    return server


@pytest.fixture(scope="module")
def server(root: Path, nvim: NeovimProcess) -> Iterator[StdioServer]:
    with start_server(root, nvim) as running:
        yield running


@pytest.fixture(scope="module")
def journal(root: Path) -> JournalReader:
    return JournalReader(root / "journal.db")


@pytest.fixture
def files(tmp_path: Path, nvim: NeovimProcess) -> Path:
    """A folder with a.py, and a Neovim with one tab, one window and no buffers."""
    nvim.command("silent! tabonly! | silent! only! | enew | silent! %bwipeout!")
    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")
    return tmp_path


def wait_until(check: Callable[[], Any], what: str, timeout: float = 5) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)
    return found


def propose(server: StdioServer, path: Path, text: str, tab: str, meta: dict[str, Any] | None = None) -> int:
    arguments = {"old_file_path": str(path), "new_file_path": str(path), "new_file_contents": text, "tab_name": tab}
    params: dict[str, Any] = {"name": "openDiff", "arguments": arguments}
    if meta:
        params["_meta"] = meta
    return server.send_request("tools/call", params)


def shown(nvim: NeovimProcess) -> str:
    """Wait until the proposal's window is current (the user can act); its buffer's name."""

    def name() -> Any:
        return nvim.lua("return vim.api.nvim_buf_get_name(0)")

    return str(wait_until(lambda: "(proposed)" in name() and name(), "the diff view opened"))


def tabs(nvim: NeovimProcess) -> int:
    return int(nvim.lua("return #vim.api.nvim_list_tabpages()"))


def messages(nvim: NeovimProcess) -> str:
    """What Neovim has told the user (:messages)."""
    return str(nvim.lua("return vim.api.nvim_exec2('messages', { output = true }).output"))


def view_buffers(nvim: NeovimProcess) -> int:
    """How many buffers of diff views Neovim holds (listed or not)."""
    names = nvim.lua("return vim.tbl_map(vim.api.nvim_buf_get_name, vim.api.nvim_list_bufs())")
    return sum(name.startswith("toolbus://") for name in names)


def texts(result: dict[str, Any]) -> list[str]:
    return [item["text"] for item in result["content"]]


def toolbus_cli(journal: JournalReader, *args: str) -> str:
    """`toolbus ARGS --journal ...`, its output."""
    argv = [sys.executable, "-m", "toolbus.adapters.cli", *args, "--journal", str(journal.path)]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=clean_env()).stdout


def answers(server: StdioServer, *requests: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The results of `requests` in that order, and the progress notifications met meanwhile
    (read from the raw stream: `wait_for` skips both)."""
    results: dict[int, dict[str, Any]] = {}
    progress = []
    until = time.monotonic() + 10
    while len(results) < len(requests):
        message = json.loads(server._read_line(until))
        if message.get("method") == "notifications/progress":
            progress.append(message["params"])
        elif message.get("id") in requests:
            results[message["id"]] = message["result"]
    return [results[request] for request in requests], progress


def events_of(journal: JournalReader, command_id: int) -> list[dict[str, Any]]:
    return [e for e in journal.events() if e["command_id"] == command_id]


def last_diff(journal: JournalReader, tab: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first openDiff command named `tab`, once finished (in doubt, too), and its events."""

    def finished() -> dict[str, Any] | None:
        named = [c for c in journal.commands("openDiff") if json.loads(c["arguments"])["tab_name"] == tab]
        return named[0] if named and named[0]["finished_at"] else None

    command = wait_until(finished, f"openDiff {tab} finished in the journal")
    return command, events_of(journal, command["id"])


def test_accept_writes_the_proposal_into_the_open_buffer(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    nvim.edit(path)
    request = propose(server, path, "x = 1\ny = 3\n", "a.py diff")
    assert "a.py (proposed)" in shown(nvim) and tabs(nvim) == 2
    assert nvim.lua("return vim.wo.diff") is True
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "x = 1\ny = 3\n"]
    assert path.read_text() == "x = 1\ny = 3\n"
    assert nvim.lines(path) == ["x = 1", "y = 3"] and not nvim.modified(path)
    assert tabs(nvim) == 1
    command, events = last_diff(journal, "a.py diff")
    assert command["status"] == "ok"
    proposed, accepted = events
    assert proposed["type"] == "DiffProposed" and journal.blob(proposed["data"]["proposed_blob"]) == b"x = 1\ny = 3\n"
    assert accepted["type"] == "DiffAccepted" and accepted["data"]["user_edited"] is False
    assert journal.blob(accepted["data"]["replaced_blob"]) == b"x = 1\ny = 2\n"
    audit = toolbus_cli(journal, "audit", "--tool", "openDiff", "--limit", "1")
    assert "diff proposed (12 B)" in audit and "diff accepted: saved 12 B, replaced 12 B" in audit
    assert toolbus_cli(journal, "recover", str(accepted["position"])) == "x = 1\ny = 2\n"
    replay = toolbus_cli(journal, "replay", "editor", "--dry-run", "--from", str(accepted["position"]))
    assert f"@{accepted['position']} accepted diff {path}" in replay


def test_an_accept_neovim_cannot_stage_says_why_in_its_words_not_luas(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    folder = files / "pkg"  # a directory: its buffer cannot take the proposal
    folder.mkdir()
    request = propose(server, folder, "x\n", "a folder")
    shown(nvim)
    nvim.command("write")
    [message] = texts(server.wait_for(request))
    assert message == "Failed to save: Buffer is not 'modifiable'"
    assert folder.is_dir()
    command, _ = last_diff(journal, "a folder")
    assert command["status"] == "failed"


def test_a_fifo_on_either_side_is_refused_before_neovim_reads_it(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    """Reading a FIFO would block Neovim until someone wrote to it: every call after would fail."""
    os.mkfifo(fifo := files / "fifo")
    for old, new in ((fifo, files / "a.py"), (files / "a.py", fifo)):
        arguments = {"old_file_path": str(old), "new_file_path": str(new), "new_file_contents": "x\n", "tab_name": "f"}
        result = server.call_tool("openDiff", arguments)
        assert result["isError"]
        assert texts(result) == [f"openDiff: {fifo} is not a regular file (a fifo). Nothing was opened"]
    assert tabs(nvim) == 1
    assert not server.call_tool("getOpenEditors", {}).get("isError")  # Neovim is free


def test_the_users_edits_to_the_proposal_are_what_is_written(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"  # not open in Neovim: its buffer is loaded to be saved
    request = propose(server, path, "x = 10\n", "edited")
    shown(nvim)
    nvim.lua("vim.api.nvim_buf_set_lines(0, 0, -1, false, {'x = 10', 'z = 0'})")
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "x = 10\nz = 0\n"]
    assert path.read_text() == "x = 10\nz = 0\n"
    _, events = last_diff(journal, "edited")
    assert events[-1]["data"]["user_edited"] is True
    assert journal.blob(events[-1]["data"]["written_blob"]) == b"x = 10\nz = 0\n"


# The lines of the diff view's two sides, left to right; and the proposal's winbar.
SIDES = (
    "return vim.tbl_map(function(w) return vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(w), 0, -1, "
    "false) end, vim.api.nvim_tabpage_list_wins(0))"
)
WINBAR = "return vim.wo[vim.api.nvim_tabpage_list_wins(0)[2]].winbar"


def test_a_crlf_proposal_is_shown_without_carriage_returns_and_written_as_sent(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "dos.txt"  # not open: both sides come from texts, the file's and the proposal
    path.write_bytes(b"one\r\ntwo\r\n")
    request = propose(server, path, "one\r\ntwo\r\nfour\r\n", "crlf")
    shown(nvim)
    assert nvim.lua(SIDES) == [["one", "two"], ["one", "two", "four"]]  # only the new line differs
    assert nvim.lua(WINBAR) == ""  # the same line breaks as the file's
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "one\r\ntwo\r\nfour\r\n"]
    assert path.read_bytes() == b"one\r\ntwo\r\nfour\r\n"
    _, events = last_diff(journal, "crlf")
    assert events[-1]["data"]["user_edited"] is False


def test_lf_lines_proposed_for_a_crlf_file_keep_its_line_breaks(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "dos.txt"
    path.write_bytes(b"a\r\n")
    nvim.edit(path)  # its buffer: 'fileformat' dos
    request = propose(server, path, "a\nb\n", "lf for crlf")
    shown(nvim)
    assert nvim.lua(WINBAR) == ""
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "a\r\nb\r\n"]
    assert path.read_bytes() == b"a\r\nb\r\n"


def test_a_proposal_that_changes_every_line_break_says_so(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    """Line by line the two sides are the same: only the proposal's winbar shows the change."""
    path = files / "unix.txt"
    path.write_bytes(b"a\nb\n")
    request = propose(server, path, "a\r\nb\r\n", "crlf for lf")
    shown(nvim)
    assert nvim.lua(SIDES) == [["a", "b"], ["a", "b"]]
    assert nvim.lua(WINBAR) == " Accepting writes CRLF line breaks: the current text has LF "
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "a\r\nb\r\n"]
    assert path.read_bytes() == b"a\r\nb\r\n"


@pytest.mark.parametrize(
    ("opened", "proposal", "note"),
    [
        (False, "one\ntwo\nthree\n", " Accepting writes LF line breaks: the current text has CR "),
        (True, "one\rtwo\rthree\r", ""),  # Neovim reads it as LF lines holding ^M; its bytes say CR
    ],
)
def test_the_line_break_note_judges_a_file_with_cr_line_breaks_by_its_bytes(
    server: StdioServer, nvim: NeovimProcess, files: Path, opened: bool, proposal: str, note: str
) -> None:
    path = files / "mac.txt"
    path.write_bytes(b"one\rtwo\r")
    if opened:
        nvim.edit(path)
    request = propose(server, path, proposal, "cr file")
    shown(nvim)
    assert nvim.lua(WINBAR) == note
    nvim.command("write")
    assert texts(server.wait_for(request))[0] == "FILE_SAVED"
    assert path.read_bytes() == proposal.encode()


def test_a_crlf_file_read_as_lf_lines_is_judged_by_its_bytes(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "dos.txt"
    path.write_bytes(b"one\r\ntwo\r\n")
    nvim.command(f"edit ++ff=unix {path}")  # as 'fileformats=unix' reads it: lines holding ^M
    request = propose(server, path, "one\ntwo\nthree\n", "crlf as lf")
    shown(nvim)
    assert nvim.lua(WINBAR) == " Accepting writes LF line breaks: the current text has CRLF "
    nvim.command("write")
    assert texts(server.wait_for(request))[0] == "FILE_SAVED"


def test_no_line_break_note_for_a_utf16_crlf_file_kept_crlf(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    """Its bytes on disk show no CRLF (each is \\r\\0\\n\\0): its buffer's 'fileformat' tells."""
    path = files / "wide.txt"
    path.write_bytes("\ufeffone\r\ntwo\r\n".encode("utf-16-le"))
    nvim.edit(path)
    request = propose(server, path, "one\ntwo\nthree\n", "wide")
    shown(nvim)
    assert nvim.lua(WINBAR) == ""
    nvim.command("write")
    assert texts(server.wait_for(request))[0] == "FILE_SAVED"
    assert path.read_bytes() == "\ufeffone\r\ntwo\r\nthree\r\n".encode("utf-16-le")


def test_a_buffer_with_cr_line_breaks_is_shown_line_by_line(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "mac.txt"
    path.write_bytes(b"one\rtwo\r")
    nvim.command(f"edit ++ff=mac {path}")
    request = propose(server, path, "one\ntwo\nthree\n", "lf for cr")
    shown(nvim)
    assert nvim.lua(SIDES) == [["one", "two"], ["one", "two", "three"]]
    assert nvim.lua(WINBAR) == ""
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "one\rtwo\rthree\r"]
    assert path.read_bytes() == b"one\rtwo\rthree\r"


def test_an_accepted_text_in_a_latin1_file_is_answered_as_text_and_written_in_latin1(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "latin.txt"
    path.write_bytes(b"caf\xe9\n")  # Neovim reads it as latin1 ('fileencodings')
    request = propose(server, path, "café!\n", "latin1")
    shown(nvim)
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "café!\n"]
    assert path.read_bytes() == b"caf\xe9!\n"


def test_a_text_the_files_encoding_cannot_hold_is_refused_and_nothing_is_written(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """Vim would write it with each such character replaced, and call the buffer modified."""
    path = files / "latin.txt"
    path.write_bytes(b"caf\xe9\n")
    request = propose(server, path, "café ☕\n", "no latin1 cup")
    shown(nvim)
    nvim.command("write")
    result = server.wait_for(request)
    assert result["isError"] and texts(result) == [
        "Failed to save: line 1 holds a character 'fileencoding' latin1 cannot hold; :set fileencoding=utf-8 keeps it"
    ]
    assert path.read_bytes() == b"caf\xe9\n"
    # The buffer the accept loaded for the file is gone again, and the accepted text is kept.
    assert nvim.lua(f"return vim.fn.bufexists('{path}')") == 0
    command, events = last_diff(journal, "no latin1 cup")
    assert command["status"] == "failed" and events[-1]["type"] == "DiffAcceptFailed"
    assert journal.blob(events[-1]["data"]["final_blob"]) == "café ☕\n".encode()
    history = toolbus_cli(journal, "history", str(path))  # the user decided: the proposal says no more
    assert "diff proposed (10 B)  " in history and "undecided" not in history


def test_an_accept_whose_write_fails_leaves_the_buffer_as_it_was(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "a.py"
    nvim.edit(path)
    nvim.command("setlocal readonly")
    request = propose(server, path, "x = 1\ny = 3\n", "read-only")
    shown(nvim)
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["Failed to save: E45: 'readonly' option is set"]
    assert path.read_text() == "x = 1\ny = 2\n"
    assert nvim.lines(path) == ["x = 1", "y = 2"] and not nvim.modified(path)
    # ...so the next proposal for the file is shown, not refused for unsaved changes.
    request = propose(server, path, "x = 1\ny = 4\n", "again")
    shown(nvim)
    nvim.command("quit")
    assert texts(server.wait_for(request)) == ["DIFF_REJECTED", "again"]


def test_an_accept_the_journal_cannot_record_leaves_the_accepted_text_unsaved_in_neovim(
    root: Path, nvim: NeovimProcess, files: Path
) -> None:
    """Another process holds the journal's write lock as the user accepts: nothing is written, and
    the text they accepted, which they edited (so the journal has it nowhere), waits unsaved in
    the file's buffer instead of going with the view."""
    path = files / "a.py"
    with start_server(root, nvim, env={"TOOLBUS_JOURNAL_TIMEOUT": "0.3"}) as server:
        request = propose(server, path, "x = 2\n", "locked")
        shown(nvim)
        nvim.lua("vim.api.nvim_buf_set_lines(0, 0, -1, false, {'x = 2', 'mine = 1'})")
        with contextlib.closing(sqlite3.connect(root / "journal.db", isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            nvim.command("write")
            answer = server.wait_for(request)
            other.execute("ROLLBACK")
    [text] = texts(answer)
    assert answer["isError"] and "is locked by another process" in text, text
    waits = f"the text the user accepted waits, unsaved, in the buffer of {path} in Neovim"
    assert text.endswith(
        f"{waits}: do not propose it again; once the journal is free, saveDocument (or the user's :w) writes it"
    )
    assert "try again" not in text  # a retry is refused (unsaved changes), and a close_tab would wipe the text
    assert path.read_text() == "x = 1\ny = 2\n"
    assert (nvim.lines(path), nvim.modified(path), view_buffers(nvim)) == (["x = 2", "mine = 1"], True, 0)
    assert "toolbus could not record your accept" in messages(nvim)
    nvim.command(f"bwipeout! {path}")  # the next test's Neovim holds no unsaved buffer


def test_an_accept_the_journal_cannot_record_claims_no_text_a_dropped_connection_took_away(
    root: Path, nvim: NeovimProcess, files: Path
) -> None:
    """While the write-ahead waits for the journal, toolbus's connection drops and Neovim tends
    the view as an orphan, taking the staged text out: the answer then says nothing waits."""
    path = files / "a.py"
    with start_server(root, nvim, env={"TOOLBUS_JOURNAL_TIMEOUT": "2"}) as server:
        request = propose(server, path, "x = 2\n", "dropped")
        shown(nvim)
        with contextlib.closing(sqlite3.connect(root / "journal.db", isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            nvim.command("write")
            staged = "local b = vim.fn.bufnr(...) return b ~= -1 and vim.api.nvim_buf_get_lines(b, 0, -1, false)[1]"
            wait_until(lambda: nvim.lua(staged, str(path)) == "x = 2", "the accepted text staged")
            ours = nvim.call(lambda n: n.channel_id)
            nvim.lua(
                "for _, c in ipairs(vim.api.nvim_list_chans()) do"
                " if c.mode == 'rpc' and c.id ~= ... then vim.fn.chanclose(c.id) end end",
                ours,
            )
            nvim.lua(f"_G[{LUA_MODULE!r}].diff_close_orphans()")
            answer = server.wait_for(request)
            other.execute("ROLLBACK")
    [text] = texts(answer)
    assert answer["isError"] and "waits" not in text and text.endswith("was not saved: it is unchanged"), text
    assert path.read_text() == "x = 1\ny = 2\n"
    assert nvim.lua("return vim.fn.bufexists(...)", str(path)) == 0  # taken out as it was loaded


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-32-be"])
def test_an_accepted_text_in_a_utf16_or_32_file_is_answered_as_text_and_keeps_its_byte_order(
    server: StdioServer, nvim: NeovimProcess, files: Path, codec: str
) -> None:
    path = files / "utf16.txt"
    path.write_bytes("\ufeffold\n".encode(codec))  # Neovim reads it by its byte order mark
    request = propose(server, path, "new\n", "utf16")
    shown(nvim)
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "new\n"]
    assert path.read_bytes() == "\ufeffnew\n".encode(codec)


def test_quitting_the_proposal_rejects_it(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    request = propose(server, path, "nope\n", "rejected")
    shown(nvim)
    nvim.command("quit")
    assert texts(server.wait_for(request)) == ["DIFF_REJECTED", "rejected"]
    assert path.read_text() == "x = 1\ny = 2\n"
    wait_until(lambda: tabs(nvim) == 1, "the view closed")
    command, [_, rejected] = last_diff(journal, "rejected")
    assert command["status"] == "ok" and rejected["type"] == "DiffRejected"
    assert rejected["data"]["by"] == "user" and journal.blob(rejected["data"]["proposed_blob"]) == b"nope\n"
    assert toolbus_cli(journal, "recover", str(rejected["position"])) == "nope\n"
    assert "diff rejected by the user" in toolbus_cli(journal, "history", str(path))
    sql = "SELECT recoverable_blob, recoverable_bytes FROM file_history WHERE position = ?"
    assert journal.rows(sql, rejected["position"]) == [
        {"recoverable_blob": rejected["data"]["proposed_blob"], "recoverable_bytes": len(b"nope\n")}
    ]


def test_toolbus_accept_and_reject_commands_and_bdelete(server: StdioServer, nvim: NeovimProcess, files: Path) -> None:
    path = files / "a.py"
    request = propose(server, path, "accepted\n", "by command")
    shown(nvim)
    nvim.command("wincmd h | ToolbusAccept")  # anywhere in the view's tab page
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "accepted\n"]
    request = propose(server, path, "rejected\n", "by command")
    shown(nvim)
    nvim.command("ToolbusReject")
    assert texts(server.wait_for(request)) == ["DIFF_REJECTED", "by command"]
    request = propose(server, path, "deleted\n", "by :bd")
    shown(nvim)
    nvim.command("bdelete")
    assert texts(server.wait_for(request)) == ["DIFF_REJECTED", "by :bd"]
    assert path.read_text() == "accepted\n"
    wait_until(lambda: tabs(nvim) == 1, "the view closed")


def test_the_user_is_back_in_their_tab_page_once_the_view_closes(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    path = files / "a.py"
    nvim.command("tabnew | tabnew | tabfirst")
    try:
        for action, answer in (("write", "FILE_SAVED"), ("quit", "DIFF_REJECTED")):
            request = propose(server, path, f"{action}\n", action)
            shown(nvim)
            assert nvim.lua("return vim.fn.tabpagenr()") == 2  # the view's, after the user's
            nvim.command(action)
            assert texts(server.wait_for(request))[0] == answer
            wait_until(lambda: tabs(nvim) == 3, "the view closed")
            assert nvim.lua("return vim.fn.tabpagenr()") == 1
    finally:
        nvim.command("tabonly")  # the Neovim is the module's: the tests after this one expect one tab page


def test_a_new_file_is_created_on_accept(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "new" / "b.py"
    request = propose(server, path, "print('hi')\n", "new file")
    shown(nvim)
    assert nvim.lua("return vim.fn.getbufline(vim.fn.winbufnr(1), 1, '$')") == [""]  # the current side: empty
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "print('hi')\n"]
    assert path.read_text() == "print('hi')\n"
    _, events = last_diff(journal, "new file")
    assert events[-1]["type"] == "DiffAccepted" and events[-1]["data"]["replaced_blob"] is None


def test_a_new_file_named_with_a_dollar_is_created_under_that_name(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """`routes/$HOME.tsx` is a name, not an environment variable to expand."""
    path = files / "routes" / "$HOME.tsx"
    request = propose(server, path, "export {}\n", "dollar")
    shown(nvim)
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "export {}\n"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["$HOME.tsx"]
    assert path.read_text() == "export {}\n"
    _, events = last_diff(journal, "dollar")
    assert {event["data"]["path"] for event in events} == {str(path)}


def test_refused_when_the_buffer_has_unsaved_changes(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    nvim.edit(path)
    nvim.set_lines(path, ["typed but not saved"])
    result = server.call_tool("openDiff", json.loads(json.dumps(arguments(path, "other\n", "dirty"))))
    assert result["isError"] and "unsaved changes" in texts(result)[0]
    assert tabs(nvim) == 1 and nvim.lines(path) == ["typed but not saved"]
    command, events = last_diff(journal, "dirty")
    assert command["status"] == "failed" and events == []


def test_a_view_that_fails_to_open_leaves_none_of_its_buffers_behind(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """A plugin's autocmd failing as the tab page opens: the call says so, and the scratch
    buffers made for the view before it are wiped with it."""
    path = files / "a.py"
    nvim.command("autocmd TabNew * ++once throw 'a plugin failed'")
    result = server.call_tool("openDiff", arguments(path, "other\n", "failing"))
    assert result["isError"]
    assert texts(result)[0] == 'openDiff: TabNew Autocommands for "*": a plugin failed. Nothing was opened'
    assert nvim.lua("return #vim.api.nvim_list_bufs()") == 1 and tabs(nvim) == 1
    command, events = last_diff(journal, "failing")
    assert command["status"] == "failed" and events == []


def arguments(path: Path, text: str, tab: str) -> dict[str, str]:
    return {"old_file_path": str(path), "new_file_path": str(path), "new_file_contents": text, "tab_name": tab}


def test_other_calls_go_on_while_a_diff_waits_and_close_all_rejects_it(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    waiting = propose(server, path, "later\n", "waiting", meta={"progressToken": "p1"})
    shown(nvim)
    # Editor calls after it are served (they are in arrival order, but it does not hold them).
    editors = server.send_request("tools/call", {"name": "getOpenEditors", "arguments": {}})
    again = server.send_request("tools/call", {"name": "openDiff", "arguments": arguments(path, "2\n", "waiting")})
    [editors_result, again_result], _ = answers(server, editors, again)
    assert not editors_result.get("isError")
    assert again_result["isError"] and "already waiting" in texts(again_result)[0]
    time.sleep(PROGRESS_INTERVAL * 3)
    closed = server.send_request("tools/call", {"name": "closeAllDiffTabs", "arguments": {}})
    [closed_result, waited], progress = answers(server, closed, waiting)
    assert texts(closed_result) == ["CLOSED_1_DIFF_TABS"]
    assert texts(waited) == ["DIFF_REJECTED", "waiting"]
    # Meanwhile the waiting call told its client it was alive.
    assert len(progress) >= 2 and {p["progressToken"] for p in progress} == {"p1"}
    assert tabs(nvim) == 1 and path.read_text() == "x = 1\ny = 2\n"
    _, events = last_diff(journal, "waiting")
    assert events[-1]["type"] == "DiffRejected" and events[-1]["data"]["by"] == "closeAllDiffTabs"


def test_close_tab_with_the_diffs_name_rejects_it(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    nvim.edit(path)  # a file buffer whose name ends like the tab name: never wiped for it
    request = propose(server, path, "closed\n", "a.py")
    shown(nvim)
    close = server.send_request("tools/call", {"name": "close_tab", "arguments": {"tab_name": "a.py"}})
    [closed, waited], _ = answers(server, close, request)
    assert texts(closed) == ["TAB_CLOSED"] and texts(waited) == ["DIFF_REJECTED", "a.py"]
    assert str(path) in nvim.buffer_names() and tabs(nvim) == 1
    _, events = last_diff(journal, "a.py")
    assert events[-1]["data"]["by"] == "close_tab"
    # Its view gone, the name still closes no file buffer, and the journal says why.
    assert texts(server.call_tool("close_tab", {"tab_name": "a.py"})) == ["TAB_CLOSED"]
    assert str(path) in nvim.buffer_names()
    [skipped] = journal.events("TabCloseSkipped")
    assert (skipped["data"]["tab_name"], skipped["data"]["reason"]) == ("a.py", "diff_closed")
    audit = toolbus_cli(journal, "audit", "--tool", "close_tab", "--limit", "1")
    assert "closed nothing: the name is a diff view's, closed already" in audit
    # That was the clean-up: the name is a file's again.
    assert texts(server.call_tool("close_tab", {"tab_name": "a.py"})) == ["TAB_CLOSED"]
    assert str(path) not in nvim.buffer_names()
    [closed_file] = journal.events("TabClosed")
    assert closed_file["data"]["path"] == str(path)


def test_an_accepted_proposal_never_lands_in_a_plugins_buffer_named_like_the_file(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    path.write_text("the file\n")
    nvim.plugin_buffer(path, ["plugin scratch"])
    request = propose(server, path, "proposal\n", "scratch")
    shown(nvim)
    nvim.command("write")
    result = server.wait_for(request)
    assert result["isError"] and "which is not the file's ('buftype' nofile): wipe it (:bwipeout" in texts(result)[0]
    assert nvim.lines(path) == ["plugin scratch"]
    assert path.read_text() == "the file\n"
    _, events = last_diff(journal, "scratch")
    assert events[-1]["type"] == "DiffAcceptFailed" and journal.blob(events[-1]["data"]["final_blob"]) == b"proposal\n"


def test_a_file_changed_on_disk_since_the_diff_opened_is_a_conflict(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    request = propose(server, path, "proposal\n", "conflict")
    shown(nvim)
    path.write_text("the agent wrote this meanwhile\n")
    nvim.command("write")
    result = server.wait_for(request)
    assert result["isError"] and "changed on disk" in texts(result)[0]
    assert path.read_text() == "the agent wrote this meanwhile\n"
    command, events = last_diff(journal, "conflict")
    assert events[-1]["type"] == "DiffAcceptFailed" and journal.blob(events[-1]["data"]["final_blob"]) == b"proposal\n"
    assert command["status"] == "failed" and command["error"] == texts(result)[0]  # as the caller was told


def test_a_file_written_again_with_the_same_bytes_is_no_conflict(
    server: StdioServer, nvim: NeovimProcess, files: Path
) -> None:
    """A save of the file (or a touch) while the user reads the proposal changes nothing in it."""
    path = files / "a.py"
    nvim.edit(path)
    request = propose(server, path, "x = 1\ny = 3\n", "saved meanwhile")
    shown(nvim)
    saved = server.send_request("tools/call", {"name": "saveDocument", "arguments": {"filePath": str(path)}})
    [save_result], _ = answers(server, saved)
    assert "Document saved successfully" in texts(save_result)[0]
    os.utime(path, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    nvim.command("write")
    assert texts(server.wait_for(request)) == ["FILE_SAVED", "x = 1\ny = 3\n"]
    assert path.read_text() == "x = 1\ny = 3\n" and not nvim.modified(path)


def test_a_cancelled_call_closes_its_view_and_is_journaled_as_cancelled(
    server: StdioServer, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = files / "a.py"
    request = propose(server, path, "cancelled\n", "cancelled")
    shown(nvim)
    server.notify("notifications/cancelled", {"requestId": request, "reason": "the agent moved on"})
    wait_until(lambda: tabs(nvim) == 1, "the view closed")
    command, events = last_diff(journal, "cancelled")
    assert command["status"] == "cancelled" and [e["type"] for e in events] == ["DiffProposed"]
    assert path.read_text() == "x = 1\ny = 2\n"
    history = toolbus_cli(journal, "history", str(path))
    assert "diff proposed (10 B), withdrawn: the call was cancelled before the user decided" in history
    assert not server.call_tool("getOpenEditors", {}, deadline=5).get("isError")  # still serving
    journal.assert_gapless()


# Writes of the file named by the first argument wait in BufWritePre (as for a slow formatter)
# until the test sets `release`, then fail if the second is true; `writing` says one waits. An
# interrupt (<C-c>) ends a wait, not the hold.
HOLD_WRITE = """
local pattern, fail = ...
local group = vim.api.nvim_create_augroup('toolbus_test_hold', { clear = true })
vim.g.writing, vim.g.release = false, false
vim.api.nvim_create_autocmd('BufWritePre', { group = group, pattern = pattern, once = true, callback = function()
  vim.g.writing = true
  while not vim.g.release do
    vim.wait(60000, function() return vim.g.release end)
  end
  if fail then
    error('the hook refused the write')
  end
end })
"""


@contextlib.contextmanager
def held_write(nvim: NeovimProcess, path: Path, *, then_fail: bool = False) -> Iterator[None]:
    nvim.lua(HOLD_WRITE, str(path), then_fail)
    try:
        yield
    finally:
        nvim.lua("vim.g.release = true pcall(vim.api.nvim_del_augroup_by_name, 'toolbus_test_hold')")


def diff_buffers(nvim: NeovimProcess) -> list[str]:
    names = nvim.lua("return vim.tbl_map(vim.api.nvim_buf_get_name, vim.api.nvim_list_bufs())")
    return [name for name in names if name.startswith("toolbus://")]


def test_a_call_cancelled_while_its_accept_is_written_lets_the_write_finish(
    tmp_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    """The user has accepted, and the write waits in a slow BufWritePre when the client cancels:
    the decision is made, so the file is written, the journal says so (not in doubt), and the
    view closes after the write, not under it (which would abort it)."""
    path = files / "a.py"
    nvim.edit(path)
    # A timeout far past the hold: this is about the cancellation, not a write that timed out.
    with held_write(nvim, path), start_server(tmp_path, nvim, nvim_timeout=60) as alone:
        request = propose(alone, path, "x = 1\ny = 3\n", "cancelled while written")
        cancel_while_written(alone, nvim, request)
        # Answered after the cancellation was read: the call has heard it by then.
        assert not alone.call_tool("getOpenEditors", {}).get("isError")
        nvim.lua("vim.g.release = true")
        command, events = last_diff(JournalReader(tmp_path / "journal.db"), "cancelled while written")
        assert (command["status"], [e["type"] for e in events]) == ("ok", ["DiffProposed", "DiffAccepted"])
        wait_until(lambda: tabs(nvim) == 1, "the view closed")
        assert alone.process.stdin is not None
        alone.process.stdin.close()
        with pytest.raises(ServerGone):  # a call its client cancelled is not answered
            alone.wait_for(request)
    assert path.read_text() == "x = 1\ny = 3\n" and not nvim.modified(path)
    assert diff_buffers(nvim) == []


def cancel_while_written(server: StdioServer, nvim: NeovimProcess, request: int) -> None:
    """The user accepts the shown proposal (:w), and the client cancels the call while the
    accepted text is being written (held by `held_write`)."""
    shown(nvim)
    nvim.command("write")
    wait_until(lambda: nvim.lua("return vim.g.writing"), "the accepted text is being written")
    server.notify("notifications/cancelled", {"requestId": request, "reason": "the agent moved on"})


def test_a_cancelled_call_whose_accepted_write_times_out_is_in_doubt_and_closes_its_view_after_the_write(
    tmp_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    """Cancelled while its accept is written, and the write outlasts the Neovim timeout: toolbus
    cannot know whether the file was written, and its journal says so, the call finished despite
    the cancellation. The view it then closes stays until the write is done: closed under it,
    it would abort the write and leave its tab page behind."""
    path = files / "a.py"
    nvim.edit(path)
    told = messages(nvim).count("toolbus stopped")
    with held_write(nvim, path), start_server(tmp_path, nvim, nvim_timeout=1) as alone:
        request = propose(alone, path, "x = 1\ny = 3\n", "timed out after a cancel")
        cancel_while_written(alone, nvim, request)
        # Finished after the view was asked to close (and Neovim answered, holding the write).
        command, events = last_diff(JournalReader(tmp_path / "journal.db"), "timed out after a cancel")
        assert command["status"] == "in_doubt"
        assert [e["type"] for e in events] == ["DiffProposed", "FileWriteInDoubt", "DiffAcceptInDoubt"]
        nvim.lua("vim.g.release = true")
        wait_until(lambda: tabs(nvim) == 1, "the view closed")
    assert path.read_text() == "x = 1\ny = 3\n" and not nvim.modified(path)
    assert diff_buffers(nvim) == []
    assert messages(nvim).count("toolbus stopped") == told  # closed by toolbus, which is still there


def test_an_accept_whose_write_is_in_doubt_keeps_the_text_the_user_accepted(tmp_path: Path) -> None:
    """The user edits the proposal and accepts; the write outlasts the timeout, then Neovim dies
    before it is done. The file never got the text, and the view that held it is gone: the
    journal keeps it, under the file, for `toolbus recover`."""
    nvim = NeovimProcess(tmp_path / "nvim")
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    try:
        nvim.edit(path)
        nvim.lua(HOLD_WRITE, str(path))
        with start_server(tmp_path, nvim, nvim_timeout=1) as alone:
            request = propose(alone, path, "x = 2\n", "in doubt")
            shown(nvim)
            nvim.lua("vim.api.nvim_buf_set_lines(0, 0, -1, false, {'x = 2', 'edited = True'})")
            nvim.command("write")
            result = alone.wait_for(request, deadline=10)
            assert result["isError"] and "outcome is unknown" in texts(result)[0]
            nvim.kill()
    finally:
        nvim.kill()
    assert path.read_text() == "x = 1\n"
    journal = JournalReader(tmp_path / "journal.db")
    command, events = last_diff(journal, "in doubt")
    assert command["status"] == "in_doubt"
    assert [e["type"] for e in events] == ["DiffProposed", "FileWriteInDoubt", "DiffAcceptInDoubt"]
    kept = events[-1]["position"]
    assert toolbus_cli(journal, "recover", str(kept)) == "x = 2\nedited = True\n"
    assert f"@{kept}" in (history := toolbus_cli(journal, "history", str(path)))
    assert "diff accepted, its write in doubt: the accepted text (20 B) is kept" in history
    assert "20 B accepted, write in doubt" in history
    sql = "SELECT recoverable_blob, recoverable_bytes FROM file_history WHERE position = ?"
    assert journal.rows(sql, kept) == [{"recoverable_blob": events[-1]["data"]["final_blob"], "recoverable_bytes": 20}]


def test_neovim_gone_while_waiting_is_an_error(root: Path, tmp_path: Path) -> None:
    nvim = NeovimProcess(tmp_path / "nvim")
    path = tmp_path / "a.py"
    path.write_text("kept\n")
    try:
        with start_server(tmp_path, nvim) as alone:
            request = propose(alone, path, "lost\n", "lost")
            shown(nvim)
            nvim.kill()
            result = alone.wait_for(request, deadline=10)
            assert result["isError"] and "Neovim went away" in texts(result)[0]
    finally:
        nvim.kill()
    assert path.read_text() == "kept\n"
    journal = JournalReader(tmp_path / "journal.db")
    command, events = last_diff(journal, "lost")
    assert command["status"] == "failed" and [e["type"] for e in events] == ["DiffProposed"]
    assert toolbus_cli(journal, "recover", str(events[0]["position"])) == "lost\n"  # as the message says


def test_a_client_that_disconnects_leaves_no_view_and_a_cancelled_call(tmp_path: Path, nvim: NeovimProcess) -> None:
    path = tmp_path / "a.py"
    path.write_text("kept\n")
    with start_server(tmp_path, nvim) as alone:
        propose(alone, path, "gone\n", "disconnected")
        shown(nvim)
    wait_until(lambda: tabs(nvim) == 1, "the view closed")
    command, events = last_diff(JournalReader(tmp_path / "journal.db"), "disconnected")
    assert command["status"] == "cancelled" and [e["type"] for e in events] == ["DiffProposed"]
    assert path.read_text() == "kept\n"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the agent's terminal closed
def test_a_server_stopped_while_a_diff_waits_closes_the_view_and_cancels_the_call(
    tmp_path: Path, nvim: NeovimProcess, stop: signal.Signals
) -> None:
    path = tmp_path / "a.py"
    path.write_text("kept\n")
    with start_server(tmp_path, nvim) as alone:
        waiting = propose(alone, path, "stopped\n", "stopped")
        shown(nvim)
        alone.process.send_signal(stop)
        with pytest.raises(RpcError, match="Connection closed"):  # answered all the same
            alone.wait_for(waiting)
        assert alone.process.wait(timeout=10) == 0
    assert tabs(nvim) == 1
    command, events = last_diff(JournalReader(tmp_path / "journal.db"), "stopped")
    assert command["status"] == "cancelled" and [e["type"] for e in events] == ["DiffProposed"]
    assert path.read_text() == "kept\n"


@pytest.mark.parametrize("then_fail", [False, True], ids=["written", "refused-by-a-hook"])
def test_a_server_stopped_while_an_accepted_diff_is_written_answers_it_once_written(
    tmp_path: Path, nvim: NeovimProcess, files: Path, then_fail: bool
) -> None:
    """The user has accepted and the write waits in a slow BufWritePre when toolbus is told to
    stop: the write is not cut short, and the call gets its outcome, once, before toolbus exits."""
    path, errors = files / "a.py", tmp_path / "stderr"
    nvim.edit(path)
    argv = toolbus_argv(tmp_path / "journal.db", "--nvim-timeout", "60", "-v", nvim=nvim.address)
    with held_write(nvim, path, then_fail=then_fail), StdioServer(argv, stderr=errors) as stopped:
        stopped.initialize()
        request = propose(stopped, path, "x = 1\ny = 3\n", "stopped while written")
        shown(nvim)
        nvim.command("write")
        wait_until(lambda: nvim.lua("return vim.g.writing"), "the accepted text is being written")
        stopped.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping on SIGTERM" in errors.read_text(), "toolbus began to stop")
        nvim.lua("vim.g.release = true")
        answer = texts(stopped.wait_for(request))
        with pytest.raises(ServerGone):  # and no second answer (wait_for would return it)
            stopped.wait_for(request)
        assert stopped.process.wait(timeout=10) == 0, errors.read_text()
    command, events = last_diff(JournalReader(tmp_path / "journal.db"), "stopped while written")
    if then_fail:
        assert "the hook refused the write" in answer[0]
        assert (command["status"], [e["type"] for e in events]) == ("failed", ["DiffProposed", "DiffAcceptFailed"])
    else:
        assert answer == ["FILE_SAVED", "x = 1\ny = 3\n"]
        assert (command["status"], [e["type"] for e in events]) == ("ok", ["DiffProposed", "DiffAccepted"])
        assert path.read_text() == "x = 1\ny = 3\n"


def test_a_second_stop_signal_does_not_cut_short_the_end_of_a_diff_on_a_busy_neovim(
    tmp_path: Path, nvim: NeovimProcess
) -> None:
    """Told to stop while Neovim is busy, and told again while it waits on it: the call still
    ends `cancelled` and toolbus exits cleanly; the view closes once Neovim is free."""
    path, errors = tmp_path / "a.py", tmp_path / "stderr"
    path.write_text("kept\n")
    argv = toolbus_argv(tmp_path / "journal.db", "--nvim-timeout", "1", "-v", nvim=nvim.address)
    with StdioServer(argv, stderr=errors) as stopped:
        stopped.initialize()
        propose(stopped, path, "stopped\n", "stopped")
        shown(nvim)
        nvim.occupy()
        stopped.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping on SIGTERM" in errors.read_text(), "toolbus began to stop")
        stopped.process.send_signal(signal.SIGTERM)
        assert stopped.process.wait(timeout=30) == 0
    command, events = last_diff(JournalReader(tmp_path / "journal.db"), "stopped")
    assert command["status"] == "cancelled" and [e["type"] for e in events] == ["DiffProposed"]
    nvim.call(lambda n: n.input("<C-c>"))  # the user ends what kept Neovim busy
    wait_until(lambda: tabs(nvim) == 1, "the view closed", timeout=10)
    assert path.read_text() == "kept\n"


def test_the_views_of_a_killed_toolbus_close_but_the_users_edits_stay(tmp_path: Path, nvim: NeovimProcess) -> None:
    untouched, edited = tmp_path / "a.py", tmp_path / "b.py"
    for path in (untouched, edited):
        path.write_text("kept\n")
    with start_server(tmp_path, nvim) as killed:
        propose(killed, untouched, "orphan\n", "a")
        shown(nvim)
        propose(killed, edited, "orphan\n", "b")
        wait_until(lambda: shown(nvim).endswith("b.py (proposed)"), "the second view opened")
        nvim.lua("vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'mine' })")
        killed.process.kill()  # SIGKILL: it cannot close its views
        killed.process.wait(timeout=10)
    wait_until(lambda: tabs(nvim) == 2, "the killed toolbus's unedited view closed")
    said = messages(nvim)
    assert "stopped waiting for your decision on a.py: the diff is closed, nothing was written" in said
    assert "stopped waiting for your decision on b.py: nothing was written; your edits stay in its tab" in said
    assert nvim.lua("return { vim.bo.modified, vim.api.nvim_buf_get_lines(0, 0, -1, false) }") == [True, ["mine"]]
    copy = tmp_path / "mine.py"
    nvim.command(f"write {copy}")  # the edits saved elsewhere: a copy, no decision
    assert copy.read_text() == "mine\n" and nvim.lua("return vim.bo.modified") is True
    nvim.command("write")  # accepting it now reaches nobody, and says so
    assert "no longer waiting for this diff: nothing was written" in messages(nvim)
    with start_server(tmp_path, nvim) as later:  # counts only the diffs that waited on it
        assert texts(later.call_tool("closeAllDiffTabs", {})) == ["CLOSED_0_DIFF_TABS"]
        later.call_tool("getOpenEditors", {})  # Neovim has run what closeAllDiffTabs sent before it
        assert nvim.lua("return vim.api.nvim_buf_get_lines(0, 0, -1, false)") == ["mine"]  # nor does it take these
    nvim.command("quit!")  # the user drops them: the whole view goes, not just their window
    wait_until(lambda: view_buffers(nvim) == 0, "the view's buffers gone")
    assert tabs(nvim) == 1
    assert untouched.read_text() == edited.read_text() == "kept\n"


# Kills toolbus (pid `...`) and, before Neovim has read that its connection closed, accepts the
# proposal of the current window with :w: the decision goes to a channel nobody reads.
KILL_THEN_ACCEPT = """
local pid = ...
vim.uv.kill(pid, 'sigkill')
local stat, deadline = nil, vim.uv.hrtime() + 10e9
repeat
  vim.uv.sleep(10)
  local file = io.open('/proc/' .. pid .. '/stat')
  stat = file and file:read('*a') or ''
  if file then file:close() end
until stat == '' or stat:match('^%d+ %b() Z') or vim.uv.hrtime() > deadline
vim.cmd('write')
"""


def test_an_accept_no_toolbus_heard_is_no_decision_and_keeps_the_users_edits(tmp_path: Path) -> None:
    nvim = NeovimProcess(tmp_path / "nvim")  # its own: the view it keeps would be in the others' way
    path = tmp_path / "a.py"
    path.write_text("kept\n")
    try:
        with start_server(tmp_path, nvim) as killed:
            propose(killed, path, "proposed\n", "unheard")
            shown(nvim)
            nvim.lua("vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'mine' })")
            nvim.lua(KILL_THEN_ACCEPT, killed.pid)
            killed.process.wait(timeout=10)
        said = "toolbus stopped waiting for your decision on a.py: nothing was written; your edits stay in its tab"
        wait_until(lambda: said in messages(nvim), said)
        assert "you accepted" not in messages(nvim)
        assert nvim.lua("return { vim.bo.modified, vim.api.nvim_buf_get_lines(0, 0, -1, false) }") == [True, ["mine"]]
        assert tabs(nvim) == 2
    finally:
        nvim.kill()
    assert path.read_text() == "kept\n"


def test_an_accepted_view_whose_toolbus_died_during_its_write_is_written_closed_and_said_once(
    tmp_path: Path, nvim: NeovimProcess
) -> None:
    path = tmp_path / "a.py"
    path.write_text("x = 1\n")
    with held_write(nvim, path), start_server(tmp_path, nvim) as killed:
        propose(killed, path, "x = 2\n", "held")
        shown(nvim)
        nvim.command("write")  # accept: toolbus writes it, and the write is held
        wait_until(lambda: nvim.lua("return vim.g.writing"), "toolbus's write began")
        killed.process.kill()
        killed.process.wait(timeout=10)
    wait_until(lambda: tabs(nvim) == 1, "the view closed once written")
    assert path.read_text() == "x = 2\n"
    said = messages(nvim)
    assert said.count("toolbus stopped while applying the change to a.py you accepted: check the file") == 1


def test_the_diffs_whose_connection_a_timeout_dropped_end_and_an_edited_view_stays(tmp_path: Path) -> None:
    """Another call times out and toolbus drops its connection, with it the decisions it waited
    for: each call ends, nothing written; an unedited view closes, through a new connection, and
    one whose proposal the user edited stays open, edits and all."""
    nvim = NeovimProcess(tmp_path / "nvim")  # its own: the view it keeps would be in the others' way
    path, edited, blocking = tmp_path / "a.py", tmp_path / "c.py", tmp_path / "b.py"
    for kept in (path, edited):
        kept.write_text("kept\n")
    blocking.write_text("b\n")
    try:
        with start_server(tmp_path, nvim) as alone:
            nvim.edit(blocking)
            nvim.set_lines(blocking, ["changed"])
            nvim.command("autocmd BufWritePre b.py call input('a prompt inside the save> ')")
            request = propose(alone, path, "never\n", "dropped")
            shown(nvim)
            mine = propose(alone, edited, "proposed\n", "edited")
            wait_until(lambda: shown(nvim).endswith("c.py (proposed)"), "the second view opened")
            nvim.lua("vim.api.nvim_buf_set_lines(0, 0, -1, false, { 'mine' })")
            save = alone.send_request("tools/call", {"name": "saveDocument", "arguments": {"filePath": str(blocking)}})
            assert alone.wait_for(save, deadline=10)["isError"]  # timed out: toolbus dropped the connection
            for result in alone.wait_for_all([request, mine], deadline=10):
                assert result["isError"] and "nothing was written" in texts(result)[0]
                assert "stays open if the user edited the proposal" in texts(result)[0]
            wait_until(lambda: tabs(nvim) == 2, "the unedited view closed through a new connection", timeout=10)
            said = "toolbus stopped waiting for your decision on c.py: nothing was written; your edits stay in its tab"
            wait_until(lambda: said in messages(nvim), said)
        assert shown(nvim).endswith("c.py (proposed)")
        assert nvim.lua("return { vim.bo.modified, vim.api.nvim_buf_get_lines(0, 0, -1, false) }") == [True, ["mine"]]
    finally:
        nvim.kill()
    assert path.read_text() == edited.read_text() == "kept\n"
    command, events = last_diff(JournalReader(tmp_path / "journal.db"), "dropped")
    assert command["status"] == "failed" and [e["type"] for e in events] == ["DiffProposed"]
