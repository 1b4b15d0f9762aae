"""The four editor tools end to end: `toolbus serve` over stdio, a real Neovim, a real journal.

One test per acceptance criterion of seeds 000-003 (every protocol version: test_protocol_versions).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp import Client

from tests import one_server
from tests.conftest import JournalReader, NeovimProcess, json_of, text_of

pytestmark = pytest.mark.anyio

# The tests that leave the journal alone share one `toolbus serve` (conftest: `module_client`).
anyio_backend, nvim_address, client = one_server.anyio_backend, one_server.nvim_address, one_server.client


def make(folder: Path, name: str, text: str = "print('hello')\n") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def tool_descriptions(client: Client) -> dict[str, str | None]:
    return {tool.name: tool.description for tool in (await client.list_tools()).tools}


# --- saveDocument (seed 000) -----------------------------------------------------------


async def test_save_writes_a_modified_buffer_to_disk(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.set_lines(path, ["x = 2"])
    json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert path.read_text() == "x = 2\n"


async def test_save_reports_saved_and_success(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.set_lines(path, ["x = 2"])
    reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply == {
        "success": True,
        "filePath": str(path),
        "saved": True,
        "message": "Document saved successfully",
    }


async def test_save_of_a_document_not_open_fails(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "closed.py")
    reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply == {
        "success": False,
        "filePath": str(path),
        "saved": False,
        "message": f"Document not open: {path}",
    }


async def test_a_save_of_a_file_not_open_keeps_none_of_its_text(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    opened = make(files, "a.py")
    nvim.edit(opened)
    for _ in range(2):
        assert json_of(await client.call_tool("saveDocument", {"filePath": str(opened)}))["saved"] is True
    secret = make(files, "secret.env", "TOKEN=never-in-the-journal\n")
    for _ in range(2):  # a file an agent merely names is never read into the journal
        assert json_of(await client.call_tool("saveDocument", {"filePath": str(secret)}))["saved"] is False
    kept = [bytes(row["content"]) for row in journal.rows("SELECT content FROM blobs")]
    assert kept == [b"print('hello')\n"]


async def test_save_of_a_readonly_buffer_fails_with_vims_error(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    path = make(files, "ro.py")
    nvim.edit(path)
    nvim.set_lines(path, ["changed"])
    nvim.command("setlocal readonly")
    reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply == {
        "success": False,
        "filePath": str(path),
        "saved": False,
        "message": "Failed to save: E45: 'readonly' option is set",
    }
    assert path.read_text() == "print('hello')\n"


async def test_save_clears_the_modified_flag(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.set_lines(path, ["x = 2"])
    assert nvim.modified(path)
    json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert not nvim.modified(path)


async def test_save_writes_even_an_unmodified_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    path.unlink()  # only a real :write brings it back
    reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert reply["saved"] is True
    assert path.read_text() == "print('hello')\n"


async def test_a_modified_buffer_whose_file_was_deleted_is_written_back(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """A deletion leaves no version to lose (the buffer holds the only copy): written, as `:w`
    would, and the journal says the disk had changed."""
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.set_lines(path, ["x = 2"])
    path.unlink()
    reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
    assert (reply["saved"], path.read_text(), nvim.modified(path)) == (True, "x = 2\n", False)
    [saved] = journal.events("DocumentSaved")
    assert (saved["data"]["disk_changed"], saved["data"]["replaced_blob"]) == (True, None)


async def test_save_document_is_listed(client: Client) -> None:
    descriptions = await tool_descriptions(client)
    assert descriptions["saveDocument"]


# --- checkDocumentDirty (seed 001) -----------------------------------------------------


async def test_dirty_is_true_for_a_modified_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    nvim.set_lines(path, ["edited"])
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
    assert reply["isDirty"] is True


async def test_dirty_is_false_for_a_saved_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
    assert reply == {"success": True, "filePath": str(path), "isDirty": False, "isUntitled": False}


async def test_dirty_of_a_document_not_open_fails(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = files / "nowhere.py"
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
    assert reply == {"success": False, "message": f"Document not open: {path}"}


async def test_dirty_returns_the_file_path_as_given(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    as_given = str(files / "." / "sub" / ".." / "a.py")
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": as_given}))
    assert reply["success"] is True
    assert reply["filePath"] == as_given


async def test_dirty_reports_is_untitled_false(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    nvim.edit(path)
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
    assert reply["isUntitled"] is False


async def test_check_document_dirty_is_listed(client: Client) -> None:
    descriptions = await tool_descriptions(client)
    assert descriptions["checkDocumentDirty"]


# --- close_tab (seed 002) ----------------------------------------------------------------


async def test_close_wipes_the_named_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    bufnr = nvim.edit(path)
    assert text_of(await client.call_tool("close_tab", {"tab_name": "a.py"})) == "TAB_CLOSED"
    assert not nvim.lua("return vim.api.nvim_buf_is_valid(...)", bufnr)


async def test_close_of_an_unknown_buffer_still_answers_tab_closed(client: Client, nvim: NeovimProcess) -> None:
    result = await client.call_tool("close_tab", {"tab_name": "no-such-file.lua"})
    assert not result.is_error
    assert text_of(result) == "TAB_CLOSED"


async def test_close_forces_a_modified_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "a.py")
    bufnr = nvim.edit(path)
    nvim.set_lines(path, ["unsaved"])
    assert text_of(await client.call_tool("close_tab", {"tab_name": str(path)})) == "TAB_CLOSED"
    assert not nvim.lua("return vim.api.nvim_buf_is_valid(...)", bufnr)  # wiped, not just unlisted
    assert path.read_text() == "print('hello')\n"


async def test_close_tab_is_listed_with_an_empty_description(client: Client) -> None:
    descriptions = await tool_descriptions(client)
    assert "close_tab" in descriptions
    assert descriptions["close_tab"] in ("", None)


async def test_closed_buffer_leaves_the_buffer_list(client: Client, nvim: NeovimProcess, files: Path) -> None:
    keep, close = make(files, "keep.py"), make(files, "close.py")
    nvim.edit(keep)
    nvim.edit(close)
    await client.call_tool("close_tab", {"tab_name": "close.py"})
    assert nvim.buffer_names() == [str(keep)]


# --- getOpenEditors (seed 003) -----------------------------------------------------------


async def editors(client: Client) -> list[dict[str, object]]:
    reply = json_of(await client.call_tool("getOpenEditors", {}))
    return list(reply["tabs"])


async def test_open_editors_lists_the_open_buffers(client: Client, nvim: NeovimProcess, files: Path) -> None:
    first, second = make(files, "one.py"), make(files, "two.lua")
    nvim.edit(first)
    nvim.edit(second)
    assert [tab["label"] for tab in await editors(client)] == ["one.py", "two.lua"]


async def test_open_editors_marks_the_active_buffer(client: Client, nvim: NeovimProcess, files: Path) -> None:
    first, second = make(files, "one.py"), make(files, "two.py")
    nvim.edit(first)
    nvim.edit(second)
    assert {tab["label"]: tab["isActive"] for tab in await editors(client)} == {
        "one.py": False,
        "two.py": True,
    }


async def test_open_editors_marks_dirty_buffers(client: Client, nvim: NeovimProcess, files: Path) -> None:
    first, second = make(files, "one.py"), make(files, "two.py")
    nvim.edit(first)
    nvim.edit(second)
    nvim.set_lines(first, ["changed"])
    assert {tab["label"]: tab["isDirty"] for tab in await editors(client)} == {
        "one.py": True,
        "two.py": False,
    }


async def test_open_editors_excludes_unnamed_buffers(client: Client, nvim: NeovimProcess, files: Path) -> None:
    nvim.edit(make(files, "one.py"))
    nvim.command("enew")
    nvim.set_lines("", ["scratch text"])
    assert [tab["label"] for tab in await editors(client)] == ["one.py"]


async def test_open_editors_excludes_help_terminal_and_unlisted(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.edit(make(files, "one.py"))
    nvim.command("help help")
    nvim.command("terminal")
    hidden = make(files, "hidden.py")
    nvim.lua("local b = vim.fn.bufadd(...); vim.fn.bufload(b); vim.bo[b].buflisted = false", str(hidden))
    assert [tab["label"] for tab in await editors(client)] == ["one.py"]


async def test_open_editors_gives_file_uris(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = make(files, "with space.py")
    nvim.edit(str(path).replace(" ", "\\ "))
    [tab] = await editors(client)
    assert tab["uri"] == "file://" + str(path).replace(" ", "%20")


async def test_open_editors_language_is_filetype_or_plaintext(client: Client, nvim: NeovimProcess, files: Path) -> None:
    nvim.edit(make(files, "code.lua"))
    nvim.edit(make(files, "notes.zzz"))
    assert {tab["label"]: tab["languageId"] for tab in await editors(client)} == {
        "code.lua": "lua",
        "notes.zzz": "plaintext",
    }


async def test_get_open_editors_is_listed(client: Client) -> None:
    descriptions = await tool_descriptions(client)
    assert descriptions["getOpenEditors"]


# --- the journal --------------------------------------------------------------------------


async def test_every_call_is_journaled_with_its_outcome(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    path = make(files, "a.py", "old\n")
    nvim.edit(path)
    nvim.set_lines(path, ["new"])
    await client.call_tool("getOpenEditors", {})
    await client.call_tool("checkDocumentDirty", {"filePath": str(path)})
    await client.call_tool("saveDocument", {"filePath": str(path)})
    await client.call_tool("saveDocument", {"filePath": "relative.py"})
    await client.call_tool("close_tab", {"tab_name": "a.py"})

    commands = journal.commands()
    assert [(c["tool"], c["status"]) for c in commands] == [
        ("getOpenEditors", "ok"),
        ("checkDocumentDirty", "ok"),
        ("saveDocument", "ok"),
        ("saveDocument", "rejected"),
        ("close_tab", "ok"),
    ]
    assert all(c["finished_at"] and c["session_id"] == commands[0]["session_id"] for c in commands)
    assert commands[3]["error"].startswith("Invalid arguments for saveDocument: filePath")
    saved, closed = journal.events()
    assert (saved["type"], saved["command_id"]) == ("DocumentSaved", commands[2]["id"])
    assert journal.blob(saved["data"]["written_blob"]) == b"new\n"
    assert journal.blob(saved["data"]["replaced_blob"]) == b"old\n"
    assert (closed["type"], closed["data"]["was_modified"]) == ("TabClosed", False)
    journal.assert_gapless()
    assert os.stat(journal.path).st_mode & 0o777 == 0o600
