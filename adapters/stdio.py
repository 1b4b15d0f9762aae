"""MCP's stdio, read and written on the event loop.

The SDK's `stdio_server` reaches stdin and stdout through anyio's file wrapper, so every line
read, every write and every flush is a hop to a worker thread and back: three per tool call.
When stdin and stdout are pipes or sockets (as when an agent starts the server), the event
loop can watch them itself: a no-op tool call over stdio then takes 0.37 ms instead of 0.66 ms
(2 cores, interleaved). The SDK still does all the protocol work: it is handed these two
streams in place of its wrapped files.

Like the SDK, the wire is moved to private descriptors while serving: fd 0 reads the null
device and fd 1 writes to stderr, so nothing stray can corrupt the protocol.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import stat
from collections.abc import AsyncIterator
from typing import BinaryIO

# Complete lines held before reading pauses: the server takes one message at a time.
MAX_PENDING_LINES = 64


class LineReader(asyncio.Protocol):
    """stdin as an async iterator of its lines (split at `\\n` only: JSON text may hold a `\\r`)."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._lines: collections.deque[str] = collections.deque()
        self._eof = False
        self._wakeup: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        start = len(self._partial)
        self._partial += data
        end = self._partial.rfind(b"\n", start)
        if end < 0:
            return
        lines = bytes(self._partial[:end]).split(b"\n")
        del self._partial[: end + 1]
        self._lines.extend(map(_decode, lines))
        if len(self._lines) >= MAX_PENDING_LINES and self._transport is not None:
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if self._partial:  # a last line without its newline is still a line
            self._lines.append(_decode(bytes(self._partial)))
            self._partial.clear()
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def __aiter__(self) -> LineReader:
        return self

    async def __anext__(self) -> str:
        while not self._lines:
            if self._eof:
                raise StopAsyncIteration
            self._wakeup = asyncio.get_running_loop().create_future()
            await self._wakeup
        line = self._lines.popleft()
        if not self._lines and self._transport is not None and not self._eof:
            self._transport.resume_reading()
        return line


class LineWriter(asyncio.Protocol):
    """stdout as a text file with `async write` and `async flush`. Flush waits until the pipe
    has taken everything, so a client that stops reading holds up replies, not memory."""

    def __init__(self) -> None:
        self._transport: asyncio.WriteTransport | None = None
        self._resumed: asyncio.Future[None] | None = None
        self._lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self._transport = transport

    def pause_writing(self) -> None:
        self._resumed = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or BrokenPipeError("stdout was closed")
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_exception(self._lost)

    async def write(self, text: str) -> None:
        if self._transport is None or self._transport.is_closing():  # lost, or losing: a failed write
            raise self._lost or BrokenPipeError("stdout was closed")
        self._transport.write(text.encode())

    async def flush(self) -> None:
        if self._resumed is not None:
            await self._resumed


def _decode(line: bytes) -> str:
    return line.decode("utf-8", errors="replace")


def _is_pipe(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _private_copy(fd: int) -> int:
    """A close-on-exec duplicate of `fd` above the standard three, even if one of them is closed."""
    import fcntl  # POSIX only, as is everything that calls this

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


def _take_wire(fd: int) -> int:
    """Move the stream behind `fd` to a private descriptor; `fd` reads the null device (stdin)
    or writes to stderr (stdout) meanwhile."""
    wire = _private_copy(fd)
    stand_in = os.open(os.devnull, os.O_RDONLY) if fd == 0 else os.dup(2)
    os.dup2(stand_in, fd)
    os.close(stand_in)
    return wire


def _give_back_wire(fd: int, wire: int) -> None:
    os.set_blocking(wire, True)  # the mode belongs to the stream, which others may share
    os.dup2(wire, fd)
    os.close(wire)


def _stream(wire: int, mode: str) -> BinaryIO:
    """A file of its own on the wire for a transport, which closes it when done."""
    return os.fdopen(_private_copy(wire), mode, buffering=0)


@contextlib.asynccontextmanager
async def event_loop_stdio() -> AsyncIterator[tuple[LineReader, LineWriter] | None]:
    """stdin and stdout on the event loop, or None when either is not a pipe or a socket (a
    file, a terminal) or not on POSIX: then the SDK's threaded streams serve. Terminals are left
    to the SDK on purpose: the non-blocking mode the event loop needs would be shared with the shell."""
    if os.name != "posix" or not (_is_pipe(0) and _is_pipe(1)):
        yield None
        return
    loop = asyncio.get_running_loop()
    wire_in, wire_out = _take_wire(0), _take_wire(1)
    reader, writer = LineReader(), LineWriter()
    transports: list[asyncio.BaseTransport] = []
    try:
        read, _ = await loop.connect_read_pipe(lambda: reader, _stream(wire_in, "rb"))
        transports.append(read)
        write, _ = await loop.connect_write_pipe(lambda: writer, _stream(wire_out, "wb"))
        transports.append(write)
        write.set_write_buffer_limits(high=0)  # flush() returns once the pipe has every byte
        yield reader, writer
    finally:
        for transport in transports:
            transport.close()
        _give_back_wire(0, wire_in)
        _give_back_wire(1, wire_out)
