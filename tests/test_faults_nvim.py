"""Neovim faults: killed during a call, blocked inside a request, prompting the user, restarted.

Every wait is bounded by an outer `anyio.fail_after` so a test can never hang; the assertions
are about results (an error result, a usable Neovim, a next call that works), not durations.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult

from tests.conftest import NeovimProcess, json_of, text_of, toolbus
from tests.faults_helpers import assert_reachable, assert_sound, journal_state, ready, rows, wait_until
from tests.rpc_client import RpcError, StdioServer, clean_env, toolbus_argv
from toolbus.adapters import nvim as nvim_adapter
from toolbus.adapters.nvim import NvimAddress, NvimEditor
from toolbus.bus import EditorTimeout, EditorUnavailable, ToolbusError
from toolbus.bus.messagebus import CANCELLED
from toolbus.handlers.ports import DiffRequest

pytestmark = pytest.mark.anyio

GENEROUS = 60  # seconds: far above --nvim-timeout; only there so nothing can hang


@pytest.fixture
def nvim(nvim: NeovimProcess) -> NeovimProcess:
    return ready(nvim)


def open_file(nvim: NeovimProcess, files: Path, name: str = "a.py") -> Path:
    path = files / name
    path.write_text("value = 1\n")
    nvim.edit(path)
    return path


def attach_ui(nvim: NeovimProcess) -> None:
    """Make the test's connection a UI, so prompts wait for a person as in a real editor."""
    nvim.call(lambda n: n.request("nvim_ui_attach", 80, 24, {"rgb": True}))


def usable(nvim: NeovimProcess) -> bool:
    answer: object = nvim.call(lambda n: n.eval("1 + 1"), timeout=10)
    return answer == 2


async def wait_for_write_ahead(journal: Path, tool: str) -> None:
    """Until `tool`'s write-ahead row (status in_doubt) is in the journal: the call is in Neovim."""
    while not journal_state(journal).commands_with("in_doubt", tool):
        await anyio.sleep(0.02)


async def dirty(client: Client, path: Path) -> bool:
    reply = json_of(await client.call_tool("checkDocumentDirty", {"filePath": str(path)}))
    assert reply["success"] is True
    return bool(reply["isDirty"])


async def test_neovim_killed_during_a_call_is_an_error_and_the_server_lives_on(
    journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    path = open_file(nvim, files)
    nvim.command("autocmd BufWritePre * sleep 30")  # holds the save inside Neovim
    with anyio.fail_after(GENEROUS):
        async with toolbus(journal_path, nvim.address, "--nvim-timeout", "10") as client:
            async with anyio.create_task_group() as group:
                results = []

                async def held_save() -> None:
                    results.append(await client.call_tool("saveDocument", {"filePath": str(path)}))

                group.start_soon(held_save)
                await wait_for_write_ahead(journal_path, "saveDocument")
                nvim.kill()
            [result] = results
            assert result.is_error and "Neovim" in text_of(result)
            saved = json_of(await client.call_tool("save", {"title": "still here", "text": "after the kill"}))
            assert saved["success"] is True
            nvim.start()
            path = open_file(ready(nvim), files)
            assert await dirty(client, path) is False
            reply = json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))
            assert reply["saved"] is True
    state = assert_sound(journal_path)
    assert [c["tool"] for c in state.commands] == [
        "saveDocument",
        "save",
        "checkDocumentDirty",
        "saveDocument",
    ]
    # Neovim died mid-request: the save may or may not have happened, and the journal says so.
    assert state.commands[0]["status"] in ("in_doubt", "failed")


@pytest.mark.parametrize(
    "keys",
    [':call confirm("Overwrite?", "&Yes\\n&No")<CR>', ':let g:name = input("Name? ")<CR>', ":sleep 60<CR>"],
    ids=["confirm", "input", "sleep"],
)
async def test_a_prompt_the_user_started_never_blocks_a_call(
    journal_path: Path, nvim: NeovimProcess, files: Path, keys: str
) -> None:
    path = open_file(nvim, files)
    attach_ui(nvim)
    with anyio.fail_after(GENEROUS):
        async with toolbus(journal_path, nvim.address, "--nvim-timeout", "1") as client:
            nvim.call(lambda n: n.input(keys))  # typed, as the user would: returns at once
            # Neovim 0.11 answers RPC while it waits at a prompt or sleeps; if a prompt did
            # block it, the call would be an error after the timeout. Either way: an answer.
            for tool in ("checkDocumentDirty", "saveDocument", "getOpenEditors"):
                result = await client.call_tool(tool, {} if tool == "getOpenEditors" else {"filePath": str(path)})
                assert result.is_error or text_of(result).startswith("{")
            assert usable(nvim)
            nvim.call(lambda n: n.input("<Esc>"))
            assert await dirty(client, path) is False
    assert_sound(journal_path)


@pytest.mark.parametrize(
    "blocker",
    ['call confirm("Really write?", "&Yes\\n&No")', "sleep 60"],
    ids=["confirm-in-BufWritePre", "sleep-in-BufWritePre"],
)
async def test_a_request_blocked_inside_neovim_times_out_and_neovim_recovers(
    journal_path: Path, nvim: NeovimProcess, files: Path, blocker: str
) -> None:
    path = open_file(nvim, files)
    attach_ui(nvim)
    nvim.command(f"autocmd BufWritePre * {blocker}")
    with anyio.fail_after(GENEROUS):
        async with toolbus(journal_path, nvim.address, "--nvim-timeout", "1") as client:
            result = await client.call_tool("saveDocument", {"filePath": str(path)})
            assert result.is_error and "did not answer" in text_of(result)
            assert usable(nvim)  # toolbus interrupted what blocked it, from a second connection
            nvim.command("autocmd! BufWritePre")
            assert await dirty(client, path) is False
            assert json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))["saved"] is True
    state = assert_sound(journal_path)
    assert [c["status"] for c in state.commands] == ["in_doubt", "ok", "ok"]


@pytest.mark.heavy
async def test_one_server_survives_a_run_of_neovim_faults(journal_path: Path, nvim: NeovimProcess, files: Path) -> None:
    path = open_file(nvim, files)
    calls = 0
    with anyio.fail_after(GENEROUS * 3):
        async with toolbus(journal_path, nvim.address, "--nvim-timeout", "1") as client:
            for round_index in range(3):
                assert await dirty(client, path) is False
                nvim.kill()  # gone while idle
                result = await client.call_tool("getOpenEditors", {})
                assert result.is_error
                nvim.start()
                path = open_file(ready(nvim), files)
                nvim.occupy()  # busy: interrupted by toolbus
                result = await client.call_tool("checkDocumentDirty", {"filePath": str(path)})
                assert result.is_error and "did not answer" in text_of(result)
                assert usable(nvim)
                nvim.set_lines(path, [f"round = {round_index}"])
                assert await dirty(client, path) is True
                assert json_of(await client.call_tool("saveDocument", {"filePath": str(path)}))["saved"]
                assert path.read_text() == f"round = {round_index}\n"
                calls += 5
    state = assert_sound(journal_path)
    assert len(state.commands) == calls
    assert len(state.commands_with("ok", "saveDocument")) == 3


async def test_the_answer_does_not_wait_for_the_interrupt(
    nvim: NeovimProcess, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller hears of the timeout at once; unblocking Neovim happens after, on its own."""
    path = open_file(nvim, files)
    released = anyio.Event()
    interrupts: list[str] = []

    async def slow_ask(address: str, method: str, *args: Any, timeout: float) -> Any:
        interrupts.append(method)
        await released.wait()  # an interrupt that takes as long as it takes
        return None

    monkeypatch.setattr(nvim_adapter, "_ask", slow_ask)
    editor = NvimEditor(lambda: NvimAddress(nvim.address, "--nvim"), timeout=0.5)
    nvim.occupy(forever=True)  # busy for good
    try:
        with anyio.fail_after(GENEROUS):
            with pytest.raises(EditorTimeout, match="did not answer"):
                await editor.is_dirty(str(path))
            released.set()
            await editor.settle()
        assert interrupts[:1] == ["nvim_get_mode"]
    finally:
        editor.disconnect()


async def test_a_neovim_stuck_in_a_lua_loop_is_reported_and_not_interrupted_again(
    journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    path = open_file(nvim, files)
    nvim.occupy(forever=True)  # <C-c> cannot stop it
    with anyio.fail_after(GENEROUS * 2):
        async with toolbus(journal_path, nvim.address, "--nvim-timeout", "1") as client:
            messages = []
            for _ in range(6):
                result = await client.call_tool("checkDocumentDirty", {"filePath": str(path)})
                assert result.is_error and "did not answer" in text_of(result)
                messages.append(text_of(result))
                if "cannot be interrupted" in messages[-1]:
                    break
            assert "cannot be interrupted" in messages[-1] and "restart" in messages[-1].lower()
            assert "cannot be interrupted" not in messages[0]
            # Known stuck, it is asked a cheap question instead: a call behind waits no timeout,
            # sends nothing, and a save that sent nothing did not happen (not in doubt).
            saved = await client.call_tool("saveDocument", {"filePath": str(path)})
            assert saved.is_error and "cannot be interrupted" in text_of(saved)
            assert "nothing was sent to it" in text_of(saved)
            nvim.restart()  # the user restarts it: the next call works
            path = open_file(ready(nvim), files)
            assert await dirty(client, path) is False
    state = assert_sound(journal_path)
    assert [c["status"] for c in state.commands] == ["failed"] * (len(messages) + 1) + ["ok"]


async def test_a_stuck_neovim_is_sent_no_more_interrupts(nvim: NeovimProcess, files: Path) -> None:
    path = open_file(nvim, files)
    nvim.occupy(forever=True)
    editor = NvimEditor(lambda: NvimAddress(nvim.address, "--nvim"), timeout=0.5)
    try:
        with anyio.fail_after(GENEROUS):
            with pytest.raises(EditorTimeout, match="did not answer") as first:
                await editor.is_dirty(str(path))
            assert "cannot be interrupted" not in str(first.value)
            await editor.settle()  # the interrupt was tried, and failed
            assert nvim.address in editor.stuck
            with pytest.raises(EditorUnavailable, match=r"cannot be interrupted.*nothing was sent"):
                await editor.is_dirty(str(path))
            assert editor.pending_interrupts == 0  # nothing more sent its way
    finally:
        editor.disconnect()


async def call_held_at_a_prompt(
    journal: Path, nvim: NeovimProcess, autocmd: str, tool: str, arguments: dict[str, Any]
) -> CallToolResult:
    """`tool` through a server with a 1 s Neovim timeout, while a prompt in `autocmd` holds Neovim."""
    attach_ui(nvim)
    nvim.command(f'autocmd {autocmd} * call input("Really? ")')
    with anyio.fail_after(GENEROUS):
        async with toolbus(journal, nvim.address, "--nvim-timeout", "1") as client:
            return await client.call_tool(tool, arguments)


async def test_a_write_that_times_out_is_of_unknown_outcome_and_its_replaced_text_is_kept(
    journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    path = open_file(nvim, files)
    nvim.set_lines(path, ["value = 2"])
    result = await call_held_at_a_prompt(journal_path, nvim, "BufWritePre", "saveDocument", {"filePath": str(path)})
    message = text_of(result)
    assert result.is_error and "did not answer" in message
    assert "outcome is unknown" in message and "kept in the journal" in message
    assert "Nothing was written" not in message
    state = assert_sound(journal_path)
    assert [c["status"] for c in state.commands] == ["in_doubt"]
    assert [bytes(r["content"]) for r in rows(journal_path, "SELECT content FROM blobs")] == [b"value = 1\n"]
    # ...and reached as the message says: the file's history names it, recover writes it out
    [doubt] = state.events
    assert (doubt["type"], doubt["stream"]) == ("FileWriteInDoubt", f"file:{path}")
    assert_reachable(journal_path, path, doubt["position"], "may have been written", b"value = 1\n")


def test_a_save_cut_short_by_stopping_the_server_is_of_unknown_outcome_and_reached(
    journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    """SIGTERM while Neovim holds the write at a prompt: the call is finished, shielded, in
    doubt, and answered."""
    path = open_file(nvim, files)
    nvim.set_lines(path, ["value = 2"])
    attach_ui(nvim)
    nvim.command('autocmd BufWritePre * call input("Really? ")')
    argv = toolbus_argv(journal_path, "--nvim-timeout", "30", nvim=nvim.address)
    with StdioServer(argv, env=clean_env()) as server:
        server.initialize()
        save = server.send_request("tools/call", {"name": "saveDocument", "arguments": {"filePath": str(path)}})
        anyio.run(wait_for_write_ahead, journal_path, "saveDocument")
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(RpcError, match="Connection closed"):
            server.wait_for(save)
        assert server.process.wait(timeout=GENEROUS) == 0
    state = assert_sound(journal_path)
    assert [(c["status"], c["error"]) for c in state.commands] == [("in_doubt", CANCELLED)]
    [doubt] = state.events
    assert_reachable(journal_path, path, doubt["position"], "may have been written", b"value = 1\n")


async def test_a_close_that_times_out_is_of_unknown_outcome_and_its_unsaved_text_is_reached(
    journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    path = open_file(nvim, files)
    nvim.set_lines(path, ["value = unsaved"])
    result = await call_held_at_a_prompt(journal_path, nvim, "BufWipeout", "close_tab", {"tab_name": "a.py"})
    assert result.is_error and "did not answer" in text_of(result)
    state = assert_sound(journal_path)
    assert [c["status"] for c in state.commands] == ["in_doubt"]
    [doubt] = state.events
    assert (doubt["type"], doubt["stream"]) == ("TabCloseInDoubt", f"file:{path}")
    assert_reachable(journal_path, path, doubt["position"], "may have been closed", b"value = unsaved\n")


async def test_a_view_whose_close_timed_out_closes_once_neovim_is_free(
    nvim: NeovimProcess, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A view toolbus gives up on while Neovim is still busy (its call ended): the request to
    close it times out, and a request from a connection given up on may never run, so the close
    is left in Neovim, to run once it is free."""

    async def no_interrupt(address: str, method: str, *args: Any, timeout: float) -> Any:
        return None  # the block is the user's, and ends by itself

    monkeypatch.setattr(nvim_adapter, "_ask", no_interrupt)
    path = files / "a.py"
    path.write_text("a\n")
    editor = NvimEditor(lambda: NvimAddress(nvim.address, "--nvim"), timeout=5.0)
    try:
        with anyio.fail_after(GENEROUS):
            request = DiffRequest(path=str(path), old_path=str(path), text=b"proposed\n", tab_name="late")
            view = await editor.open_diff(request)
            editor.timeout = 0.5
            started, ended = files / "started", files / "ended"
            loop = "let t = reltime() | while reltimefloat(reltime(t)) < 3 | endwhile"
            busy = f"call writefile([], '{started}') | {loop} | call writefile([], '{ended}')"
            nvim.call(lambda n: n.command(busy, async_=True))
            while not started.exists():
                await anyio.sleep(0.01)
            await editor.close_diff(view.id)  # timed out: Neovim is still busy
            while not ended.exists():
                await anyio.sleep(0.01)
            await anyio.sleep(1)  # nothing asked of it meanwhile: a request given up on is dropped
            wait_until(lambda: nvim.lua("return #vim.api.nvim_list_tabpages()") == 1, timeout=GENEROUS / 2)
    finally:
        editor.disconnect()


async def test_a_view_toolbus_gave_up_on_while_a_plugin_waited_in_its_opening_is_taken_down(
    nvim: NeovimProcess, files: Path
) -> None:
    """A plugin's autocmd that waits (vim.wait) as the view opens lets Neovim answer other
    requests meanwhile: the open times out, toolbus asks on a new connection to close a view
    that does not exist yet, and drops the old one. The view, once open, would wait for ever
    on a channel nobody reads: it is taken down instead."""
    path = files / "a.py"
    path.write_text("a\n")
    # Once the wait is over, a flag set when Neovim is next free: after the view's opening ended.
    nvim.command(
        "autocmd FileType python ++once lua vim.wait(2000, function() return false end)"
        " vim.schedule(function() vim.g.opening_ended = true end)"
    )
    editor = NvimEditor(lambda: NvimAddress(nvim.address, "--nvim"), timeout=0.5)
    try:
        with anyio.fail_after(GENEROUS):
            request = DiffRequest(path=str(path), old_path=str(path), text=b"proposed\n", tab_name="waited")
            with pytest.raises(ToolbusError):
                await editor.open_diff(request)
            wait_until(lambda: nvim.lua("return vim.g.opening_ended"), timeout=GENEROUS / 2)
            assert nvim.lua("return #vim.api.nvim_list_tabpages()") == 1
            names = nvim.lua("return vim.tbl_map(vim.api.nvim_buf_get_name, vim.api.nvim_list_bufs())")
            assert not [name for name in names if name.startswith("toolbus://")]
    finally:
        editor.disconnect()
