"""A save in one Neovim request: toolbus reads the file the save replaces itself, keeps it, then
asks Neovim to inspect and write at once, if the file is still the one it read."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import NeovimProcess
from toolbus.adapters import nvim as nvim_adapter
from toolbus.adapters.nvim import NvimAddress, NvimEditor, read_file_ahead
from toolbus.handlers import FileRead

pytestmark = pytest.mark.anyio


@pytest.fixture
async def editor(nvim: NeovimProcess) -> AsyncIterator[NvimEditor]:
    connected = NvimEditor(lambda: NvimAddress(nvim.address, "test"), 5.0)
    await connected.connect()
    yield connected
    connected.disconnect()


async def read_after_a_save_found_it_open(editor: NvimEditor, nvim: NeovimProcess, path: Path) -> tuple[Path, FileRead]:
    """`path` holding "old", open in Neovim, found open by a save, and read ahead."""
    path.write_bytes(b"old\n")
    nvim.edit(path)
    await editor.inspect_save(str(path))
    read = editor.read_ahead(str(path))
    assert read is not None and read.text == b"old\n"
    return path, read


async def test_toolbus_reads_a_file_as_neovim_names_and_identifies_it(
    editor: NvimEditor, nvim: NeovimProcess, files: Path
) -> None:
    (files / "real.txt").write_bytes(b"on disk\n")
    (files / "link.txt").symlink_to(files / "real.txt")
    nvim.edit(files / "link.txt")
    assert editor.read_ahead(str(files / "link.txt")) is None  # until a save finds it open
    await editor.inspect_save(str(files / "link.txt"))
    read = editor.read_ahead(str(files / "link.txt"))
    inspected = await editor.inspect_save(str(files / "link.txt"))
    assert read is not None and read.disk != ""
    assert (read.path, read.disk, read.text) == (inspected.path, inspected.disk, inspected.before)


async def test_a_file_still_as_read_is_written_in_the_same_request(
    editor: NvimEditor, nvim: NeovimProcess, files: Path
) -> None:
    path, read = await read_after_a_save_found_it_open(editor, nvim, files / "a.txt")
    nvim.set_lines(path, ["new"])
    target, outcome = await editor.save_as_read(str(path), read)
    assert outcome is not None and (outcome.status, outcome.after) == ("saved", b"new\n")
    assert target.before is None  # Neovim did not read the file again: toolbus had it
    assert path.read_bytes() == b"new\n" and not nvim.modified(path)


async def test_a_file_changed_since_read_is_inspected_and_left_alone(
    editor: NvimEditor, nvim: NeovimProcess, files: Path
) -> None:
    path, read = await read_after_a_save_found_it_open(editor, nvim, files / "a.txt")
    path.write_bytes(b"changed by another program\n")
    target, outcome = await editor.save_as_read(str(path), read)
    assert outcome is None
    assert (target.status, target.reloaded, target.before) == ("ready", True, b"changed by another program\n")
    assert path.read_bytes() == b"changed by another program\n"


def test_neither_what_is_no_regular_file_nor_a_big_one_is_read_ahead(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(files / "pipe")
    assert read_file_ahead(str(files / "pipe")) is None  # and did not wait for a writer
    (files / "big.txt").write_bytes(b"x" * 11)
    monkeypatch.setattr(nvim_adapter, "READ_AHEAD_LIMIT", 10)
    assert read_file_ahead(str(files / "big.txt")) is None
    new = read_file_ahead(str(files / "new.txt"))
    assert new is not None and (new.disk, new.text) == ("", None)  # a save would create it
