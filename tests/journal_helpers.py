"""Helpers for the journal command tests: run `toolbus` as a person would, and record real
editor sessions through `toolbus serve` and a headless Neovim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio

from tests.conftest import JournalReader, NeovimProcess, json_of, toolbus
from toolbus.bus import Appended, CommandRecord, Event, JournalUnavailable, Status
from toolbus.journal import SqliteJournal

ROOT = Path(__file__).resolve().parent.parent
E = TypeVar("E", bound=Event)


@dataclass
class Run:
    code: int
    out: str
    err: str
    raw: bytes

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


def cli(*args: str | Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> Run:
    """`toolbus ARGS` in a subprocess: exit code, stdout (text and bytes) and stderr."""
    base = {k: v for k, v in os.environ.items() if k not in ("NVIM", "TOOLBUS_NVIM", "TOOLBUS_JOURNAL")}
    done = subprocess.run(
        [sys.executable, "-m", "toolbus.adapters.cli", *map(str, args)],
        capture_output=True,
        cwd=cwd,
        env=base | (env or {}),
        timeout=60,
    )
    return Run(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(), done.stdout)


@dataclass
class EditorSession:
    """Files and a journal that real tool calls produced."""

    root: Path
    journal: Path
    nvim: NeovimProcess
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def reader(self) -> JournalReader:
        return JournalReader(self.journal)

    def position(self, type_name: str, name: str) -> int:
        """The position of the (last) `type_name` event about file `name`."""
        path = os.path.realpath(self.files[name])
        [*_, row] = [row for row in self.reader.events(type_name) if row["data"].get("path") == path]
        return int(row["position"])


def record_editor_session(root: Path) -> EditorSession:
    """Two agents' sessions on three files: a save that replaces text, a close that discards
    unsaved text, a rejected call, a refused save, a save after a disk change, a failed call."""
    root.mkdir(parents=True, exist_ok=True)
    work = root / "work"
    work.mkdir()
    session = EditorSession(root=root, journal=root / "state" / "journal.db", nvim=NeovimProcess(root / "nvim"))
    for name, text in (("a.txt", "alpha 1\n"), ("b.txt", "bravo\n"), ("c.txt", "charlie 1\n")):
        session.files[name] = work / name
        (work / name).write_text(text)
    anyio.run(_record, session)
    return session


async def _record(s: EditorSession) -> None:
    a, b, c = (str(s.files[name]) for name in ("a.txt", "b.txt", "c.txt"))
    async with toolbus(s.journal, s.nvim.address, "--agent", "writer") as client:
        s.nvim.edit(a)
        s.nvim.set_lines(a, ["alpha 2"])
        assert json_of(await client.call_tool("saveDocument", {"filePath": a}))["saved"]
        s.nvim.edit(b)
        s.nvim.set_lines(b, ["bravo unsaved"])
        await client.call_tool("close_tab", {"tab_name": "b.txt"})
        assert (await client.call_tool("saveDocument", {"filePath": "relative/a.txt"})).is_error
        json_of(await client.call_tool("checkDocumentDirty", {"filePath": a}))
        assert not json_of(await client.call_tool("saveDocument", {"filePath": c}))["saved"]  # not open
    async with toolbus(s.journal, s.nvim.address, "--agent", "reviewer") as client:
        s.nvim.edit(c)
        s.nvim.set_lines(c, ["charlie 2"])
        assert json_of(await client.call_tool("saveDocument", {"filePath": c}))["saved"]
        s.nvim.command("checktime")
        s.files["a.txt"].write_text("alpha 3 (edited on disk)\n")
        os.utime(s.files["a.txt"], (1, 1))  # a different mtime, whatever the clock's resolution
        assert json_of(await client.call_tool("saveDocument", {"filePath": a}))["saved"]
    async with toolbus(s.journal, str(s.root / "no-such-nvim.sock"), "--agent", "writer") as client:
        assert (await client.call_tool("getOpenEditors", {})).is_error


class OutcomesFail:
    """The journal, but its outcome commits fail: a disk that fills up mid-command."""

    def __init__(self, journal: SqliteJournal) -> None:
        self.journal = journal

    async def begin(self, record: CommandRecord, keep: Mapping[str, bytes] | None = None, **kw: Any) -> int:
        return await self.journal.begin(record, keep, **kw)

    async def keep_blobs(self, blobs: Mapping[str, bytes], **kw: Any) -> None:
        await self.journal.keep_blobs(blobs, **kw)

    async def finish(
        self, record: CommandRecord, command_id: int | None, status: Status, **kw: Any
    ) -> list[Appended[Any]]:
        raise JournalUnavailable("disk full")

    async def append(self, command_id: int, events: Sequence[E], blobs: Mapping[str, bytes]) -> list[Appended[E]]:
        return await self.journal.append(command_id, events, blobs)

    async def settle_abandoned(self, host: str) -> int:
        return await self.journal.settle_abandoned(host)
