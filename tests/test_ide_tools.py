"""The IDE tools beyond the seeds end to end: `toolbus serve` over stdio, a real headless Neovim
(shared by the module, reset before each test), the user acting through a second connection.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pynvim
import pytest
from mcp import Client

from tests.conftest import JournalReader, NeovimProcess, json_of, text_of, toolbus

pytestmark = pytest.mark.anyio

READ = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
ANNOTATIONS = {
    "getOpenEditors": {"title": "Open editors", **READ},
    "checkDocumentDirty": {"title": "Check for unsaved changes", **READ},
    "saveDocument": {"title": "Save document", **READ, "readOnlyHint": False, "destructiveHint": True},
    "close_tab": {"title": "Close tab", **READ, "readOnlyHint": False, "destructiveHint": True},
    "openFile": {"title": "Open file", **READ, "readOnlyHint": False},
    "openDiff": {"title": "Open diff", **READ, "readOnlyHint": False, "destructiveHint": True, "idempotentHint": False},
    "closeAllDiffTabs": {"title": "Close all diff tabs", **READ, "readOnlyHint": False, "destructiveHint": True},
    "getCurrentSelection": {"title": "Current selection", **READ},
    "getLatestSelection": {"title": "Latest selection", **READ},
    "getDiagnostics": {"title": "Diagnostics", **READ},
    "getWorkspaceFolders": {"title": "Workspace folders", **READ},
    "save": {"title": "Save to memory", **READ, "readOnlyHint": False, "idempotentHint": False},
    "search": {"title": "Search memory", **READ},
    "timeline": {"title": "Memory timeline", **READ},
    "get_observations": {"title": "Get observations", **READ},
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ide")


@pytest.fixture(scope="module")
def nvim(root: Path) -> Iterator[NeovimProcess]:
    process = NeovimProcess(root / "nvim")
    yield process
    process.kill()


@pytest.fixture(scope="module")
async def client(root: Path, nvim: NeovimProcess) -> AsyncIterator[Client]:
    async with toolbus(root / "journal.db", nvim.address, "--nvim-timeout", "3") as connected:
        yield connected


@pytest.fixture(scope="module")
def journal(root: Path) -> JournalReader:
    return JournalReader(root / "journal.db")


@pytest.fixture
def files(tmp_path: Path, nvim: NeovimProcess) -> Path:
    """A folder of files, and a Neovim in normal mode with one window and no buffers."""
    nvim.call(lambda n: n.input("<C-\\><C-n>"))
    nvim.lua(
        "vim.cmd('silent! tabonly! | silent! only! | enew | silent! %bwipeout!') vim.diagnostic.reset() "
        "for _, c in ipairs(vim.lsp.get_clients()) do c:stop(true) end vim.cmd.cd(...)",
        str(tmp_path),
    )
    (tmp_path / "a.py").write_text("def f():\n    return 'héllo wörld'\n\nf()\n")
    (tmp_path / "b.txt").write_text("alpha beta\ngamma delta\nepsilon\n")
    return tmp_path


def wait_for(nvim: NeovimProcess, check: Callable[[pynvim.Nvim], Any]) -> Any:
    deadline = time.monotonic() + 5
    while not (found := nvim.call(check)):
        assert time.monotonic() < deadline, "Neovim never got there"
        time.sleep(0.01)
    return found


def user_types(nvim: NeovimProcess, keys: str, mode: str = "n") -> None:
    """Keys typed by the user (not through toolbus); returns once Neovim is in `mode`."""
    nvim.call(lambda n: n.input(keys))
    wait_for(nvim, lambda n: n.api.get_mode()["mode"] == mode and not n.api.get_mode()["blocking"])


def span(start: tuple[int, int], end: tuple[int, int]) -> dict[str, Any]:
    return {
        "start": {"line": start[0], "character": start[1]},
        "end": {"line": end[0], "character": end[1]},
        "isEmpty": start == end,
    }


# Whether toolbus has connected to a Neovim and set up its tracking there.
TOOLBUS_LOADED = "for name in pairs(_G) do if name:match('^toolbus_') then return true end end return false"


async def selection(client: Client, tool: str = "getCurrentSelection") -> dict[str, Any]:
    return dict(json_of(await client.call_tool(tool, {})))


async def test_every_tool_declares_what_it_does(client: Client) -> None:
    tools = (await client.list_tools()).tools
    declared = {tool.name: tool.annotations.model_dump(by_alias=True) for tool in tools if tool.annotations}
    assert declared == ANNOTATIONS
    assert all(tool.title == ANNOTATIONS[tool.name]["title"] for tool in tools)


# --- getCurrentSelection / getLatestSelection ----------------------------------------------


async def test_a_characterwise_selection_counts_characters_as_lsp_does(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.edit(files / "a.py")
    user_types(nvim, "2G19|ve", "v")  # from the w of wörld (byte 19, character 18) to its end
    assert await selection(client) == {
        "success": True,
        "text": "wörld",
        "filePath": str(files / "a.py"),
        "fileUrl": (files / "a.py").as_uri(),
        "selection": span((1, 18), (1, 23)),
    }


async def test_a_linewise_selection_covers_whole_lines(client: Client, nvim: NeovimProcess, files: Path) -> None:
    nvim.edit(files / "b.txt")
    user_types(nvim, "ggVj", "V")
    reply = await selection(client)
    assert (reply["text"], reply["selection"]) == ("alpha beta\ngamma delta", span((0, 0), (1, 11)))


async def test_a_block_selection_is_the_rectangle(client: Client, nvim: NeovimProcess, files: Path) -> None:
    nvim.edit(files / "b.txt")
    user_types(nvim, "gg0l<C-v>jjl", "\x16")
    reply = await selection(client)
    assert (reply["text"], reply["selection"]) == ("lp\nam\nps", span((0, 1), (2, 3)))


def yanked(nvim: NeovimProcess) -> str:
    """The user yanks the selection (`y`): what Neovim itself takes for it."""
    user_types(nvim, "y")
    return str(nvim.call(lambda n: n.funcs.getreg('"')))


async def test_a_block_selected_to_the_end_of_lines_takes_each_line_to_its_end(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.edit(files / "b.txt")
    user_types(nvim, "gg0l<C-v>jj$", "\x16")  # the cursor ends on the shortest line
    reply = await selection(client)
    assert (reply["text"], reply["selection"]) == ("lpha beta\namma delta\npsilon", span((0, 1), (2, 7)))
    assert yanked(nvim) == reply["text"]
    # `y` moved the cursor before visual mode ended: the selection kept is still the same.
    latest = await selection(client, "getLatestSelection")
    assert (latest["text"], latest["selection"]) == (reply["text"], reply["selection"])
    user_types(nvim, "gg0l<C-v>jj$<Esc>")
    assert (await selection(client, "getLatestSelection"))["text"] == reply["text"]


async def test_a_characterwise_selection_to_the_end_of_a_line_takes_its_line_break(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.edit(files / "b.txt")
    user_types(nvim, "gg0lv$", "v")
    reply = await selection(client)
    assert (reply["text"], reply["selection"]) == ("lpha beta\n", span((0, 1), (1, 0)))
    assert yanked(nvim) == reply["text"]
    latest = await selection(client, "getLatestSelection")
    assert (latest["text"], latest["selection"]) == (reply["text"], reply["selection"])
    user_types(nvim, "G0v$", "v")  # the last line has no line break to take
    reply = await selection(client)
    assert (reply["text"], reply["selection"]) == ("epsilon", span((2, 0), (2, 7)))
    assert yanked(nvim) == reply["text"]


async def test_without_a_selection_it_is_the_cursor_and_without_a_file_no_editor(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.edit(files / "b.txt")
    user_types(nvim, "2Gw")
    reply = await selection(client)
    assert (reply["text"], reply["selection"]) == ("", span((1, 6), (1, 6)))
    nvim.command("enew")
    assert await selection(client) == {"success": False, "message": "No active editor found"}


async def test_a_selection_in_select_mode_is_one_too(client: Client, nvim: NeovimProcess, files: Path) -> None:
    """Select mode (a snippet's placeholder, `gh`, <C-g> in visual mode) selects as visual does."""
    nvim.edit(files / "b.txt")
    for keys, mode, text in [
        ("ggwve<C-g>", "s", "beta"),
        ("ggVj<C-g>", "S", "alpha beta\ngamma delta"),
        ("gg0l<C-v>jjl<C-g>", "\x13", "lp\nam\nps"),
    ]:
        user_types(nvim, keys, mode)
        assert (await selection(client))["text"] == text
        user_types(nvim, "<Esc>")
        assert (await selection(client, "getLatestSelection"))["text"] == text
    user_types(nvim, "ggwve<C-g>X", "i")  # typed over, as a snippet's placeholder is
    assert nvim.lines(files / "b.txt")[0] == "alpha X"
    assert (await selection(client, "getLatestSelection"))["text"] == "beta"


async def test_the_latest_selection_outlives_visual_mode_and_the_buffer(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.restart()  # a Neovim in which no selection was ever made
    assert await selection(client, "getLatestSelection") == {"success": False, "message": "No selection available"}
    nvim.edit(files / "b.txt")
    user_types(nvim, "ggwve", "v")
    user_types(nvim, "<Esc>")
    nvim.edit(files / "a.py")
    user_types(nvim, "G")
    latest = await selection(client, "getLatestSelection")
    assert (latest["text"], latest["filePath"]) == ("beta", str(files / "b.txt"))
    assert latest["selection"] == span((0, 6), (0, 10))
    assert (await selection(client))["filePath"] == str(files / "a.py")  # the current one moved on
    user_types(nvim, "ggvl", "v")  # a selection under way is the latest
    assert (await selection(client, "getLatestSelection"))["text"] == "de"


async def test_a_selection_an_operator_changed_is_the_latest_as_it_was_selected(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """`d`, `gU` and `>` end visual mode having changed what the marks point at: the latest
    selection is the text the user selected, where it was, not what is there now."""
    nvim.edit(files / "b.txt")
    user_types(nvim, "gg0ve", "v")
    user_types(nvim, "<Esc>")
    user_types(nvim, "gg0wve", "v")
    user_types(nvim, "d")
    latest = await selection(client, "getLatestSelection")
    assert (latest["text"], latest["selection"]) == ("beta", span((0, 6), (0, 10)))
    assert nvim.lines(files / "b.txt")[0] == "alpha "
    user_types(nvim, "2G0ve", "v")
    user_types(nvim, "gU")
    assert (await selection(client, "getLatestSelection"))["text"] == "gamma"
    user_types(nvim, "ggVj", "V")
    user_types(nvim, ">")
    assert (await selection(client, "getLatestSelection"))["text"] == "alpha \nGAMMA delta"
    user_types(nvim, "u")  # undone: a yank after it reads the marks, as ever
    user_types(nvim, "3G0ve", "v")
    user_types(nvim, "y")
    assert (await selection(client, "getLatestSelection"))["text"] == "epsilon"
    # Longer than is noted before each key (1,000 lines): not known, and not an older one instead
    (files / "long.txt").write_text("line\n" * 1500)
    nvim.edit(files / "long.txt")
    user_types(nvim, "ggVG", "V")
    user_types(nvim, "d")
    assert await selection(client, "getLatestSelection") == {"success": False, "message": "No selection available"}


async def test_a_toolbus_is_shown_no_selection_made_before_it_connected(
    client: Client, nvim: NeovimProcess, files: Path, tmp_path: Path
) -> None:
    """Neovim keeps tracking selections after a toolbus goes: the next agent's starts afresh."""
    nvim.edit(files / "b.txt")
    user_types(nvim, "ggwve", "v")
    user_types(nvim, "<Esc>")
    assert (await selection(client, "getLatestSelection"))["text"] == "beta"
    async with toolbus(tmp_path / "journal.db", nvim.address) as later:
        assert await selection(later, "getLatestSelection") == {"success": False, "message": "No selection available"}
        user_types(nvim, "gg0ve", "v")
        user_types(nvim, "<Esc>")
        assert (await selection(later, "getLatestSelection"))["text"] == "alpha"
    assert (await selection(client, "getLatestSelection"))["text"] == "alpha"  # the first one sees it too


async def test_selections_are_tracked_from_when_toolbus_connects_not_from_its_first_call(
    tmp_path: Path, files: Path
) -> None:
    nvim = NeovimProcess(tmp_path / "fresh")  # a Neovim toolbus has never called
    try:
        nvim.edit(files / "b.txt")
        async with toolbus(tmp_path / "journal.db", nvim.address) as fresh:
            wait_for(nvim, lambda n: n.exec_lua(TOOLBUS_LOADED))  # toolbus connected and set up its tracking
            user_types(nvim, "ggwve", "v")
            user_types(nvim, "<Esc>")
            latest = await selection(fresh, "getLatestSelection")
        assert (latest["text"], latest["filePath"]) == ("beta", str(files / "b.txt"))
    finally:
        nvim.kill()


async def test_a_neovim_that_comes_back_at_its_address_is_tracked_again_before_any_call(
    tmp_path: Path, files: Path
) -> None:
    """Started after toolbus, or restarted: toolbus sets up its tracking in it of its own accord."""
    nvim = NeovimProcess(tmp_path / "later")
    nvim.call(lambda n: n.api.get_mode())  # attached (a kill mid-attach would fail the test's thread)
    nvim.kill()  # toolbus starts first
    try:
        async with toolbus(tmp_path / "journal.db", nvim.address) as client:
            for _ in range(2):  # Neovim starts; the user quits it and starts it again
                nvim.start()
                nvim.edit(files / "b.txt")
                wait_for(nvim, lambda n: n.exec_lua(TOOLBUS_LOADED))  # no call made since it started
                user_types(nvim, "ggwve", "v")
                user_types(nvim, "<Esc>")
                latest = await selection(client, "getLatestSelection")
                assert (latest["text"], latest["filePath"]) == ("beta", str(files / "b.txt"))
                nvim.kill()
    finally:
        nvim.kill()


# --- getDiagnostics ---------------------------------------------------------------------------

SET_DIAGNOSTICS = """
local buf, items = vim.fn.bufnr(...), select(2, ...)
vim.diagnostic.set(vim.api.nvim_create_namespace('toolbus-test'), buf, items)
"""


# ...and one more, whose code was decoded from JSON null, as a linter plugin's may be.
SET_DIAGNOSTICS_NIL_CODE = """
local buf, items = vim.fn.bufnr(...), select(2, ...)
table.insert(items, { lnum = 0, col = 0, message = 'm', code = vim.NIL })
vim.diagnostic.set(vim.api.nvim_create_namespace('toolbus-test'), buf, items)
"""


async def test_diagnostics_of_every_file_of_one_and_of_a_file_not_open(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    a, b = files / "a.py", files / "b.txt"
    nvim.edit(a)
    nvim.edit(b)
    nvim.edit(files / "clean.txt")
    found = [
        {"lnum": 1, "col": 19, "end_lnum": 1, "end_col": 25, "severity": severity, "message": f"m{severity}"}
        for severity in (1, 2, 3, 4)
    ]
    nvim.lua(SET_DIAGNOSTICS, str(a), [found[0] | {"source": "pyright", "code": "E1"}, found[1] | {"code": 7}])
    nvim.lua(SET_DIAGNOSTICS, str(b), found[2:])  # no source, no code: as many servers send them
    everything = json_of(await client.call_tool("getDiagnostics", {}))
    assert [(f["uri"], [d["severity"] for d in f["diagnostics"]]) for f in everything] == [
        (a.as_uri(), ["Error", "Warning"]),
        (b.as_uri(), ["Information", "Hint"]),
    ]
    [of_a] = json_of(await client.call_tool("getDiagnostics", {"uri": a.as_uri()}))
    assert of_a["diagnostics"][0] == {
        "message": "m1",
        "severity": "Error",
        "range": {"start": {"line": 1, "character": 18}, "end": {"line": 1, "character": 23}},
        "source": "pyright",
        "code": "E1",
    }
    assert of_a["diagnostics"][1]["code"] == 7
    nvim.lua(SET_DIAGNOSTICS_NIL_CODE, str(b), found[2:])
    [of_b] = json_of(await client.call_tool("getDiagnostics", {"uri": b.as_uri()}))
    assert [(d["source"], d["code"]) for d in of_b["diagnostics"]] == [(None, None)] * 3
    # a code as ESLint once sent it ({value, target}) is its value; another table is no code
    eslint = {"value": "no-unused-vars", "target": "https://eslint.org/docs/rules/no-unused-vars"}
    nvim.lua(SET_DIAGNOSTICS, str(b), [found[2] | {"code": eslint}, found[3] | {"code": {"what": 1}}])
    [of_b] = json_of(await client.call_tool("getDiagnostics", {"uri": b.as_uri()}))
    assert [d["code"] for d in of_b["diagnostics"]] == ["no-unused-vars", None]
    # a plugin's numbers where text belongs, a fractional code: said as text, not a failed call
    nvim.lua(SET_DIAGNOSTICS, str(b), [found[2] | {"message": 42, "source": 123, "code": 2.5}])
    [of_b] = json_of(await client.call_tool("getDiagnostics", {"uri": b.as_uri()}))
    assert [(d["message"], d["source"], d["code"]) for d in of_b["diagnostics"]] == [("42", "123", "2.5")]
    missing = await client.call_tool("getDiagnostics", {"uri": (files / "nowhere.py").as_uri()})
    assert missing.is_error
    assert text_of(missing) == f"Document not open: {(files / 'nowhere.py').as_uri()}"


# --- getWorkspaceFolders ----------------------------------------------------------------------

# An LSP server inside Neovim: answers `initialize`, so the client attaches to the buffer.
START_FAKE_LSP = """
local folders, buf = ...
local function server()
  return {
    request = function(method, _, callback)
      if method == 'initialize' then callback(nil, { capabilities = {} }) else callback(nil, vim.NIL) end
      return true, 1
    end,
    notify = function() return true end,
    is_closing = function() return false end,
    terminate = function() end,
  }
end
vim.lsp.start({ name = 'fake', cmd = server, workspace_folders = folders }, { bufnr = vim.fn.bufnr(buf) })
"""


async def test_workspace_folders_are_the_cwd_then_each_lsp_folder_once(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    lib = files / "lib"
    lib.mkdir()
    nvim.edit(files / "a.py")
    folders = [{"uri": files.as_uri(), "name": "again"}, {"uri": lib.as_uri(), "name": "lib"}]
    nvim.lua(START_FAKE_LSP, folders, str(files / "a.py"))
    attached = "return #vim.lsp.get_clients({ bufnr = vim.fn.bufnr(...) })"
    wait_for(nvim, lambda n: n.exec_lua(attached, str(files / "a.py")))
    reply = json_of(await client.call_tool("getWorkspaceFolders", {}))
    assert reply == {
        "success": True,
        "folders": [
            {"name": files.name, "uri": files.as_uri(), "path": str(files)},
            {"name": "lib", "uri": lib.as_uri(), "path": str(lib)},
        ],
        "rootPath": str(files),
    }


async def test_the_root_as_working_directory_is_named_by_its_path(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.lua("vim.cmd.cd('/')")
    [folder] = json_of(await client.call_tool("getWorkspaceFolders", {}))["folders"]
    assert folder == {"name": "/", "uri": "file:///", "path": "/"}


async def test_a_working_directory_since_removed_is_said_not_answered_empty(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    (gone := files / "gone").mkdir()
    nvim.lua("vim.cmd.cd(...)", str(gone))
    gone.rmdir()
    reply = await client.call_tool("getWorkspaceFolders", {})
    assert reply.is_error
    assert (
        text_of(reply) == "getWorkspaceFolders: Neovim's working directory was removed; :cd to another, then try again"
    )
    nvim.lua("vim.cmd.cd(...)", str(files))
    assert json_of(await client.call_tool("getWorkspaceFolders", {}))["rootPath"] == str(files)


# --- openFile ---------------------------------------------------------------------------------


def window_buffers(nvim: NeovimProcess) -> list[str]:
    return list(
        nvim.lua(
            "local t = {} for _, w in ipairs(vim.api.nvim_tabpage_list_wins(0)) do "
            "local b = vim.api.nvim_win_get_buf(w) t[#t+1] = vim.bo[b].buftype == 'terminal' and 'terminal' "
            "or vim.api.nvim_buf_get_name(b) end return t"
        )
    )


async def test_open_file_selects_lines_in_the_main_window_never_the_terminal(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    nvim.edit(files / "b.txt")
    nvim.command("botright split | terminal")  # the agent's terminal, current
    path = files / "a.py"
    reply = await client.call_tool("openFile", {"filePath": str(path), "startLine": 2, "endLine": 4})
    assert text_of(reply) == f"Opened file: {path} (selected lines 2-4)"
    assert window_buffers(nvim) == [str(path), "terminal"]
    wait_for(nvim, lambda n: n.api.get_mode()["mode"] == "V")
    current = await selection(client)
    assert (current["filePath"], current["selection"]) == (str(path), span((1, 0), (3, 3)))


async def test_open_file_beside_unsaved_text_that_cannot_be_hidden(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """With 'nohidden', the window of a modified buffer cannot take another: a split can."""
    edited = files / "b.txt"
    nvim.edit(edited)
    nvim.lua("vim.o.hidden = false vim.api.nvim_buf_set_lines(0, 0, 1, false, {'unsaved'})")
    try:
        path = files / "a.py"
        reply = await client.call_tool("openFile", {"filePath": str(path)})
        assert not reply.is_error and text_of(reply) == f"Opened file: {path}"
        assert window_buffers(nvim) == [str(path), str(edited)]
        assert nvim.lua("return vim.api.nvim_buf_get_lines(vim.fn.bufnr(...), 0, 1, false)", str(edited)) == ["unsaved"]
    finally:
        nvim.lua("vim.o.hidden = true")


async def test_open_file_never_lands_in_a_diff_view(client: Client, nvim: NeovimProcess, files: Path) -> None:
    nvim.edit(files / "b.txt")
    path = files / "a.py"
    proposal = {"old_file_path": str(path), "new_file_path": str(path), "new_file_contents": "x\n", "tab_name": "wait"}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(client.call_tool, "openDiff", proposal)
        with anyio.fail_after(10):  # the view is up, its proposal current
            while "(proposed)" not in nvim.lua("return vim.api.nvim_buf_get_name(0)"):
                await anyio.sleep(0.02)
        reply = await client.call_tool("openFile", {"filePath": str(path)})
        assert text_of(reply) == f"Opened file: {path}"
        assert window_buffers(nvim) == [str(path)]  # in the first tab page's window
        diff_tab = "return vim.tbl_map(vim.api.nvim_tabpage_list_wins, vim.api.nvim_list_tabpages())"
        assert [len(windows) for windows in nvim.lua(diff_tab)] == [1, 2]  # the view as it was
        nvim.command("tabnext 2 | tabonly")  # the view alone: the file gets a tab page of its own
        reply = await client.call_tool("openFile", {"filePath": str(files / "b.txt")})
        assert window_buffers(nvim) == [str(files / "b.txt")]
        assert nvim.lua("return {#vim.api.nvim_list_tabpages(), vim.wo.diff}") == [2, False]
        assert text_of(await client.call_tool("closeAllDiffTabs", {})) == "CLOSED_1_DIFF_TABS"
    assert nvim.lua("return #vim.api.nvim_list_tabpages()") == 1


async def test_open_file_selects_from_start_text_to_end_text(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = str(files / "b.txt")
    reply = await client.call_tool("openFile", {"filePath": path, "startText": "beta", "endText": "del"})
    assert text_of(reply) == f"Opened file: {path} (selected lines 1-2)"
    wait_for(nvim, lambda n: n.api.get_mode()["mode"] == "v")
    assert (await selection(client))["text"] == "beta\ngamma del"
    reply = await client.call_tool(
        "openFile", {"filePath": path, "startText": "gamma", "endText": "nope", "selectToEndOfLine": True}
    )
    assert text_of(reply) == f"Opened file: {path} (selected line 2; endText not found after startText)"
    wait_for(nvim, lambda n: n.api.get_mode()["mode"] == "v")
    assert (await selection(client))["text"] == "gamma delta"
    nvim.command("set selection=exclusive")  # the cursor's character is not in the selection
    try:
        for ask, text in (({"endText": "del"}, "beta\ngamma del"), ({"selectToEndOfLine": True}, "beta")):
            await client.call_tool("openFile", {"filePath": path, "startText": "beta"} | ask)
            wait_for(nvim, lambda n: n.api.get_mode()["mode"] == "v")
            assert (await selection(client))["text"] == text
    finally:
        nvim.command("set selection&")
    reply = await client.call_tool("openFile", {"filePath": path, "startText": "zeta", "endText": ""})
    assert text_of(reply) == f"Opened file: {path} (startText not found; nothing selected)"
    wait_for(nvim, lambda n: n.api.get_mode()["mode"] == "n")  # as it says: the last one is gone
    assert (await selection(client))["text"] == ""


async def test_open_file_not_frontmost_only_loads_it(client: Client, nvim: NeovimProcess, files: Path) -> None:
    nvim.edit(files / "b.txt")
    path = str(files / "a.py")
    reply = json_of(await client.call_tool("openFile", {"filePath": path, "makeFrontmost": False}))
    assert reply == {"success": True, "filePath": path, "languageId": "python", "lineCount": 4}
    assert window_buffers(nvim) == [str(files / "b.txt")]
    assert [tab["label"] for tab in json_of(await client.call_tool("getOpenEditors", {}))["tabs"]] == ["b.txt", "a.py"]


async def test_a_line_out_of_range_is_named_with_the_value_given(client: Client, files: Path) -> None:
    reply = await client.call_tool("openFile", {"filePath": str(files / "a.py"), "startLine": 0})
    assert reply.is_error
    assert text_of(reply) == "Invalid arguments for openFile: startLine: expected int >= 1, got 0"


async def test_open_file_of_a_missing_file_is_an_error(client: Client, nvim: NeovimProcess, files: Path) -> None:
    path = str(files / "missing.py")
    reply = await client.call_tool("openFile", {"filePath": path})
    assert reply.is_error
    assert text_of(reply) == f"File not found: {path}"
    assert window_buffers(nvim) == [""]
    reply = await client.call_tool("openFile", {"filePath": str(files), "makeFrontmost": False})
    assert reply.is_error
    assert text_of(reply) == f"File not found: {files} is a directory"
    assert window_buffers(nvim) == [""]
    os.mkfifo(fifo := files / "fifo")  # reading it would block Neovim until someone writes to it
    for frontmost in (True, False):
        reply = await client.call_tool("openFile", {"filePath": str(fifo), "makeFrontmost": frontmost})
        assert reply.is_error
        assert text_of(reply) == f"Cannot open {fifo}: it is not a regular file (a fifo)"
    assert window_buffers(nvim) == [""]
    assert not (await client.call_tool("getOpenEditors", {})).is_error  # Neovim is free


async def test_open_file_leaves_the_users_own_diff_alone(client: Client, nvim: NeovimProcess, files: Path) -> None:
    (files / "c.txt").write_text("alpha beta\ngamma\n")
    nvim.command(f"edit {files / 'b.txt'} | vertical diffsplit {files / 'c.txt'}")
    reply = await client.call_tool("openFile", {"filePath": str(files / "a.py")})
    assert text_of(reply) == f"Opened file: {files / 'a.py'}"
    assert sorted(window_buffers(nvim)) == sorted(str(files / name) for name in ("a.py", "b.txt", "c.txt"))
    nvim.command("only | edit " + str(files / "b.txt") + " | vertical diffsplit " + str(files / "c.txt"))
    reply = await client.call_tool("openFile", {"filePath": str(files / "b.txt")})  # shown there already
    assert sorted(window_buffers(nvim)) == sorted(str(files / name) for name in ("b.txt", "c.txt"))


# --- closeAllDiffTabs, and the journal --------------------------------------------------------


async def test_close_all_diff_tabs_closes_none_while_there_are_none(
    client: Client, nvim: NeovimProcess, tmp_path: Path
) -> None:
    assert text_of(await client.call_tool("closeAllDiffTabs", {})) == "CLOSED_0_DIFF_TABS"
    # an agent calls it at the start of every turn: it needs no Neovim, and waits for none
    async with toolbus(tmp_path / "journal.db", str(tmp_path / "no-nvim.sock")) as alone:
        assert text_of(await alone.call_tool("closeAllDiffTabs", {})) == "CLOSED_0_DIFF_TABS"


async def test_each_call_is_journaled_with_its_outcome(
    client: Client, nvim: NeovimProcess, files: Path, journal: JournalReader
) -> None:
    before = len(journal.commands())
    path = str(files / "a.py")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("getCurrentSelection", {}),
        ("getLatestSelection", {}),
        ("getDiagnostics", {}),
        ("getDiagnostics", {"uri": (files / "nowhere.py").as_uri()}),
        ("getDiagnostics", {"uri": "a.py"}),
        ("getWorkspaceFolders", {}),
        ("openFile", {"filePath": path}),
        ("openFile", {"filePath": path + ".missing"}),
        ("closeAllDiffTabs", {}),
    ]
    for tool, arguments in calls:
        await client.call_tool(tool, arguments)
    rows = journal.commands()[before:]
    assert [(row["tool"], row["status"]) for row in rows] == [
        ("getCurrentSelection", "ok"),
        ("getLatestSelection", "ok"),
        ("getDiagnostics", "ok"),
        ("getDiagnostics", "failed"),
        ("getDiagnostics", "rejected"),
        ("getWorkspaceFolders", "ok"),
        ("openFile", "ok"),
        ("openFile", "failed"),
        ("closeAllDiffTabs", "ok"),
    ]
    assert rows[4]["error"] == (
        'Invalid arguments for getDiagnostics: uri: expected a file:// URI of an absolute path, got "a.py"'
    )
    assert rows[7]["error"] == f"File not found: {path}.missing"
    assert all(row["finished_at"] for row in rows)


async def test_a_name_that_is_not_utf8_is_answered_with_a_replacement_character(
    client: Client, nvim: NeovimProcess, files: Path
) -> None:
    """A Latin-1 file name (and the folder Neovim is in): bytes no JSON can carry. Each tool
    that names it answers, with U+FFFD in its place, instead of failing the call."""
    folder = os.fsencode(files / "d") + b"\xe9"
    os.mkdir(folder)
    name = folder + b"/caf\xe9.txt"
    with open(name, "wb") as file:
        file.write(b"caf\xe9\n")
    nvim.lua(
        "local folder, name = ... vim.cmd.cd(vim.fn.fnameescape(folder)) vim.cmd.edit(vim.fn.fnameescape(name))",
        folder,
        name,
    )
    shown = f"{files}/d\ufffd/caf\ufffd.txt"
    [tab] = json_of(await client.call_tool("getOpenEditors", {}))["tabs"]
    assert tab["label"] == "caf\ufffd.txt" and tab["uri"].lower().endswith("/d%e9/caf%e9.txt")  # a URI keeps the bytes
    assert (await selection(client))["filePath"] == shown
    user_types(nvim, "ggv$", "v")  # its text is Latin-1 too, which Neovim reads as such
    assert (await selection(client))["text"] == "café"
    user_types(nvim, "<Esc>")
    folders = json_of(await client.call_tool("getWorkspaceFolders", {}))
    assert folders["rootPath"] == f"{files}/d\ufffd"
