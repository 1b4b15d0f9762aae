"""The user's Neovim, over its own msgpack-RPC socket (pynvim).

pynvim is synchronous and not thread-safe, so each connection lives on one dedicated thread
and every request carries a timeout. A request that times out abandons its connection (the
thread finishes whenever Neovim answers) and a second connection interrupts what blocked
Neovim; the next call connects afresh. Connections are made lazily and re-made when Neovim
restarts.
"""

from __future__ import annotations

import asyncio
import glob
import hashlib
import logging
import os
import queue
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal, TypeVar

import anyio
import msgspec
import pynvim

from bus import EditorLost, EditorTimeout, EditorUnavailable
from handlers.ports import OpenEditor, SaveOutcome, TabMatch

log = logging.getLogger("toolbus.nvim")

T = TypeVar("T")
NvimCall = Callable[[pynvim.Nvim], T]

DEFAULT_TIMEOUT = 5.0
LUA_SOURCE = resources.files("adapters").joinpath("nvim.lua").read_text()
# Versioned by content, so toolbus processes of different versions can share one Neovim.
LUA_MODULE = "toolbus_" + hashlib.sha256(LUA_SOURCE.encode()).hexdigest()[:12]
_LOAD_LUA = f"_G[{LUA_MODULE!r}] = (function(...)\n{LUA_SOURCE}\nend)()"
_MISSING = "\x00toolbus-lua-missing"

_CONNECTION_ERRORS = (OSError, EOFError)


# --- finding Neovim ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvimAddress:
    """Where Neovim listens, and how toolbus found out."""

    address: str
    source: str  # "--nvim", "$TOOLBUS_NVIM", "$NVIM" or "discovered"


def find_nvim(explicit: str | None, env: Mapping[str, str] | None = None) -> NvimAddress | None:
    """`--nvim`, then `$TOOLBUS_NVIM`, then `$NVIM`, then a running Neovim's socket."""
    env = os.environ if env is None else env
    for value, source in (
        (explicit, "--nvim"),
        (env.get("TOOLBUS_NVIM"), "$TOOLBUS_NVIM"),
        (env.get("NVIM"), "$NVIM"),
    ):
        if value:
            return NvimAddress(value, source)
    found = discover_sockets(env)
    return NvimAddress(found, "discovered") if found else None


def discover_sockets(env: Mapping[str, str]) -> str | None:
    """The socket of a running Neovim, preferring one whose cwd contains ours."""
    sockets = [path for path in _socket_candidates(env) if _answers(path)]
    if not sockets:
        return None
    here = os.getcwd()
    for path in sockets:
        cwd = _ask_cwd(path)
        if cwd and (here == cwd or here.startswith(cwd.rstrip("/") + "/")):
            return path
    return sockets[0]


def _socket_candidates(env: Mapping[str, str]) -> list[str]:
    # Neovim's default server address is stdpath('run')/nvim.<pid>.0: $XDG_RUNTIME_DIR,
    # or a private directory under the temp dir.
    user = env.get("USER") or env.get("LOGNAME") or str(os.getuid())
    patterns = [os.path.join(tempfile.gettempdir(), f"nvim.{user}", "*", "nvim.*.0")]
    if runtime := env.get("XDG_RUNTIME_DIR"):
        patterns.insert(0, os.path.join(runtime, "nvim.*.0"))
    found = [path for pattern in patterns for path in glob.glob(pattern)]
    return sorted(found, key=_mtime, reverse=True)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _answers(path: str) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _ask_cwd(path: str) -> str | None:
    return blocking_request(path, lambda nvim: str(nvim.funcs.getcwd()), timeout=1.0)


def blocking_request(address: str, call: NvimCall[T], timeout: float) -> T | None:
    """One request on a throwaway connection from synchronous code (discovery, doctor):
    on a thread of its own, so a blocked Neovim costs `timeout`, never a hang. None on failure."""
    answer: list[T] = []

    def ask() -> None:
        with attach(address) as nvim:
            answer.append(call(nvim))

    worker = threading.Thread(target=_quietly, args=(ask,), name="toolbus-nvim-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0] if answer else None


def _quietly(work: Callable[[], None]) -> None:
    try:
        work()
    except Exception:
        log.debug("Neovim probe failed", exc_info=True)


def attach(address: str) -> pynvim.Nvim:
    """Connect to a Neovim address: a socket path, or `host:port` for TCP."""
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "/" not in address:
        return pynvim.attach("tcp", address=host, port=int(port))
    return pynvim.attach("socket", path=address)


# --- one connection on its own thread ---------------------------------------------------


class _Connection:
    """A pynvim session confined to one daemon thread, fed through a queue."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.alive = True
        self.used = False  # has answered at least one request
        self._requests: queue.SimpleQueue[
            tuple[NvimCall[Any], asyncio.Future[Any], asyncio.AbstractEventLoop] | None
        ]
        self._requests = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=f"toolbus-nvim {address}", daemon=True).start()

    def submit(self, call: NvimCall[T]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._requests.put((call, future, loop))
        return future

    def abandon(self) -> None:
        """Stop taking requests; the thread ends once Neovim answers the one in flight."""
        self.alive = False
        self._requests.put(None)

    def _serve(self) -> None:
        nvim: pynvim.Nvim | None = None
        try:
            while (item := self._requests.get()) is not None:
                call, future, loop = item
                try:
                    if nvim is None:
                        nvim = attach(self.address)
                    result: Any = call(nvim)
                    self.used = True
                except BaseException as error:  # delivered to the awaiting call
                    if isinstance(error, _CONNECTION_ERRORS):
                        self.alive = False
                    loop.call_soon_threadsafe(_settle, future, None, error)
                    if not self.alive:
                        return
                else:
                    loop.call_soon_threadsafe(_settle, future, result, None)
        finally:
            self.alive = False
            if nvim is not None:
                try:
                    nvim.close()
                except Exception:
                    log.debug("closing the Neovim connection failed", exc_info=True)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (timeout)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


# --- the Editor adapter ----------------------------------------------------------------


FileClosed = Literal["closed", "not_open", "modified"]  # what `NvimEditor.close_file` did


class FileReplaced(msgspec.Struct, frozen=True, kw_only=True):
    """What `NvimEditor.replace_file` did."""

    status: Literal["written", "modified", "error"]  # modified: a buffer has unsaved changes
    message: str = ""
    kept: str | None = None  # where what the file held was copied (`path.~N~`), if it was


class NvimEditor:
    """`handlers.ports.Editor` on a real Neovim."""

    def __init__(self, locate: Callable[[], NvimAddress | None], timeout: float = DEFAULT_TIMEOUT) -> None:
        self._locate = locate
        self.timeout = timeout
        self._connection: _Connection | None = None

    # Editor protocol

    async def open_editors(self) -> list[OpenEditor]:
        tabs = await self._lua("list")
        return msgspec.convert(tabs or [], list[OpenEditor])

    async def is_dirty(self, path: str) -> bool | None:
        result = await self._lua("dirty", path)
        return None if result is None else bool(result)

    async def save(self, path: str) -> SaveOutcome:
        return msgspec.convert(_to_bytes(await self._lua("save", path), ("before", "after")), SaveOutcome)

    async def find_tab(self, tab_name: str, path: str | None) -> TabMatch:
        return msgspec.convert(
            _to_bytes(await self._lua("find_tab", tab_name, path), ("discarded",)), TabMatch
        )

    async def wipe(self, buffer: int, tick: int) -> bool:
        return bool(await self._lua("wipe", buffer, tick))

    # `toolbus replay editor`: not part of the Editor protocol, no MCP tool does this

    async def replace_file(self, path: str, text: bytes, known: Sequence[bytes] = ()) -> FileReplaced:
        """Write `text` to `path` byte for byte and show it in a buffer reloaded from it. A file
        holding anything but `text` or one of `known` is copied to `path.~N~` first. Nothing
        is done when a buffer of `path` has unsaved changes."""
        return msgspec.convert(await self._lua("replace", path, text, list(known)), FileReplaced)

    async def close_file(self, path: str) -> FileClosed:
        """Wipe the buffer of `path`, unless it has unsaved changes."""
        return msgspec.convert(await self._lua("close", path), FileClosed)

    # plumbing

    async def _lua(self, function: str, *args: Any) -> Any:
        code = f"local m = _G[{LUA_MODULE!r}] if not m then return {_MISSING!r} end return m.{function}(...)"

        def call(nvim: pynvim.Nvim) -> Any:
            result = nvim.exec_lua(code, *args)
            if result == _MISSING:
                nvim.exec_lua(_LOAD_LUA)
                result = nvim.exec_lua(code, *args)
            return result

        return await self.request(call)

    async def request(self, call: NvimCall[T]) -> T:
        """Run `call(nvim)` on the connection's thread, within the timeout; reconnect once
        if a connection that used to work has gone (Neovim restarted)."""
        connection = await self._connect()
        try:
            return await self._await(connection, call)
        except EditorUnavailable:
            if not connection.used:
                raise
        # The connection that used to work is gone: Neovim restarted (the request then never
        # reached the new one) or died while answering (and so did its buffers).
        log.info("Neovim connection to %s lost; reconnecting", connection.address)
        try:
            return await self._await(await self._connect(), call)
        except EditorUnavailable as error:
            raise EditorLost(f"{error} (the connection broke while a request was in flight)") from None

    async def _connect(self) -> _Connection:
        if self._connection is None or not self._connection.alive:
            # Discovery probes sockets with blocking pynvim calls: keep them off the event loop.
            found = await anyio.to_thread.run_sync(self._locate)
            if found is None:
                raise EditorUnavailable(
                    "No Neovim found: start Neovim with --listen ADDRESS (or from a Neovim :terminal), "
                    "then pass that address with --nvim or $TOOLBUS_NVIM (see :echo v:servername in Neovim)"
                )
            self._connection = _Connection(found.address)
        return self._connection

    async def _await(self, connection: _Connection, call: NvimCall[T]) -> T:
        future = connection.submit(call)
        try:
            with anyio.fail_after(self.timeout):
                return await future
        except TimeoutError:
            connection.abandon()
            await self._unblock(connection.address)
            raise EditorTimeout(
                f"Neovim at {connection.address} did not answer within {self.timeout:g} s "
                "(a prompt or a long command was blocking it; toolbus interrupted it). "
                "The request may still run once Neovim is free; check, then try again, "
                "or raise --nvim-timeout if Neovim is just slow"
            ) from None
        except _CONNECTION_ERRORS as error:
            connection.abandon()
            raise EditorUnavailable(
                f"Neovim at {connection.address} is not reachable ({error}): is it running? "
                "Check the address with :echo v:servername and pass it with --nvim or $TOOLBUS_NVIM"
            ) from None

    async def _unblock(self, address: str) -> None:
        """From fresh connections: dismiss a prompt, or interrupt a long-running command."""
        mode = await _ask(address, lambda nvim: nvim.request("nvim_get_mode"), timeout=0.5)
        name = str(mode.get("mode", "")) if isinstance(mode, dict) else ""
        if mode is None or name.startswith("n"):
            keys = "<C-c>"  # busy (too busy even to tell its mode): interrupt it
        elif mode.get("blocking") or name.startswith(("r", "c")):
            keys = "<Esc>"  # a prompt, input() or a cmdline wait: cancel it
        else:
            return
        if await _ask(address, lambda nvim: nvim.input(keys), timeout=1.0) is None:
            log.warning("could not interrupt Neovim at %s", address)

    def disconnect(self) -> None:
        if self._connection is not None:
            self._connection.abandon()


async def _ask(address: str, call: NvimCall[T], timeout: float) -> T | None:
    """One request on a short-lived connection of its own; None if it fails or takes too long."""
    connection = _Connection(address)
    try:
        with anyio.fail_after(timeout):
            return await connection.submit(call)
    except Exception:
        return None
    finally:
        connection.abandon()


def _to_bytes(result: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """Lua strings arrive as `str` (surrogate-escaped); file text belongs in bytes."""
    converted = dict(result)
    for name in fields:
        value = converted.get(name)
        if isinstance(value, str):
            converted[name] = value.encode("utf-8", "surrogateescape")
    return converted
