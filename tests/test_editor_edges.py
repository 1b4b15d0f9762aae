"""Editor edge cases: exact path matching, disk changes under a buffer, conflicts, lost text,
invalid arguments, and Neovim going away."""

from __future__ import annotations

import glob
import os
import sqlite3
import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests import one_server
from tests.conftest import NVIM, JournalReader, NeovimProcess, json_of, server_params, text_of, toolbus
from tests.faults_helpers import wait_until
from tests.journal_helpers import cli
from tests.test_editor_tools import make
from toolbus.adapters.nvim import discover_sockets

pytestmark = pytest.mark.anyio

# The tests that leave the journal alone share one `toolbus serve` (conftest: `module_client`).
anyio_backend, nvim_address, client = one_server.anyio_backend, one_server.nvim_address, one_server.client


# --- exact path matching -----------------------------------------------------------------


async def test_a_path_never_matches_another_directorys_file(client: Client, nvim: NeovimProcess, files: Path) -> None:
    other = make(files, "other/path/a.py")
    nvim.edit(other)
    nvim.set_lines(other, ["dirty"])
    wanted = files / "path" / "a.py"
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(wanted)}))
    assert reply == {"success": False, "message": f"Document not open: {wanted}"}
    reply = json_of(await client.call_tool("saveDocument", {"filePath": str(wanted)}))
    assert reply["saved"] is False
    assert other.read_text() == "print('hello')\n"


async def test_a_scratch_buffer_named_like_a_file_is_not_that_file(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """A plugin's `nofile` buffer may carry a file's name; getOpenEditors does not list it, and
    no other tool takes it for the file either."""
    scratch = files / "notes.py"
    number = nvim.plugin_buffer(scratch, ["scratch"], modified=True)
    not_open = {"success": False, "message": f"Document not open: {scratch}"}
    assert json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(scratch)})) == not_open
    saved = json_of(await client.call_tool("saveDocument", {"filePath": str(scratch)}))
    assert (saved["saved"], saved["message"]) == (False, not_open["message"])
    diagnostics = await client.call_tool("getDiagnostics", {"uri": scratch.as_uri()})
    assert text_of(diagnostics) == f"Document not open: {scratch.as_uri()}"
    assert json_of(await client.call_tool("getOpenEditors", {})) == {"tabs": []}
    scratch.write_text("the file\n")
    opened = await client.call_tool("openFile", {"filePath": str(scratch)})
    refusal = f"{scratch} is the name of buffer {number}, which is not the file's ('buftype' nofile): wipe it"
    refusal += f" (:bwipeout {number}) first"
    assert opened.is_error and text_of(opened) == f"Cannot open {scratch}: {refusal}"
    assert nvim.lines(scratch) == ["scratch"]
    assert scratch.read_text() == "the file\n"


async def test_a_name_holding_nul_is_invalid_never_the_name_before_it(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """The C calls that resolve names stop at a NUL: `a.py\\0.orig` would be taken for `a.py`."""
    edited = make(files, "a.py")
    nvim.edit(edited)
    nvim.set_lines(edited, ["unsaved"])
    calls = [
        ("close_tab", {"tab_name": f"{edited}\0.orig"}, "tab_name"),
        ("saveDocument", {"filePath": f"{edited}\0/other.py"}, "filePath"),
        ("checkDocumentDirty", {"filePath": f"{edited}\0"}, "filePath"),
        ("openFile", {"filePath": f"{edited}\0"}, "filePath"),
        ("getDiagnostics", {"uri": f"{edited.as_uri()}%00"}, "uri"),
    ]
    for tool, arguments, field in calls:
        result = await client.call_tool(tool, arguments)
        expected = f"Invalid arguments for {tool}: {field}: expected a name without NUL characters (\\u0000)"
        assert result.is_error and text_of(result) == expected
    assert nvim.lines(edited) == ["unsaved"] and edited.read_text() == "print('hello')\n"
    assert [command["status"] for command in journal.commands()] == ["rejected"] * len(calls)
    assert journal.events() == []


async def test_a_symlinked_path_finds_the_real_files_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    real = make(files, "real/a.py")
    link = files / "link"
    link.symlink_to(files / "real")
    nvim.edit(real)
    nvim.set_lines(real, ["via link"])
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(link / "a.py")}))
    assert reply["isDirty"] is True


async def test_a_buffer_opened_through_a_symlink_is_found_by_its_real_path(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    make(files, "other.py")
    nvim.edit(files / "other.py")  # a buffer before it, whose name is not the one wanted either
    real = make(files, "real/a.py")
    link = files / "link.py"
    link.symlink_to(real)
    nvim.edit(link)
    nvim.set_lines(link, ["via link"])
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(real)}))
    assert reply["isDirty"] is True


async def test_close_tab_by_name_never_closes_a_longer_name(client: Client, nvim: NeovimProcess, files: Path) -> None:
    data = make(files, "data.py")
    nvim.edit(data)
    await client.call_tool("close_tab", {"tab_name": "a.py"})
    assert nvim.buffer_names() == [str(data)]


async def test_close_tab_with_an_ambiguous_suffix_closes_nothing(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    first, second = make(files, "x/a.py"), make(files, "y/a.py")
    nvim.edit(first)
    nvim.edit(second)
    assert text_of(await client.call_tool("close_tab", {"tab_name": "a.py"})) == "TAB_CLOSED"
    assert nvim.buffer_names() == [str(first), str(second)]
    [skipped] = journal.events("TabCloseSkipped")
    assert skipped["data"]["reason"] == "ambiguous"
    assert sorted(skipped["data"]["candidates"]) == [str(first), str(second)]


async def test_close_tab_finds_a_buffer_by_its_real_path_and_through_a_symlink(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """Names are compared as they are first; a name that differs is resolved before it is
    compared, on either side: the buffer's or the path asked for."""
    make(files, "other.py")
    nvim.edit(files / "other.py")
    real = make(files, "real/a.py")
    (files / "link.py").symlink_to(real)
    nvim.edit(files / "link.py")  # a buffer named through the link
    await client.call_tool("close_tab", {"tab_name": str(real)})
    assert nvim.buffer_names() == [str(files / "other.py")]
    (files / "dir").symlink_to(files / "real")
    nvim.edit(real)
    await client.call_tool("close_tab", {"tab_name": str(files / "dir" / "a.py")})  # asked through a link
    assert nvim.buffer_names() == [str(files / "other.py")]


async def test_close_tab_prefers_the_exact_full_path(client: Client, nvim: NeovimProcess, files: Path) -> None:
    first, second = make(files, "x/a.py"), make(files, "y/a.py")
    nvim.edit(first)
    nvim.edit(second)
    await client.call_tool("close_tab", {"tab_name": str(second)})
    assert nvim.buffer_names() == [str(first)]


# --- the disk changed under the buffer -------------------------------------------------


async def test_save_after_disk_change_of_unmodified_buffer_keeps_the_disk_change(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py", "original\n")
    nvim.edit(path)
    nvim.command("set noautoread")
    path.write_text("written by the agent\n")
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply["success"] is True and reply["saved"] is True
    assert path.read_text() == "written by the agent\n"
    assert nvim.lines(path) == ["written by the agent"]
    [saved] = journal.events("DocumentSaved")
    assert saved["data"]["disk_changed"] is True and saved["data"]["reloaded"] is True


async def test_save_after_disk_change_with_autoread_keeps_the_disk_change(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    path = make(files, "a.py", "original\n")
    nvim.edit(path)
    path.write_text("agent edit\n")
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply["saved"] is True
    assert path.read_text() == "agent edit\n"


async def test_save_after_disk_change_of_modified_buffer_is_a_conflict(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py", "original\n")
    nvim.edit(path)
    nvim.set_lines(path, ["user's unsaved edit"])
    path.write_text("agent's disk edit\n")
    for _ in range(2):  # asking again must not overwrite either
        with anyio.fail_after(20):
            reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
        assert reply["success"] is False and reply["saved"] is False
        assert "changed on disk" in reply["message"] and "unsaved changes" in reply["message"]
        assert path.read_text() == "agent's disk edit\n"
        assert nvim.modified(path)
        assert nvim.lines(path) == ["user's unsaved edit"]
    refused = journal.events("DocumentSaveRefused")
    assert [event["data"]["reason"] for event in refused] == ["conflict", "conflict"]


def agent_edits_and_the_users_checktime_sees_it(nvim: NeovimProcess, path: Path, later_ns: int = 10**10) -> None:
    """The agent rewrites `path`, its time `later_ns` after the one Neovim read; the user's
    config answers :checktime first (a FileChangedShell of its own, on FocusGained say), so
    Neovim reports that change no more."""
    read_ns = path.stat().st_mtime_ns
    path.write_text("agent edit\n")
    os.utime(path, ns=(read_ns, read_ns + later_ns))
    nvim.command("augroup user_config | autocmd FileChangedShell * let v:fcs_choice = '' | augroup END")
    try:
        nvim.command("checktime")
    finally:
        nvim.command("autocmd! user_config")


@pytest.mark.parametrize(
    ("modified", "later_ns"),
    # Vim's rule: a change of whole seconds is one past a second (a FAT disk's rounding), of
    # nanoseconds any.
    [(False, 10**10), (True, 10**10), (False, 10**9 + 7), (True, 10**9 + 7)],
)
async def test_a_disk_change_the_users_own_checktime_took_is_settled_without_a_prompt(
    client: Client, nvim: NeovimProcess, files: Path, modified: bool, later_ns: int
) -> None:
    """The user's config answered :checktime first (a FileChangedShell of its own, on
    FocusGained say): Neovim reports that change no more, yet :write would stop at its
    "changed since reading it" prompt."""
    path = make(files, "a.py", "original\n")
    json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))  # toolbus's Lua is there
    nvim.edit(path)
    nvim.command("set noautoread")
    if modified:
        nvim.set_lines(path, ["mine"])
    agent_edits_and_the_users_checktime_sees_it(nvim, path, later_ns)
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply["saved"] is not modified
    assert path.read_text() == "agent edit\n"
    assert nvim.lines(path) == (["mine"] if modified else ["agent edit"])


async def test_a_copy_written_elsewhere_hides_no_disk_change_from_a_save(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """`:w other` writes another file: the buffer's own is as unread as before."""
    path = make(files, "a.py", "original\n")
    nvim.edit(path)
    nvim.set_lines(path, ["mine"])
    agent_edits_and_the_users_checktime_sees_it(nvim, path)
    nvim.command(f"write {files / 'copy.py'}")
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply["saved"] is False and "changed on disk" in reply["message"]
    assert path.read_text() == "agent edit\n"


async def test_a_buffer_renamed_onto_another_file_is_not_reloaded_from_it(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """`:file b.txt` names the buffer after a file it never read: Vim refuses to overwrite it."""
    make(files, "a.txt", "four\n")
    other = make(files, "b.txt", "bee\n")
    os.utime(other, (other.stat().st_atime, other.stat().st_mtime + 10))
    nvim.edit(files / "a.txt")
    nvim.command(f"file {other}")
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(other)}))
    assert reply["saved"] is False and "E13" in reply["message"]
    assert other.read_text() == "bee\n"
    assert nvim.lines(other) == ["four"]


async def test_a_conflict_ends_when_the_user_writes(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py", "original\n")
    nvim.edit(path)
    nvim.set_lines(path, ["mine"])
    path.write_text("theirs\n")
    assert json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))["saved"] is False
    nvim.command("write!")  # the user resolves it their way
    nvim.set_lines(path, ["mine, again"])
    assert json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))["saved"] is True
    assert path.read_text() == "mine, again\n"


# --- nothing is lost ------------------------------------------------------------------------


async def test_closing_a_modified_buffer_keeps_its_text_in_the_journal(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py", "saved text\n")
    nvim.edit(path)
    nvim.set_lines(path, ["unsaved line 1", "unsaved line 2"])
    await client.call_tool("close_tab", {"tab_name": "a.py"})
    [closed] = journal.events("TabClosed")
    assert closed["data"]["path"] == str(path) and closed["data"]["was_modified"] is True
    assert journal.blob(closed["data"]["discarded_blob"]) == b"unsaved line 1\nunsaved line 2\n"


async def test_save_keeps_written_and_replaced_text_as_blobs(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = make(files, "ü.txt", "vorher\n")
    nvim.edit(path)
    nvim.set_lines(path, ["nachher ✓"])
    await client.call_tool("saveDocument", {"filePath": str(path)})
    [saved] = journal.events("DocumentSaved")
    assert journal.blob(saved["data"]["replaced_blob"]) == b"vorher\n"
    assert journal.blob(saved["data"]["written_blob"]) == "nachher ✓\n".encode()
    assert saved["data"]["bytes_written"] == len("nachher ✓\n".encode())


# --- invalid arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("saveDocument", {}, "Invalid arguments for saveDocument: filePath: required field is missing"),
        (
            "saveDocument",
            {"filePath": 42},
            "Invalid arguments for saveDocument: filePath: expected str, got int",
        ),
        (
            "saveDocument",
            {"filePath": "src/a.lua"},
            'Invalid arguments for saveDocument: filePath: expected an absolute path, got "src/a.lua"',
        ),
        (
            "checkDocumentDirty",
            {"filePath": None},
            "Invalid arguments for checkDocumentDirty: filePath: expected str, got null",
        ),
        ("close_tab", {}, "Invalid arguments for close_tab: tab_name: required field is missing"),
        (
            "close_tab",
            {"tab_name": ["a"]},
            "Invalid arguments for close_tab: tab_name: expected str, got array",
        ),
    ],
)
async def test_invalid_arguments_are_errors_naming_the_field(
    client: Client,
    nvim: NeovimProcess,
    journal: JournalReader,
    tool: str,
    arguments: dict[str, object],
    expected: str,
) -> None:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    assert text_of(result) == expected
    [command] = journal.commands()
    assert (command["status"], command["error"]) == ("rejected", expected)
    assert journal.events() == []


async def test_an_unknown_tool_is_an_error(client: Client, journal: JournalReader) -> None:
    result = await client.call_tool("formatDisk", {})
    assert result.is_error
    assert "unknown tool" in text_of(result)
    [command] = journal.commands()
    assert (command["tool"], command["status"]) == ("formatDisk", "rejected")


# --- Neovim unreachable, restarted ---------------------------------------------------------


async def test_no_neovim_gives_a_clear_error_and_the_server_keeps_serving(
    journal_path: Path, tmp_path: Path, mode: str, journal: JournalReader
) -> None:
    missing = str(tmp_path / "no-nvim.sock")
    with anyio.fail_after(30):
        async with toolbus(journal_path, missing, "--nvim-timeout", "2", mode=mode) as client:
            for tool, arguments in [("getOpenEditors", {}), ("saveDocument", {"filePath": "/tmp/x.py"})]:
                result = await client.call_tool(tool, arguments)
                assert result.is_error
                assert "not reachable" in text_of(result) and missing in text_of(result)
            assert [tool.name for tool in (await client.list_tools()).tools]
    assert [c["status"] for c in journal.commands()] == ["failed", "failed"]


async def test_without_any_neovim_configured_the_error_says_what_to_do(
    journal_path: Path, tmp_path: Path, mode: str
) -> None:
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "run"), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    with anyio.fail_after(30):
        async with toolbus(journal_path, None, mode=mode, env=env) as client:
            result = await client.call_tool("getOpenEditors", {})
            saved = await client.call_tool("save", {"title": "no editor", "text": "the memory needs none"})
    assert result.is_error
    assert "No Neovim found" in text_of(result) and "--nvim" in text_of(result)
    assert not saved.is_error and json_of(saved)["success"] is True


async def test_after_neovim_restarts_the_next_call_works(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    assert len(json_of(await client.call_tool("getOpenEditors", {}))["tabs"]) == 1
    nvim.restart()
    nvim.edit(path)
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
    assert reply["success"] is True


@pytest.mark.parametrize(
    "hook",
    [
        "lua vim.api.nvim_create_autocmd('BufWritePre', { group = 'fmt', "
        "callback = function() error('formatter crashed: stylua exit 2') end })",
        "autocmd fmt BufWritePre * lua error('formatter crashed: stylua exit 2')",
        "autocmd fmt BufWritePre * echoerr 'formatter crashed: stylua exit 2'",
    ],
    ids=["lua-callback", "lua-command", "echoerr"],
)
async def test_a_formatter_failing_in_lua_is_named_without_luas_wrapping(
    client: Client, nvim: NeovimProcess, files: Path, hook: str
) -> None:
    """Whichever way a BufWritePre hook fails, the answer is its message: not where Lua raised
    it, nor Vim's autocommand wrapping."""
    path = make(files, "fmt.lua")
    nvim.edit(path)
    nvim.set_lines(path, ["x = 1"])
    nvim.command("augroup fmt | augroup END")
    nvim.command(hook)
    try:
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    finally:
        nvim.command("autocmd! fmt | augroup! fmt")
    assert (reply["saved"], reply["message"]) == (False, "Failed to save: formatter crashed: stylua exit 2")


async def test_a_hook_failing_after_the_write_leaves_a_save(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """A BufWritePost linter that fails: the file is written all the same, and the answer and
    the journal say so (they said nothing was written)."""
    path = make(files, "lint.py")
    nvim.edit(path)
    nvim.set_lines(path, ["new text"])
    nvim.command("augroup lint | augroup END")
    nvim.command("autocmd lint BufWritePost * lua error('linter crashed')")
    try:
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    finally:
        nvim.command("autocmd! lint | augroup! lint")
    assert (reply["saved"], reply["message"]) == (True, "Document saved successfully")
    assert path.read_text() == "new text\n" and not nvim.modified(path)
    [saved] = journal.events("DocumentSaved")
    assert journal.blob(saved["data"]["written_blob"]) == b"new text\n"


async def test_a_write_a_hook_stopped_is_no_save_though_the_file_changed_meanwhile(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """A slow formatter during which something else writes the file, then fails: Vim wrote
    nothing of the buffer, whatever the file's time says."""
    path = make(files, "fmt.py", "buffer text\n")
    nvim.edit(path)
    nvim.command("augroup fmt | augroup END")
    nvim.command(
        "autocmd fmt BufWritePre * lua vim.fn.writefile({'written by someone else'}, vim.fn.expand('<afile>'))"
        " error('formatter crashed')"
    )
    try:
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    finally:
        nvim.command("autocmd! fmt | augroup! fmt")
    assert (reply["saved"], reply["message"]) == (False, "Failed to save: formatter crashed")
    assert path.read_text() == "written by someone else\n"


async def test_saves_with_write_events_ignored_are_no_disk_changes(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """With 'eventignore' holding BufWritePost, toolbus notes its own write all the same: the
    next save is no conflict."""
    path = make(files, "quiet.py")
    nvim.edit(path)
    nvim.command("set eventignore=BufWritePost")
    try:
        for text in ("one", "two"):
            nvim.set_lines(path, [text])
            reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
            assert reply["saved"], reply["message"]
    finally:
        nvim.command("set eventignore=")
    assert path.read_text() == "two\n"


async def test_a_prompt_during_save_times_out_and_neovim_is_usable_after(
    journal_path: Path, nvim: NeovimProcess, files: Path, mode: str, journal: JournalReader
) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.command('autocmd BufWritePre <buffer> let g:answer = input("Really write? ")')
    async with toolbus(journal_path, nvim.address, "--nvim-timeout", "1", mode=mode) as client:
        with anyio.fail_after(20):
            result = await client.call_tool("saveDocument", {"filePath": str(path)})
        assert result.is_error and "did not answer" in text_of(result)
        nvim.command("autocmd! BufWritePre")
        with anyio.fail_after(20):
            reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
        assert reply["success"] is True
    assert nvim.call(lambda n: n.request("nvim_get_mode"))["mode"] == "n"
    [blocked, after] = journal.commands()
    assert blocked["status"] == "in_doubt" and "did not answer" in blocked["error"]
    assert after["status"] == "ok"


async def test_a_long_running_command_times_out_and_is_interrupted(
    journal_path: Path, nvim: NeovimProcess, files: Path, mode: str
) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    async with toolbus(journal_path, nvim.address, "--nvim-timeout", "1", mode=mode) as client:
        nvim.occupy()
        with anyio.fail_after(20):
            result = await client.call_tool("getOpenEditors", {})
        assert result.is_error and "did not answer" in text_of(result)
        with anyio.fail_after(20):
            reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
        assert reply["success"] is True


async def test_a_running_neovim_is_discovered_without_configuration(
    journal_path: Path, tmp_path: Path, files: Path, mode: str
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    nvim = NeovimProcess(tmp_path / "discovered", address=str(runtime / "nvim.4242.0"))
    try:
        path = make(files, "found.py")
        nvim.edit(path)
        env = {"XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(tmp_path)}
        with anyio.fail_after(30):
            async with toolbus(journal_path, None, mode=mode, env=env) as client:
                reply = json_of(await client.call_tool("getOpenEditors", {}))
        assert [tab["label"] for tab in reply["tabs"]] == ["found.py"]
    finally:
        nvim.kill()


async def test_discovery_prefers_the_neovim_working_in_the_agents_directory(
    journal_path: Path, tmp_path: Path, files: Path, mode: str
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ours = NeovimProcess(tmp_path / "ours", address=str(runtime / "nvim.1.0"))
    other = NeovimProcess(tmp_path / "other", address=str(runtime / "nvim.2.0"))  # newer socket
    try:
        ours.command(f"cd {files}")
        ours.edit(make(files, "ours.py"))
        other.command(f"cd {elsewhere}")
        other.edit(make(elsewhere, "other.py"))
        env = {"XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(tmp_path)}
        params = server_params(journal_path, None, env=env)
        params.cwd = str(files)
        with anyio.fail_after(30):
            async with Client(params, mode=mode) as client:
                reply = json_of(await client.call_tool("getOpenEditors", {}))
        assert [tab["label"] for tab in reply["tabs"]] == ["ours.py"]
    finally:
        ours.kill()
        other.kill()


async def test_a_conflict_undone_by_the_user_saves_the_disk_version_without_a_prompt(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    path = make(files, "a.py", "original\n")
    nvim.edit(path)
    nvim.command("set noautoread")
    nvim.set_lines(path, ["mine"])
    path.write_text("theirs\n")
    assert json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))["saved"] is False
    nvim.lua("vim.bo[vim.fn.bufnr(...)].modified = false", str(path))  # as if undone
    with anyio.fail_after(20):
        reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply["saved"] is True
    assert path.read_text() == "theirs\n"
    assert nvim.lines(path) == ["theirs"]


async def test_close_tab_never_touches_hidden_buffers(client: Client, nvim: NeovimProcess, files: Path) -> None:
    visible, hidden = make(files, "x/a.py"), make(files, "y/a.py")
    nvim.edit(visible)
    nvim.lua("local b = vim.fn.bufadd(...); vim.fn.bufload(b); vim.bo[b].buflisted = false", str(hidden))
    await client.call_tool("close_tab", {"tab_name": "a.py"})  # one open match: not ambiguous
    assert str(visible) not in nvim.buffer_names()
    assert nvim.lua("return vim.api.nvim_buf_is_loaded(vim.fn.bufnr(...))", str(hidden))


async def test_close_tab_leaves_terminals_and_other_non_file_buffers_alone(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    nvim.command("terminal sleep 600")  # the agent's own terminal, perhaps: its job must live
    terminal = nvim.lua("return vim.api.nvim_get_current_buf()")
    scratch = files / "notes.txt"
    nvim.plugin_buffer(scratch, [""])
    for tab_name in (nvim.lua("return vim.api.nvim_buf_get_name(0)").rsplit("/", 1)[1], "notes.txt", str(scratch)):
        assert text_of(await client.call_tool("close_tab", {"tab_name": tab_name})) == "TAB_CLOSED"
    assert nvim.lua("return vim.fn.jobwait({vim.bo[...].channel}, 0)[1]", terminal) == -1  # still running
    assert str(scratch) in nvim.buffer_names()
    assert [e["data"]["reason"] for e in journal.events("TabCloseSkipped")] == ["not_found"] * 3


async def test_closing_a_buffer_whose_file_is_gone_keeps_its_only_copy(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = make(files, "gone.py", "the only copy\n")
    nvim.edit(path)
    path.unlink()
    assert text_of(await client.call_tool("close_tab", {"tab_name": "gone.py"})) == "TAB_CLOSED"
    assert str(path) not in nvim.buffer_names()
    [closed] = journal.events("TabClosed")
    assert journal.blob(closed["data"]["discarded_blob"]) == b"the only copy\n"
    assert cli("recover", str(closed["position"]), "--journal", str(journal.path)).out == "the only copy\n"


async def test_a_close_keeps_unsaved_text_as_the_file_would_hold_it(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """In the file's encoding, with its byte order mark: `recover --apply` writes it back as is."""
    held = {  # what each file holds, and what it holds with the line "é!"
        "latin1.txt": (b"caf\xe9\n", b"\xe9!\n"),
        "bom.txt": (b"\xef\xbb\xbfbom\n", b"\xef\xbb\xbf\xc3\xa9!\n"),
        "utf16le.txt": ("\ufeffle\n".encode("utf-16-le"), "\ufeffé!\n".encode("utf-16-le")),
        "utf16be.txt": ("\ufeffbe\n".encode("utf-16-be"), "\ufeffé!\n".encode("utf-16-be")),
        "utf32le.txt": ("\ufeffle\n".encode("utf-32-le"), "\ufeffé!\n".encode("utf-32-le")),
    }
    for name, (before, _) in held.items():
        path = files / name
        path.write_bytes(before)
        nvim.edit(path)
        nvim.set_lines(path, ["é!"])
        assert text_of(await client.call_tool("close_tab", {"tab_name": str(path)})) == "TAB_CLOSED"
    kept = [journal.blob(event["data"]["discarded_blob"]) for event in journal.events("TabClosed")]
    assert kept == [after for _, after in held.values()]


async def test_unsaved_text_survives_a_close_whose_commit_fails(
    client: Client, nvim: NeovimProcess, files: Path, journal_path: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.set_lines(path, ["precious"])
    await client.call_tool("getOpenEditors", {})  # the journal exists from here on
    with sqlite3.connect(journal_path) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.type = 'TabClosed'"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )
    result = await client.call_tool("close_tab", {"tab_name": "a.py"})
    assert result.is_error and "disk trouble" in text_of(result)
    # It says what was done, so the agent does not "try again" a close that happened.
    assert text_of(result).startswith(f"{path} was closed, but the journal could not record it: "), text_of(result)
    assert text_of(result).endswith(". Its unsaved text is kept in the journal (toolbus recover).")
    assert str(path) not in nvim.buffer_names()
    assert journal.rows("SELECT content FROM blobs") == [{"content": b"precious\n"}]
    assert journal.commands("close_tab")[0]["status"] == "in_doubt"


# --- paths as Neovim resolves them -----------------------------------------------------------


async def test_editor_events_through_a_symlinked_directory_are_filed_under_the_resolved_path(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader, journal_path: Path
) -> None:
    real = make(files, "real/a.py")
    link = files / "link"
    link.symlink_to(files / "real")
    nvim.edit(link / "a.py")
    nvim.set_lines(link / "a.py", ["via link"])
    assert json_of(await client.call_tool("saveDocument", {"filePath": str(link / "a.py")}))["saved"] is True
    refused = json_of(await client.call_tool("saveDocument", {"filePath": str(link / "b.py")}))
    assert refused["saved"] is False
    assert text_of(await client.call_tool("close_tab", {"tab_name": str(link / "a.py")})) == "TAB_CLOSED"
    resolved = os.path.realpath(real)
    assert [(e["type"], e["data"]["path"]) for e in journal.events()] == [
        ("DocumentSaved", resolved),
        ("DocumentSaveRefused", os.path.join(os.path.realpath(files / "real"), "b.py")),
        ("TabClosed", resolved),
    ]
    (files / "real" / "deep").mkdir()
    (files / "deep").symlink_to(files / "real" / "deep")  # deep/.. is real, not files
    for spelling in (real, link / "a.py", files / "deep" / ".." / "a.py"):
        run = cli("history", spelling, "--journal", journal_path, "--json")
        assert run.code == 0, run.err
        assert [line["event"]["type"] for line in run.json_lines()] == ["TabClosed", "DocumentSaved"]


def test_discovery_finds_the_default_socket_without_user(tmp_path: Path) -> None:
    """Neovim names its private temp folder after the login name in the password database,
    even when $USER and $LOGNAME are unset (containers, CI)."""
    private = tmp_path / "tmp"
    private.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME", "XDG_RUNTIME_DIR", "NVIM")}
    env |= {"TMPDIR": str(private), "XDG_STATE_HOME": str(tmp_path / "state")}
    process = subprocess.Popen(
        [NVIM or "nvim", "--clean", "-n", "--headless"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sockets = wait_until(lambda: glob.glob(str(private / "nvim.*" / "*" / "nvim.*.0")), timeout=20)
        found = wait_until(lambda: discover_sockets(env), timeout=20)
        assert found == sockets[0]
    finally:
        process.kill()
        process.wait()


# --- a save is told as it happened -----------------------------------------------------------


def refuse_inserts(journal_path: Path, table: str, when: str = "1") -> None:
    """The journal's disk fails for these rows, as a full disk would."""
    with sqlite3.connect(journal_path) as conn:
        conn.execute(
            f"CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} WHEN {when}"
            " BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
        )


async def test_a_save_of_text_the_files_encoding_cannot_hold_writes_nothing(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """Vim would write each such character replaced, and leave the buffer modified."""
    path = files / "latin.txt"
    path.write_bytes(b"caf\xe9\n")
    nvim.edit(path)
    nvim.set_lines(path, ["café", "a cup ☕"])
    result = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert (result["saved"], result["message"]) == (
        False,
        "Failed to save: line 2 holds a character 'fileencoding' latin1 cannot hold; :set fileencoding=utf-8 keeps it",
    )
    assert path.read_bytes() == b"caf\xe9\n"
    assert nvim.lines(path) == ["café", "a cup ☕"] and nvim.modified(path)
    [refused] = journal.events("DocumentSaveRefused")
    assert refused["data"]["reason"] == "vim_error" and "line 2" in refused["data"]["message"]


async def test_a_save_whose_replaced_text_cannot_be_kept_writes_nothing(
    client: Client, nvim: NeovimProcess, files: Path, journal_path: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py", "on disk\n")
    nvim.edit(path)
    nvim.set_lines(path, ["in the buffer"])
    await client.call_tool("getOpenEditors", {})  # the journal exists from here on
    refuse_inserts(journal_path, "blobs")
    result = await client.call_tool("saveDocument", {"filePath": str(path)})
    assert result.is_error and "disk trouble" in text_of(result), text_of(result)
    assert text_of(result).endswith(f". {path} was not saved: it is unchanged")
    assert path.read_text() == "on disk\n" and nvim.modified(path)
    assert journal.commands("saveDocument")[0]["status"] == "failed"


async def test_a_save_whose_outcome_cannot_be_committed_says_it_was_written(
    client: Client, nvim: NeovimProcess, files: Path, journal_path: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py", "on disk\n")
    nvim.edit(path)
    nvim.set_lines(path, ["in the buffer"])
    await client.call_tool("getOpenEditors", {})
    refuse_inserts(journal_path, "events", "NEW.type = 'DocumentSaved'")
    result = await client.call_tool("saveDocument", {"filePath": str(path)})
    assert result.is_error and "was written, but the journal could not record" in text_of(result)
    assert path.read_text() == "in the buffer\n"
    assert journal.rows("SELECT content FROM blobs") == [{"content": b"on disk\n"}]  # replaced text kept
    assert journal.commands("saveDocument")[0]["status"] == "in_doubt"
