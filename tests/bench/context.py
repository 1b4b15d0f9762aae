"""What every benchmark section shares: options, a scratch directory, one headless Neovim."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench.report import Report
from tests.rpc_client import StdioServer, clean_env, toolbus_argv

ROOT = Path(__file__).resolve().parents[2]
NOOP_SERVER = Path(__file__).resolve().with_name("noop_server.py")


@dataclass
class Options:
    quick: bool
    rounds: int  # repeated runs each figure is a median over
    calls: int  # calls per round in the round-trip figures
    observations: int  # size of the search benchmark's memory
    events: int  # size of the replay / audit benchmark's journal
    rss_calls: int  # calls made before reading the server's RSS
    startups: int  # server starts timed
    cache: Path  # where generated journals are kept between runs
    fresh: bool  # regenerate cached journals


@dataclass
class Context:
    options: Options
    scratch: Path
    report: Report
    _nvim: object | None = field(default=None, repr=False)

    @property
    def nvim(self):  # type: ignore[no-untyped-def]  # tests.conftest.NeovimProcess, imported lazily
        if self._nvim is None:
            from tests.conftest import NeovimProcess

            self._nvim = NeovimProcess(self.scratch / "nvim")
        return self._nvim

    def close(self) -> None:
        if self._nvim is not None:
            self._nvim.kill()  # type: ignore[attr-defined]

    def open_file(self, name: str, text: str = "hello\n") -> Path:
        """A file on disk, opened in the benchmark's Neovim."""
        path = self.scratch / "files" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.nvim.edit(path)
        return path

    def toolbus(self, journal: Path, *flags: str, nvim: bool | str = True, stderr: str = "toolbus") -> StdioServer:
        """`toolbus serve` on the shared Neovim, on none (False), or on the one at address `nvim`."""
        address = nvim if isinstance(nvim, str) else self.nvim.address if nvim else None
        return StdioServer(
            toolbus_argv(journal, *flags, nvim=address),
            env=clean_env(),
            stderr=self.scratch / f"{stderr}.stderr",
            cwd=ROOT,
        )

    def nvim_mcp(self, address: str, *, env: dict[str, str] | None = None, cwd: Path = ROOT) -> StdioServer:
        """The peer nvim-mcp, started and connected to the Neovim at `address` (its discovery
        is pointed there too, so it scans no folders)."""
        script = Path(sys.executable).with_name("nvim-mcp")
        argv = [str(script)] if script.exists() else [sys.executable, "-c", "from nvim_mcp.server import main; main()"]
        server = StdioServer(
            argv,
            env=clean_env({"NVIM_ADDRESS": address} | (env or {})),
            stderr=self.scratch / "nvim_mcp.stderr",
            cwd=cwd,
        )
        server.initialize()
        server.call_tool("connect", {"socket_path": address})
        return server

    def noop_server(self, *flags: str) -> StdioServer:
        return StdioServer([sys.executable, str(NOOP_SERVER), *flags], env=clean_env(), cwd=ROOT)


def toolbus_script() -> list[str]:
    """The `toolbus` console script beside this interpreter (what an agent runs)."""
    script = Path(sys.executable).with_name("toolbus")
    if script.exists() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "toolbus.adapters.cli"]
