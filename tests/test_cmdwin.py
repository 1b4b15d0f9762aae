"""The editor tools while the user is in Neovim's command-line window (`q:`), where Neovim lets no
other window or buffer change (E11): a tool that would is refused at once, saying what to do,
and leaves nothing behind; the others work."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.types import TextContent

from tests.conftest import JournalReader, NeovimProcess, json_of, text_of
from tests.faults_helpers import wait_until
from tests.test_editor_tools import make

pytestmark = pytest.mark.anyio

CMDWIN = "Neovim's command-line window (q:) is open"
# Every buffer, listed or not: a view that failed to open must leave none of its own behind.
ALL_BUFFERS = "return vim.tbl_map(vim.api.nvim_buf_get_name, vim.api.nvim_list_bufs())"


@contextmanager
def command_line_window(nvim: NeovimProcess) -> Iterator[None]:
    """The user opens the command-line window (as typed: `q:`), and closes it afterwards."""
    nvim.call(lambda n: n.input("q:"))
    wait_until(lambda: nvim.call(lambda n: n.funcs.getcmdwintype()) == ":", timeout=5)
    yield
    nvim.call(lambda n: n.input(":quit<CR>"))  # typed in its Normal mode, where q: leaves the user
    wait_until(lambda: nvim.call(lambda n: n.funcs.getcmdwintype()) == "", timeout=5)


def diff_arguments(path: Path, text: str, tab: str) -> dict[str, str]:
    return {"old_file_path": str(path), "new_file_path": str(path), "new_file_contents": text, "tab_name": tab}


async def test_tools_that_change_windows_refuse_at_once_and_leave_nothing_behind(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    a, b = make(files, "a.py"), make(files, "b.py")
    nvim.edit(a)
    with command_line_window(nvim):
        buffers = nvim.lua(ALL_BUFFERS)
        diff = await client.call_tool("openDiff", diff_arguments(a, "x = 2\n", "a.py diff"))
        assert diff.is_error and text_of(diff).startswith(f"openDiff: {CMDWIN}")
        assert text_of(diff).endswith(": close it (:quit), then try again. Nothing was opened")
        opened = await client.call_tool("openFile", {"filePath": str(b)})
        assert opened.is_error and text_of(opened).startswith(f"Cannot open {b}: {CMDWIN}")
        closed = await client.call_tool("close_tab", {"tab_name": str(a)})
        assert closed.is_error and text_of(closed).startswith(f"close_tab: {CMDWIN}")
        assert "Traceback" not in text_of(diff) + text_of(opened) + text_of(closed)
        assert nvim.lua(ALL_BUFFERS) == buffers  # no scratch buffer of the view, b.py not loaded
        assert int(nvim.lua("return #vim.api.nvim_list_tabpages()")) == 1
        # Loading a file without showing it changes no window: that works.
        loaded = json_of(await client.call_tool("openFile", {"filePath": str(b), "makeFrontmost": False}))
        assert loaded["success"] is True
    assert [c["status"] for c in journal.commands()][:3] == ["failed", "failed", "failed"]
    assert CMDWIN in journal.commands("close_tab")[0]["error"]
    # Once the user leaves it, the same calls work.
    assert text_of(await client.call_tool("openFile", {"filePath": str(b)})) == f"Opened file: {b}"
    assert text_of(await client.call_tool("close_tab", {"tab_name": str(a)})) == "TAB_CLOSED"
    assert str(a) not in nvim.buffer_names()


async def test_reading_and_saving_work_and_a_reload_it_needs_is_refused_clearly(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    a = make(files, "a.py")
    nvim.edit(a)
    nvim.set_lines(a, ["x = 2"])
    with command_line_window(nvim):
        [tab] = json_of(await client.call_tool("getOpenEditors", {}))["tabs"]
        assert (tab["label"], tab["isDirty"]) == ("a.py", True)
        dirty = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(a)}))
        assert dirty["isDirty"] is True
        saved = json_of(await client.call_tool("saveDocument", {"filePath": str(a)}))
        assert (saved["saved"], a.read_text(), nvim.modified(a)) == (True, "x = 2\n", False)
        # Changed on disk: the unmodified buffer would be reloaded before the save, which waits.
        a.write_text("x = 3\n")
        os.utime(a, (a.stat().st_atime, a.stat().st_mtime + 10))  # past any clock's grain, as elsewhere
        refused = json_of(await client.call_tool("saveDocument", {"filePath": str(a)}))
        assert refused["saved"] is False and a.read_text() == "x = 3\n"
        assert refused["message"].startswith("Failed to save: the file changed on disk")
        assert CMDWIN in refused["message"] and "Traceback" not in refused["message"]
    saved = json_of(await client.call_tool("saveDocument", {"filePath": str(a)}))
    assert (saved["saved"], a.read_text(), nvim.lines(a)) == (True, "x = 3\n", ["x = 3"])


async def test_a_diff_view_closed_from_the_command_line_window_goes_when_it_closes(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    """Its decision is taken at once; its tab page, which Neovim will not close meanwhile, goes
    as soon as the user leaves the command-line window."""
    a = make(files, "a.py")
    nvim.edit(a)
    async with anyio.create_task_group() as group:
        answers: list[list[str]] = []

        async def propose() -> None:
            result = await client.call_tool("openDiff", diff_arguments(a, "x = 2\n", "a.py diff"))
            answers.append([item.text for item in result.content if isinstance(item, TextContent)])

        group.start_soon(propose)
        await anyio.to_thread.run_sync(
            lambda: wait_until(lambda: "(proposed)" in nvim.lua("return vim.api.nvim_buf_get_name(0)"), timeout=5)
        )
        with command_line_window(nvim):
            assert text_of(await client.call_tool("close_tab", {"tab_name": "a.py diff"})) == "TAB_CLOSED"
            await anyio.to_thread.run_sync(lambda: wait_until(lambda: answers, timeout=5))
            assert answers == [["DIFF_REJECTED", "a.py diff"]]
            assert nvim.lua("return #vim.api.nvim_list_tabpages()") == 2  # until the user leaves it
    wait_until(lambda: nvim.lua("return #vim.api.nvim_list_tabpages()") == 1, timeout=5)
    assert not [name for name in nvim.lua(ALL_BUFFERS) if name.startswith("toolbus://")]
    [rejected] = journal.events("DiffRejected")
    assert rejected["data"]["by"] == "close_tab"
