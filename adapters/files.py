"""Files on this machine (`handlers.ports.Files`): read, and replaced in one rename.

Blocking file I/O runs in a worker thread, off the event loop. An OS error is a `bus.Fault`
naming the file; nothing half-written is ever left behind.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from toolbus.adapters.terminal import for_terminal
from toolbus.bus import Fault
from toolbus.journal.regular_files import read_regular

T = TypeVar("T")
log = logging.getLogger("toolbus.files")


class LocalFiles:
    """`handlers.ports.Files` on the local filesystem."""

    async def read(self, path: str) -> bytes | None:
        return await _off_loop(path, lambda: read_if_any(Path(path)))

    async def replace(self, path: str, content: bytes) -> bytes | None:
        def work() -> bytes | None:
            before = read_if_any(Path(path))
            write_atomically(Path(path), content)
            return before

        return await _off_loop(path, work)


async def _off_loop(path: str, work: Callable[[], T]) -> T:
    try:
        return await anyio.to_thread.run_sync(work)
    except OSError as error:
        raise Fault(f"cannot write {path}: {error.strerror or error}") from error


def read_if_any(path: Path) -> bytes | None:
    """`path`'s bytes, None if there is no such file; a FIFO or a device is refused, never read
    (it could block, or never end)."""
    try:
        return read_regular(path)
    except FileNotFoundError:
        return None


def write_atomically(path: Path, content: bytes) -> None:
    """Replace `path` with `content` in one rename, keeping its permissions: a reader (or a
    crash) sees the old text or the new, never half of it, and a power cut after this returns
    loses neither. A symlink stays one: the file it leads to is replaced. A file whose
    permissions forbid us to write it is left alone, as an editor's write would leave it."""
    path = Path(os.path.realpath(path))
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    else:
        if not os.access(path, os.W_OK):  # a rename would get past it, as an editor does not
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".toolbus", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)  # the rename itself


def _fsync_directory(directory: Path) -> None:
    """Bring a rename in `directory` to the disk, if it can be: the file is replaced already, so
    a directory we may not read, or a file system that cannot sync one, is no failure of it."""
    try:
        handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
    except OSError as error:
        shown = for_terminal(str(directory))
        log.warning("could not sync the directory %s after replacing a file in it: %s", shown, error.strerror)
