"""Reading a file a person named, never blocking on one that is not a regular file."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotARegularFile(OSError):
    """The path names a FIFO, a device or a socket: reading it could block, or never end."""


def read_regular(path: Path, limit: int = -1) -> bytes:
    """`path`'s bytes (at most `limit`): opened without blocking (a FIFO would wait for a
    writer) and read only if it is a regular file, else `NotARegularFile`. Other `OSError`s
    (`FileNotFoundError`, `IsADirectoryError`, ...) as `open` raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(f"{path} is a directory")
        if not stat.S_ISREG(mode):
            raise NotARegularFile("not a regular file (a FIFO, a device or a socket)")
        os.set_blocking(fd, True)
        return file.read(limit)
