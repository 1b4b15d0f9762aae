"""The user's Neovim, over its own msgpack-RPC socket.

Tool calls speak msgpack-RPC on the event loop (`_Session`); every request carries a timeout.
A request that times out drops its connection, a second connection interrupts what blocked
Neovim, and the next call connects afresh. Connections are made lazily and re-made when
Neovim restarts. Synchronous code (discovery, `toolbus doctor`) uses pynvim on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import glob
import hashlib
import itertools
import logging
import os
import secrets
import threading
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

import anyio
import msgpack
import msgspec
import pynvim

from toolbus.bus import EditorLost, EditorTimeout, EditorUnavailable, OpenFile, ToolbusError
from toolbus.handlers.ports import (
    DiffCloser,
    DiffDecision,
    DiffRequest,
    DiffStaged,
    DiffView,
    FileClosed,
    FileDiagnostics,
    FileOpened,
    FileReplaced,
    OpenEditor,
    SaveOutcome,
    SaveTarget,
    Selection,
    TabMatch,
    WorkspaceFolder,
)

log = logging.getLogger("toolbus.nvim")

T = TypeVar("T")
NvimCall = Callable[[pynvim.Nvim], T]

DEFAULT_TIMEOUT = 5.0
REATTACH_S = 1.0  # how often serve looks for a Neovim gone from an address the user gave
# How long a Neovim found stuck gets to answer a cheap question before a call is refused.
STUCK_PROBE_SECONDS = 0.5
LUA_SOURCE = resources.files(__package__).joinpath("nvim.lua").read_text()
# Versioned by content, so toolbus processes of different versions can share one Neovim.
LUA_MODULE = "toolbus_" + hashlib.sha256(LUA_SOURCE.encode()).hexdigest()[:12]
_LOAD_LUA = f"_G[{LUA_MODULE!r}] = (function(...)\n{LUA_SOURCE}\nend)({LUA_MODULE!r})"
_MISSING = "\x00toolbus-lua-missing"
# Loads the module (and its autocmds: selection tracking) unless this Neovim already has it.
_LOAD_LUA_IF_MISSING = f"if _G[{LUA_MODULE!r}] == nil then {_LOAD_LUA} end"


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
    # Neovim's default server address is stdpath('run')/nvim.<pid>.0: $XDG_RUNTIME_DIR, or a
    # private folder `nvim.<login name>/<random>` in the first temp dir that exists ($TMPDIR,
    # then /tmp).
    private = [os.path.join(glob.escape(os.path.join(tmp, f"nvim.{_login_name()}")), "*") for tmp in _temp_dirs(env)]
    if runtime := env.get("XDG_RUNTIME_DIR"):
        private.insert(0, glob.escape(runtime))
    found = [path for folder in private for path in glob.glob(os.path.join(folder, "nvim.*.0"))]
    return sorted(dict.fromkeys(found), key=_mtime, reverse=True)


def _login_name() -> str:
    """The name Neovim gives its temp folder: the password database's, never $USER (unset in
    containers and CI); the numeric uid when there is none. Slashes become `_`, as Neovim does."""
    import pwd

    try:
        name = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        name = ""
    return (name or str(os.getuid()))[:39].replace("/", "_").replace("\\", "_")


def _temp_dirs(env: Mapping[str, str]) -> list[str]:
    return [tmp for tmp in (env.get("TMPDIR"), "/tmp") if tmp and os.path.isdir(tmp)]


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
    """`probe`, None on failure (discovery)."""
    try:
        return probe(address, call, timeout)
    except ProbeFailed:
        return None


class ProbeFailed(Exception):
    """A Neovim did not answer a probe; the message says how."""


def probe(address: str, call: NvimCall[T], timeout: float) -> T:
    """One request on a throwaway connection from synchronous code (discovery, doctor): on a
    thread of its own, so a blocked Neovim costs `timeout`, never a hang."""
    answer: list[T] = []
    failures: list[Exception] = []

    def ask() -> None:
        try:
            with attach(address) as nvim:
                answer.append(call(nvim))
        except Exception as error:
            log.debug("Neovim probe failed", exc_info=True)
            failures.append(error)

    worker = threading.Thread(target=ask, name="toolbus-nvim-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if answer:
        return answer[0]
    if failures:
        error = failures[0]
        raise ProbeFailed(f"cannot be reached: {error.strerror if isinstance(error, OSError) else error}")
    raise ProbeFailed(f"does not answer within {timeout:g} s")


def attach(address: str) -> pynvim.Nvim:
    """Connect to a Neovim address: a socket path, or `host:port` for TCP."""
    if tcp := _tcp_address(address):
        return pynvim.attach("tcp", address=tcp[0], port=tcp[1])
    return pynvim.attach("socket", path=address)


# --- one msgpack-RPC session on the event loop -------------------------------------------

_REQUEST, _RESPONSE, _NOTIFICATION = 0, 1, 2
Listener = Callable[[str, list[Any]], None]  # a notification from Neovim: method, arguments


class NvimRequestError(Exception):
    """Neovim answered a request with an error (a Lua error, a bad argument)."""


class _Session(asyncio.Protocol):
    """A msgpack-RPC connection to Neovim, written and read on the event loop.

    pynvim runs an event loop of its own, so from asyncio it needs a thread, and each call then
    pays two thread wake-ups: measured, that doubled the cost of a request. Speaking the
    protocol (requests `[0, id, method, args]`, responses `[1, id, error, result]`) here costs
    one socket write and one read, and a blocked Neovim blocks nothing but its own requests.
    """

    def __init__(
        self, address: str, listener: Listener | None = None, on_lost: Callable[[], None] | None = None
    ) -> None:
        self.address = address
        self.used = False  # has answered at least one request
        self.channel: int | None = None  # Neovim's id for this connection, once asked (rpcnotify's target)
        self._listener = listener
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._lost: OSError | None = None
        self._unpacker = msgpack.Unpacker(raw=False, unicode_errors="surrogateescape")
        self._packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape")
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)

    @classmethod
    async def open(
        cls, address: str, listener: Listener | None = None, on_lost: Callable[[], None] | None = None
    ) -> _Session:
        """Connect to a socket path, or to `host:port` over TCP. Raises OSError. `listener` hears
        Neovim's notifications; `on_lost` is called once the connection is gone."""
        session = cls(address, listener, on_lost)
        loop = asyncio.get_running_loop()
        if tcp := _tcp_address(address):
            await loop.create_connection(lambda: session, *tcp)
        else:
            await loop.create_unix_connection(lambda: session, address)
        return session

    @property
    def alive(self) -> bool:
        return self._transport is not None and self._lost is None

    def request(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """Send a request; the future holds its result, or `NvimRequestError`, or an OSError
        once the connection is gone."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._transport is None or self._lost is not None:
            future.set_exception(self._lost or ConnectionError("not connected"))
            return future
        request_id = next(self._ids)
        # Its answer takes it out again, even once its caller has given up (Neovim answers every
        # request), and so does the loss of the connection: a done callback per request would
        # cost every call a turn of the event loop.
        self._pending[request_id] = future
        self._transport.write(self._packer.pack([_REQUEST, request_id, method, args]))
        return future

    def notify(self, method: str, *args: Any) -> None:
        """Send a request that wants no answer: Neovim runs it when it is free, and nothing
        waits for it (or times out on it)."""
        if self._transport is not None and self._lost is None:
            self._transport.write(self._packer.pack([_NOTIFICATION, method, args]))

    def close(self) -> None:
        """Drop the connection; requests in flight fail. Safe after the event loop has closed."""
        if self._transport is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the socket goes with it
                self._transport.abort()
        self._lose(ConnectionAbortedError("toolbus closed the connection"))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = typing.cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lose(
            ConnectionResetError(f"Neovim closed the connection ({exc})" if exc else "Neovim closed the connection")
        )

    def data_received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        for message in self._unpacker:
            self._dispatch(message)

    def _dispatch(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == _RESPONSE:
            _, request_id, error, result = message
            future = self._pending.pop(request_id, None)
            if future is None or future.done():  # its caller gave up
                return
            self.used = True
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(NvimRequestError(_error_text(error)))
        elif kind == _REQUEST and self._transport is not None:  # rpcrequest() to us: nothing to serve
            self._transport.write(self._packer.pack([_RESPONSE, message[1], "toolbus serves no requests", None]))
        elif kind == _NOTIFICATION and self._listener is not None and len(message) == 3:
            # rpcnotify() to us (a user's decision on a diff): no answer, and never an error here.
            try:
                self._listener(str(message[1]), list(message[2] or []))
            except Exception:
                log.exception("could not handle Neovim's notification %r", message[1])

    def _lose(self, error: OSError) -> None:
        if self._lost is not None:
            return
        self._lost = error
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if self._on_lost is not None:
            self._on_lost()


def _tcp_address(address: str) -> tuple[str, int] | None:
    """`(host, port)` for a `host:port` address; None for a socket path. OSError for a port no
    TCP address has (the system would take it modulo 65536)."""
    host, _, port = address.rpartition(":")
    if not (host and port.isdigit() and "/" not in address):
        return None
    if not 0 < int(port) < 65536:
        raise OSError(errno.EINVAL, f"port {port} is not a TCP port (1 to 65535)")
    return host, int(port)


def _error_text(error: Any) -> str:
    """Neovim's error is `[type, message]`."""
    if isinstance(error, list) and len(error) == 2:
        return str(error[1])
    return str(error)


# --- the Editor adapter ----------------------------------------------------------------

DIFF_NOTIFICATION = "toolbus_diff"  # what nvim.lua's diff views rpcnotify() with
# close_tab never wipes a file buffer whose name a diff view had: bounded, as a server lives long.
_KNOWN_DIFF_TABS = 1000


@dataclass(eq=False)
class _Diff:
    """An open diff view, waiting for its decision: on the connection that opened it, since
    Neovim notifies that channel."""

    tab_name: str
    session: _Session
    decided: asyncio.Event = field(default_factory=asyncio.Event)
    decision: DiffDecision | None = None

    def decide(self, decision: DiffDecision) -> bool:
        """The first decision counts; whether this one did."""
        if self.decision is not None:
            return False
        self.decision = decision
        self.decided.set()
        return True


class NvimEditor:
    """`handlers.ports.Editor` on a real Neovim."""

    def __init__(self, locate: Callable[[], NvimAddress | None], timeout: float = DEFAULT_TIMEOUT) -> None:
        self._locate = locate
        self.timeout = timeout
        self._session: _Session | None = None
        self._found: NvimAddress | None = None  # where the latest connection was tried
        self._attempts = 0  # connections tried to the end
        self._failed: EditorUnavailable | None = None  # why the latest one failed
        self._unexpected = ""  # the latest unexpected failure logged by `stay_connected`
        self._connecting = asyncio.Lock()
        self.stuck: set[str] = set()  # addresses that <C-c> could not interrupt: not tried again
        self._interrupts: set[asyncio.Task[None]] = set()  # unblocking, after the caller was answered
        self._diffs: dict[str, _Diff] = {}  # open views by id
        self._diff_tabs: dict[str, None] = {}  # names of views opened, oldest first, until cleaned up
        self._name = secrets.token_hex(8)  # this toolbus, to Neovim's selection tracking

    # Editor protocol

    async def open_editors(self) -> list[OpenEditor]:
        tabs = await self._lua("list")
        return msgspec.convert(tabs or [], list[OpenEditor])

    async def is_dirty(self, path: str) -> bool | None:
        result = await self._lua("dirty", path)
        return None if result is None else bool(result)

    async def inspect_save(self, path: str) -> SaveTarget:
        return msgspec.convert(_to_bytes(await self._lua("inspect_save", path), ("before",)), SaveTarget)

    async def write(self, target: SaveTarget) -> SaveOutcome:
        result = await self._lua("write", target.buffer, target.tick, target.disk)
        return msgspec.convert(_to_bytes(result, ("after",)), SaveOutcome)

    async def find_tab(self, tab_name: str, path: str | None, *, wipe_unmodified: bool = False) -> TabMatch:
        found = await self._lua("find_tab", tab_name, path, wipe_unmodified)
        return msgspec.convert(_to_bytes(found, ("discarded",)), TabMatch)

    async def wipe(self, buffer: int, tick: int) -> bool:
        return bool(await self._lua("wipe", buffer, tick))

    async def current_selection(self) -> Selection | None:
        return _selection(await self._lua("selection"))

    async def latest_selection(self) -> Selection | None:
        return _selection(await self._lua("latest_selection", self._name))

    async def diagnostics(self, path: str | None) -> list[FileDiagnostics] | None:
        found = await self._lua("diagnostics", path)
        return None if found is None else msgspec.convert(found or [], list[FileDiagnostics])

    async def workspace_folders(self) -> list[WorkspaceFolder]:
        return msgspec.convert(await self._lua("workspace_folders"), list[WorkspaceFolder])

    async def open_file(self, command: OpenFile) -> FileOpened:
        ask = {name: getattr(command, name) for name in _OPEN_FILE_ASKS}
        return msgspec.convert(await self._lua("open_file", command.file, ask), FileOpened)

    # openDiff: one request opens a view; the decision comes as a notification

    async def open_diff(self, request: DiffRequest) -> DiffView:
        session = await self._connect()
        if session.channel is None:
            session.channel = int((await self.request("nvim_get_api_info"))[0])
        view_id = secrets.token_hex(8)
        # Known before Neovim can notify about it (a notification follows the answer anyway).
        self._diffs[view_id] = _Diff(request.tab_name, session)
        try:
            found = await self._lua(
                "diff_open", view_id, session.channel, request.path, request.old_path, request.text, request.tab_name
            )
        except BaseException:
            # Neovim may still open the view after toolbus gave up on the request (a timeout, a
            # cancelled call): close it, on this connection or a new one, so none is orphaned.
            self._diffs.pop(view_id, None)
            with anyio.CancelScope(shield=True):
                await self._close_view(view_id)
            raise
        view = msgspec.convert(_to_bytes(found, ("shown",)), DiffView)
        if view.status != "open" or self._diffs[view_id].session is not self._session:
            self._diffs.pop(view_id, None)
            if view.status == "open":  # the connection was re-made meanwhile: no decision would reach us
                await self._lua("diff_close", view_id)
                raise EditorUnavailable("the connection to Neovim was re-made while the diff opened; try again")
            return view
        self._diff_tabs[request.tab_name] = None
        while len(self._diff_tabs) > _KNOWN_DIFF_TABS:
            del self._diff_tabs[next(iter(self._diff_tabs))]
        return msgspec.structs.replace(view, id=view_id)

    def diff_waiting(self, tab_name: str) -> bool:
        return any(diff.tab_name == tab_name for diff in self._diffs.values())

    async def decision(self, view: str) -> DiffDecision:
        diff = self._diffs[view]
        await diff.decided.wait()
        assert diff.decision is not None
        return diff.decision

    async def stage_diff(self, view: str, text: bytes) -> DiffStaged:
        return msgspec.convert(await self._lua("diff_stage", view, text), DiffStaged)

    async def keep_staged(self, view: str, notice: str) -> bool:
        return bool(await self._lua("diff_keep_staged", view, notice))

    async def close_diff(self, view: str) -> None:
        diff = self._diffs.pop(view, None)
        if diff is None:
            return
        if diff.decision is None or diff.decision.action != "lost":
            await self._close_view(view)
            return
        # Its connection went while it waited (dropped after another request timed out): Neovim
        # tends the view as one its toolbus left, which keeps a proposal the user edited.
        with contextlib.suppress(ToolbusError):
            session = await self._connect()
            _notify_lua(session, "diff_close_orphans")

    async def _close_view(self, view: str) -> None:
        """Close a view in Neovim, best effort: through a new connection if its own is gone
        (a timeout closed it), so that no view is left that nobody hears a decision from."""
        try:
            await self._lua("diff_close", view)
        except EditorTimeout:
            # Still busy or at a prompt: a request toolbus gave up on may never run once Neovim
            # is free; a notification, on a connection kept open, does.
            with contextlib.suppress(ToolbusError):
                session = await self._connect()
                _notify_lua(session, "diff_close", view)
        except (ToolbusError, NvimRequestError):
            pass

    async def close_diffs(self, tab_name: str | None, by: DiffCloser) -> int:
        closing = [
            view
            for view, diff in list(self._diffs.items())
            if (tab_name is None or diff.tab_name == tab_name) and diff.decide(DiffDecision(action="reject", by=by))
        ]
        for view in closing:
            await self.close_diff(view)
        if tab_name is None and self._session is not None and self._session.alive:
            # Views a killed toolbus left open. Not counted: they were not waiting here.
            _notify_lua(self._session, "diff_close_orphans")
        return len(closing)

    def forget_diff_tab(self, tab_name: str) -> bool:
        if tab_name not in self._diff_tabs:
            return False
        del self._diff_tabs[tab_name]
        return True

    def _heard(self, method: str, args: list[Any]) -> None:
        """A notification from Neovim: a decision on a diff view."""
        if method != DIFF_NOTIFICATION or not args or not isinstance(args[0], dict):
            return
        found = args[0]
        diff = self._diffs.get(str(found.get("id")))
        if diff is None or found.get("action") not in ("accept", "reject"):
            return
        text = found.get("text") or ""
        text = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
        diff.decide(DiffDecision(action=found["action"], text=text))

    def _session_lost(self) -> None:
        """A connection is gone: the views it opened will never hear from Neovim."""
        for diff in self._diffs.values():
            if not diff.session.alive:
                diff.decide(DiffDecision(action="lost"))

    # `toolbus replay editor` (command-line only commands)

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
        code = _LUA_CALLS.get(function) or _LUA_CALLS.setdefault(function, _lua_call(function))
        result = await self.request("nvim_exec_lua", code, args)
        if result == _MISSING:  # this Neovim has not seen this toolbus yet (or restarted)
            # ...unless another call loaded it meanwhile: loading again would reset its state.
            await self.request("nvim_exec_lua", _LOAD_LUA_IF_MISSING, ())
            result = await self.request("nvim_exec_lua", code, args)
        return result

    async def request(self, method: str, *args: Any) -> Any:
        """One Neovim API request, within the timeout; reconnect once if a connection that used
        to work has gone (Neovim restarted). Raises `NvimRequestError` if Neovim refuses it."""
        session = await self._connect()
        try:
            return await self._await(session, method, args)
        except EditorUnavailable:
            if not session.used:
                raise
        # The connection that used to work is gone: Neovim restarted (the request then never
        # reached the new one) or died while answering (and so did its buffers).
        log.info("Neovim connection to %s lost; reconnecting", session.address)
        try:
            return await self._await(await self._connect(), method, args)
        except EditorUnavailable as error:
            raise EditorLost(f"{error} (the connection broke while a request was in flight)") from None

    async def stay_connected(self) -> None:
        """Connect now, not at the first call, and again within `REATTACH_S` whenever Neovim
        comes back at an address the user gave (`--nvim`, `$TOOLBUS_NVIM`, `$NVIM`): started
        after toolbus, or restarted. What toolbus's Lua tracks in Neovim (the latest selection,
        each file's read time) is then tracked from Neovim's start, not from the next call. A
        discovered Neovim is looked for again only by a call: another may be the one to find by
        then."""
        await self._attach(first=True)
        while self._found is not None and self._found.source != "discovered":
            await asyncio.sleep(REATTACH_S)
            if self._session is None or not self._session.alive:
                await self._attach()

    async def _attach(self, *, first: bool = False) -> None:
        try:
            await self._connect()
        except ToolbusError as error:  # not there (yet): looked for again
            if first:
                log.info("not connected to Neovim yet: %s", error)
        except Exception as error:  # never worth stopping the server for; logged once, not every second
            if repr(error) != self._unexpected:
                self._unexpected = repr(error)
                log.exception("could not connect to Neovim")

    async def _connect(self) -> _Session:
        if self._session is not None and self._session.alive:  # as for almost every call: no lock to take
            return self._session
        attempts = self._attempts
        async with self._connecting:  # one connection, even when calls begin together
            if self._attempts != attempts and (failed := self._failed) is not None:
                # One was tried, and failed, while this call waited: that is its answer too,
                # within the one timeout, rather than a second try and twice the wait.
                raise type(failed)(*failed.args)
            return await self._connect_once()

    async def _connect_once(self) -> _Session:
        if self._session is None or not self._session.alive:
            self._failed = None
            try:
                self._session = await self._open()
            except EditorUnavailable as error:
                self._failed = error
                raise
            finally:
                self._attempts += 1
        return self._session

    async def _open(self) -> _Session:
        """A new connection to the Neovim `_locate` finds, with toolbus's Lua loaded."""
        # Discovery probes sockets with blocking pynvim calls: keep them off the event loop.
        found = self._found = await anyio.to_thread.run_sync(self._locate)
        if found is None:
            raise EditorUnavailable(
                "No Neovim found: start Neovim with --listen ADDRESS (or from a Neovim :terminal), "
                "then pass that address with --nvim or $TOOLBUS_NVIM (see :echo v:servername in Neovim)"
            )
        try:
            opening = _Session.open(found.address, self._heard, self._session_lost)
            session = await _within(opening, self.timeout)
        except (OSError, TimeoutError, ValueError) as error:  # ValueError: a host name no lookup takes
            raise _unreachable(found.address, error) from None
        # Load toolbus's Lua, and note when this toolbus connected (its latest selection is one
        # made since). Notifications, run in order: a busy Neovim runs them when free, and they
        # never time out or interrupt it.
        session.notify("nvim_exec_lua", _LOAD_LUA_IF_MISSING, ())
        _notify_lua(session, "connected", self._name)
        log.info("connected to Neovim at %s (%s)", found.address, found.source)
        return session

    async def _await(self, session: _Session, method: str, args: tuple[Any, ...]) -> Any:
        if session.address in self.stuck and not await self._answers_again(session.address):
            raise EditorUnavailable(
                f"Neovim at {session.address} is stuck in a loop that cannot be interrupted (a Lua loop "
                f"ignores <C-c>): it did not answer within {self.timeout:g} s, and still does not, so "
                "nothing was sent to it. Restart that Neovim, then try again"
            )
        try:
            result = await _within(session.request(method, *args), self.timeout)
        except TimeoutError:
            session.close()
            raise self._timed_out(session.address) from None
        except OSError as error:
            session.close()
            raise _unreachable(session.address, error) from None
        self.stuck.discard(session.address)  # it answers again (or was restarted)
        return result

    async def _answers_again(self, address: str) -> bool:
        """Whether a Neovim found stuck answers a cheap question now (restarted, or its loop
        ended). Asked instead of the call: each call behind a stuck one would wait a whole timeout."""
        if await _ask(address, "nvim_get_mode", timeout=min(self.timeout, STUCK_PROBE_SECONDS)) is None:
            return False
        self.stuck.discard(address)
        return True

    def _timed_out(self, address: str) -> EditorTimeout:
        """The timeout error, answered at once; unblocking Neovim goes on in the background."""
        waited = f"Neovim at {address} did not answer within {self.timeout:g} s"
        if address in self.stuck:
            return EditorTimeout(
                f"{waited}: it is stuck in a loop that cannot be interrupted (a Lua loop ignores <C-c>), "
                "so toolbus no longer tries. Restart that Neovim, then try again"
            )
        task = asyncio.get_running_loop().create_task(self._unblock(address))
        self._interrupts.add(task)
        task.add_done_callback(self._interrupts.discard)
        return EditorTimeout(
            f"{waited} (a prompt or a long command is blocking it; toolbus is interrupting it). "
            "The request may still run once Neovim is free; check, then try again, "
            "or raise --nvim-timeout if Neovim is just slow"
        )

    async def _unblock(self, address: str) -> None:
        """From fresh connections: dismiss a prompt, or interrupt a long-running command."""
        mode = await _ask(address, "nvim_get_mode", timeout=0.5)
        name = str(mode.get("mode", "")) if isinstance(mode, dict) else ""
        if not isinstance(mode, dict) or name.startswith("n"):
            keys = "<C-c>"  # busy (too busy even to tell its mode): interrupt it
        elif mode.get("blocking") or name.startswith(("r", "c")):
            keys = "<Esc>"  # a prompt, input() or a cmdline wait: cancel it
        else:
            return
        if await _ask(address, "nvim_input", keys, timeout=1.0) is None:
            # Not even the interrupt was read: nothing toolbus sends will reach it.
            log.warning("Neovim at %s cannot be interrupted; not trying again until it answers", address)
            self.stuck.add(address)

    @property
    def pending_interrupts(self) -> int:
        return len(self._interrupts)

    async def settle(self) -> None:
        """Wait for the interrupts under way (tests, and a clean stop)."""
        while self._interrupts:
            await asyncio.gather(*self._interrupts, return_exceptions=True)

    def disconnect(self) -> None:
        if self._session is not None:
            self._session.close()
        for task in self._interrupts:
            task.cancel()


_LUA_CALLS: dict[str, str] = {}
_OPEN_FILE_ASKS = ("startLine", "endLine", "startText", "endText", "selectToEndOfLine", "makeFrontmost")


def _selection(found: Mapping[str, Any] | None) -> Selection | None:
    # Bytes that are not UTF-8 (a Latin-1 file) arrive surrogate-escaped: the reply's render
    # carries them as U+FFFD, as every other text from Neovim.
    return None if found is None else msgspec.convert(found, Selection)


def _lua_call(function: str) -> str:
    return f"local m = _G[{LUA_MODULE!r}] if not m then return {_MISSING!r} end return m.{function}(...)"


def _notify_lua(session: _Session, function: str, *args: Any) -> None:
    """Call toolbus's Lua `function` as a notification: never a wait, nor an error, for a Neovim
    that is busy or at a prompt (it runs once free). Quiet when the module or the function is
    missing, since a notification's error would show in the user's editor."""
    code = f"local m = _G[{LUA_MODULE!r}] if m and m.{function} then m.{function}(...) end"
    session.notify("nvim_exec_lua", code, args)


async def _within(awaitable: Awaitable[T], timeout: float) -> T:
    """`awaitable`, or TimeoutError after `timeout` seconds. A timer handle: cheaper per call
    than a cancel scope, and this is on every request's path."""
    pending = asyncio.ensure_future(awaitable)
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        pending.cancel()

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        return await pending
    except asyncio.CancelledError:
        if expired:
            raise TimeoutError from None
        raise  # the caller itself was cancelled
    finally:
        timer.cancel()


def _unreachable(address: str, error: BaseException) -> EditorUnavailable:
    return EditorUnavailable(
        f"Neovim at {address} is not reachable ({str(error) or type(error).__name__}): is it running? "
        "Check the address with :echo v:servername and pass it with --nvim (or, to serve, $TOOLBUS_NVIM)"
    )


async def _ask(address: str, method: str, *args: Any, timeout: float) -> Any:
    """One request on a short-lived connection of its own; None if it fails or takes too long."""
    session: _Session | None = None
    try:
        async with asyncio.timeout(timeout):
            session = await _Session.open(address)
            return await session.request(method, *args)
    except (OSError, TimeoutError, NvimRequestError):
        return None
    finally:
        if session is not None:
            session.close()


def _to_bytes(result: Mapping[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """Lua strings arrive as `str` (surrogate-escaped); file text belongs in bytes."""
    converted = dict(result)
    for name in fields:
        value = converted.get(name)
        if isinstance(value, str):
            converted[name] = value.encode("utf-8", "surrogateescape")
    return converted
