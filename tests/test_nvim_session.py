"""The msgpack-RPC session `NvimEditor` speaks to a real Neovim: errors, bytes, timeouts,
Neovim's own requests, and a caller's cancellation."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from tests.conftest import NeovimProcess
from toolbus.adapters.nvim import NvimAddress, NvimEditor, NvimRequestError
from toolbus.bus import EditorTimeout, EditorUnavailable

pytestmark = pytest.mark.anyio


def editor_for(nvim: NeovimProcess, timeout: float = 5.0) -> NvimEditor:
    return NvimEditor(lambda: NvimAddress(nvim.address, "test"), timeout)


async def test_a_lua_error_is_a_request_error_naming_it(nvim: NeovimProcess) -> None:
    editor = editor_for(nvim)
    try:
        with pytest.raises(NvimRequestError, match="no such thing"):
            await editor.request("nvim_exec_lua", "error('no such thing')", [])
        assert await editor.request("nvim_eval", "1 + 1") == 2  # the session goes on
    finally:
        editor.disconnect()


async def test_bytes_that_are_not_utf8_survive_the_round_trip(nvim: NeovimProcess) -> None:
    editor = editor_for(nvim)
    text = b"caf\xe9 \xff\x00 end"
    try:
        echoed = await editor.request("nvim_exec_lua", "return ...", [text])
        assert echoed.encode("utf-8", "surrogateescape") == text
        assert await editor.request("nvim_exec_lua", "return #...", [text]) == len(text)
    finally:
        editor.disconnect()


async def test_a_request_from_neovim_is_refused_not_left_hanging(nvim: NeovimProcess) -> None:
    editor = editor_for(nvim)
    try:
        channel = (await editor.request("nvim_get_api_info"))[0]
        ok, error = await editor.request(
            "nvim_exec_lua", "local ok, err = pcall(vim.rpcrequest, ..., 'hello') return {ok, err}", [channel]
        )
        assert ok is False and "toolbus serves no requests" in error
    finally:
        editor.disconnect()


async def test_a_blocked_request_times_out_and_neovim_is_freed(nvim: NeovimProcess) -> None:
    editor = editor_for(nvim, timeout=0.5)
    try:
        with anyio.fail_after(30), pytest.raises(EditorTimeout):
            await editor.request("nvim_command", "while 1 | endwhile")  # interruptible, as Vimscript is
        with anyio.fail_after(30):
            await editor.settle()  # the timeout is answered first; the interrupt follows in the background
            assert await editor.request("nvim_eval", "2 + 2") == 4  # interrupted, reconnected
    finally:
        editor.disconnect()


async def test_a_cancelled_caller_is_cancelled_not_timed_out(nvim: NeovimProcess) -> None:
    editor = editor_for(nvim, timeout=30)
    outcome: list[BaseException] = []

    async def held() -> None:
        try:
            await editor.request("nvim_exec_lua", "vim.wait(2000, function() return false end)", [])
        except BaseException as error:
            outcome.append(error)
            raise

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(held)
                await anyio.sleep(0.2)
                group.cancel_scope.cancel()
        assert outcome and not isinstance(outcome[0], TimeoutError | EditorTimeout)
    finally:
        editor.disconnect()


async def test_no_neovim_at_the_address_is_unavailable(tmp_path: Path) -> None:
    editor = NvimEditor(lambda: NvimAddress(str(tmp_path / "nobody.sock"), "test"), 1.0)
    with anyio.fail_after(30), pytest.raises(EditorUnavailable, match="not reachable"):
        await editor.request("nvim_eval", "1")


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
async def test_a_port_past_tcps_range_is_unavailable_never_another_port(port: str) -> None:
    """The system would take 99999 modulo 65536, and connect to port 34463."""
    editor = NvimEditor(lambda: NvimAddress(f"127.0.0.1:{port}", "test"), 1.0)
    with anyio.fail_after(30), pytest.raises(EditorUnavailable, match=f"port {port} is not a TCP port"):
        await editor.request("nvim_eval", "1")


@contextmanager
def a_port_that_never_answers() -> Iterator[int]:
    """A TCP port whose connections neither succeed nor fail: a listener with a backlog of one,
    filled, so the system drops every further connection's SYN (a host dropping packets)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = [socket.socket() for _ in range(3)]
    for filler in fillers:
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
    try:
        yield port
    finally:
        for sock in [*fillers, listener]:
            sock.close()


async def test_calls_waiting_on_an_unanswered_connection_share_its_failure() -> None:
    """Three calls at once to a Neovim whose connections hang: one try, whose failure all three
    answer with, rather than a try each, one after the other (the last waiting three timeouts)."""
    with a_port_that_never_answers() as port:
        tries: list[str] = []

        def locate() -> NvimAddress:
            tries.append("try")
            return NvimAddress(f"127.0.0.1:{port}", "test")

        editor = NvimEditor(locate, 0.5)
        failures: list[BaseException] = []

        async def call() -> None:
            try:
                await editor.request("nvim_eval", "1")
            except EditorUnavailable as error:
                failures.append(error)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as calls:
                for _ in range(3):
                    calls.start_soon(call)
    assert len(failures) == 3 and all("not reachable (TimeoutError)" in str(f) for f in failures), failures
    assert tries == ["try"]


async def test_a_host_name_no_lookup_takes_is_unavailable() -> None:
    editor = NvimEditor(lambda: NvimAddress("a" * 70 + ":6666", "test"), 1.0)
    with anyio.fail_after(30), pytest.raises(EditorUnavailable, match="not reachable"):
        await editor.request("nvim_eval", "1")
