"""MCP's stdio, read and written on the event loop.

The SDK's `stdio_server` reaches stdin and stdout through anyio's file wrapper, so every line
read, every write and every flush is a hop to a worker thread and back: three per tool call.
When stdin and stdout are pipes (as when an agent starts the server), the event loop can
watch them itself: a no-op tool call over stdio then takes 0.40 ms instead of 0.66 ms
(2 cores, interleaved). Anything else (a socket, a terminal, a file) a daemon thread of ours
reads or writes: unlike the SDK's worker threads, none keeps a stop signal or the end of
serving waiting on a client. The SDK still does all the protocol work: it is handed these two
streams in place of its wrapped files.

Like the SDK, the wire is moved to private descriptors while serving: fd 0 reads the null
device and fd 1 writes to stderr, so nothing stray can corrupt the protocol.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import logging
import os
import queue
import select
import stat
import struct
import threading
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import anyio

log = logging.getLogger("toolbus.stdio")

_Delivered = TypeVar("_Delivered")

# Complete lines held before reading pauses: the server takes one message at a time.
MAX_PENDING_LINES = 64
# How long a server on its way out waits for the client to take the output it still holds; and,
# once stdin has ended, how long output may wait untaken before the client is taken for gone.
DRAIN_ON_EXIT_S = 5.0
# How many times in its patience a writer looks whether the client took any output.
STALL_CHECKS = 5
# How often stdin, while its reading is paused, is checked for a client that has closed it.
HANG_UP_CHECK_S = 1.0


class LineReader(asyncio.Protocol):
    """stdin as an async iterator of its lines (split at `\\n` only: JSON text may hold a `\\r`),
    for one consumer at a time, like a file."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._lines: collections.deque[str] = collections.deque()
        self._eof = False
        self._arrived = asyncio.Event()  # lines or the end came since the consumer last looked
        self._ended = asyncio.Event()
        self._transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._eof:  # ended by `end`: a chunk already on its way is left unread
            return
        start = len(self._partial)
        self._partial += data
        end = self._partial.rfind(b"\n", start)
        if end < 0:
            return
        lines = self._partial[:end].split(b"\n")
        del self._partial[: end + 1]
        self._lines.extend(map(_decode, lines))
        if len(self._lines) >= MAX_PENDING_LINES and self._transport is not None:
            self._transport.pause_reading()
        self._arrived.set()

    def eof_received(self) -> bool:
        self._finish()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:  # the client is gone either way: end the session as at end of input
            log.warning("reading stdin failed (%s): ending the session", exc)
        self._finish()

    def end(self) -> None:
        """Read no further (toolbus is stopping): the consumer sees the end of input at once,
        and the lines it has not taken are left unread, as are those still in the pipe."""
        self._lines.clear()
        self._partial.clear()
        self._finish()
        if self._transport is not None:
            self._transport.pause_reading()

    @property
    def paused(self) -> bool:
        """Reading waits for the consumer: the end of input, if it came, is not seen until then."""
        return self._transport is not None and not self._transport.is_reading()

    def _finish(self) -> None:
        if self._partial:  # a last line without its newline is still a line
            self._lines.append(_decode(bytes(self._partial)))
            self._partial.clear()
        self._eof = True
        self._arrived.set()
        self._ended.set()

    async def ended(self) -> None:
        """Returns once nothing more will come: the end of input, or `end`."""
        await self._ended.wait()

    def __aiter__(self) -> LineReader:
        return self

    async def __anext__(self) -> str:
        while not self._lines:
            if self._eof:
                raise StopAsyncIteration
            self._arrived.clear()
            await self._arrived.wait()
        line = self._lines.popleft()
        if not self._lines and self._transport is not None and not self._eof:
            self._transport.resume_reading()
        return line


class LineWriter(asyncio.Protocol):
    """stdout as a text file with `async write` and `async flush`. Flush waits until the pipe
    has taken everything, so a client that stops reading holds up replies, not memory."""

    def __init__(self, unread: Callable[[], int] = lambda: 0) -> None:
        self._transport: asyncio.WriteTransport | None = None
        self._unread = unread  # what the client has not read of what was passed on (in the wire)
        self._drained = asyncio.Event()  # the pipe holds nothing of ours
        self._drained.set()
        self._closed = asyncio.Event()
        self._lost: BaseException | None = None
        self._released = asyncio.Event()  # serving is over: flushes no longer wait for the client
        self._given = 0  # bytes handed to the transport
        self.abandoned = False  # the client was taken for gone: closing waits for it no more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self._transport = transport

    def pause_writing(self) -> None:
        if not self._released.is_set():
            self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or BrokenPipeError("stdout was closed")
        self._drained.set()  # wakes a flush, which then reports the loss
        self._closed.set()

    async def write(self, text: str) -> None:
        self._check()
        assert self._transport is not None
        data = text.encode()
        self._given += len(data)
        self._transport.write(data)

    async def flush(self) -> None:
        await self._drained.wait()  # an Event: a cancelled flush leaves it intact for the next
        self._check()

    def release(self) -> None:
        """Serving is over: a flush (the SDK's writer waiting on a client that does not read)
        returns at once, so that closing can begin. The bytes stay with the transport, which
        closing gives the client a bounded time to take."""
        self._released.set()
        self._drained.set()

    async def abandon_when_stalled(self, patience: float) -> None:
        """Once the client can send nothing more, output waiting for `patience` seconds with
        not a byte of it taken says it has gone as well: released (the SDK's read loop may be
        the one waiting to write, unable to read on to the end of input) and abandoned. A client
        still reading, however slowly, is not."""
        if await self._stalls(patience, self._released):
            self.abandoned = True
            self.release()

    async def drain_and_close(self, patience: float) -> None:
        """Close stdout once the client has what is still buffered (a reply whose flush was cut
        short by shutdown), even when shutdown is a cancellation: for as long as the client
        keeps taking bytes, until `patience` seconds pass with none taken. An abandoned client
        has had its time."""
        assert self._transport is not None
        self._transport.close()
        if not (self.abandoned and self._waiting()):
            with anyio.CancelScope(shield=True):
                await self._stalls(patience, self._closed)
        if not self.closed:
            log.warning("the client did not read the last %d bytes of output", self._waiting())
            self._transport.abort()

    async def _stalls(self, patience: float, done: asyncio.Event) -> bool:
        """Waits until `done`, or until output has waited `patience` seconds with not a byte of
        it taken (whether it did). A client still reading, however slowly, has not stalled. The
        wait is timed from the last look (every `patience` / STALL_CHECKS) that found the client
        had taken some, or output newly waiting: never from before it was handed over."""
        taken = self._taken()
        since = anyio.current_time() if self._untaken() else None
        while not done.is_set():
            with anyio.move_on_after(patience / STALL_CHECKS):
                await done.wait()
            now, taken_now = anyio.current_time(), self._taken()
            if not self._untaken():
                since = None
            elif taken_now != taken or since is None:
                since = now
            elif now - since >= patience and not done.is_set():
                return True
            taken = taken_now
        return False

    def _taken(self) -> int:
        """What the client has read: it changes (only) as the client reads."""
        return self._given - self._untaken()

    def _untaken(self) -> int:
        return self._waiting() + self._unread()

    def _waiting(self) -> int:
        """Bytes handed to the transport that it has not passed on."""
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    async def wait_closed(self) -> None:
        await self._closed.wait()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _check(self) -> None:
        """A write the transport failed (it is then closing) raises, as a blocking write would."""
        if self._transport is None or self._transport.is_closing():
            raise self._lost or BrokenPipeError("stdout was closed")


def _decode(line: bytes | bytearray) -> str:
    return line.decode("utf-8", errors="replace")


def _is_pipe(fd: int) -> bool:
    return stat.S_ISFIFO(os.fstat(fd).st_mode)


def _unread_counter(fd: int) -> Callable[[], int]:
    """What tells how much written to `fd` its reader has not read yet: a pipe's content
    (FIONREAD, which Linux answers on the write end too), a socket's output queue (TIOCOUTQ,
    which counts the memory its bytes take). A client reading slowly empties these a little at
    a time, whereas a writer waiting on them is woken only once there is room for a page, or a
    socket's buffer is down to a quarter. 0 where it cannot be told (a terminal's is always
    0: a client reading one slowly shows only as writes return)."""
    import fcntl  # POSIX only, as is everything that calls this
    import termios

    request = termios.FIONREAD if _is_pipe(fd) else termios.TIOCOUTQ

    def unread() -> int:
        try:
            return int(struct.unpack("i", fcntl.ioctl(fd, request, b"\0" * 4))[0])
        except OSError:
            return 0

    return unread


def _private_copy(fd: int) -> int:
    """A close-on-exec duplicate of `fd` above the standard three, even if one of them is closed."""
    import fcntl  # POSIX only, as is everything that calls this

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


class _Wire:
    """The stream behind `fd`, moved to a private descriptor while serving; `fd` reads the null
    device (stdin) or writes to stderr (stdout) meanwhile. Given back as it was found, blocking
    mode included: that belongs to the pipe, which other processes may share."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.private = _private_copy(fd)
        self._blocking = os.get_blocking(fd)
        stand_in = os.open(os.devnull, os.O_RDONLY) if fd == 0 else os.dup(2)
        os.dup2(stand_in, fd)
        os.close(stand_in)

    def stream(self, mode: str) -> io.FileIO:
        """A file of its own on the wire for a transport, which closes it when done."""
        return io.FileIO(_private_copy(self.private), mode)

    def give_back(self) -> None:
        os.set_blocking(self.private, self._blocking)
        os.dup2(self.private, self.fd)
        os.close(self.private)


@contextlib.asynccontextmanager
async def event_loop_stdio() -> AsyncIterator[tuple[LineReader, LineWriter]]:
    """stdin's lines and stdout's text on the event loop (POSIX). A pipe the loop watches
    itself; anything else (a file, a terminal, a socket) a daemon thread reads or writes, in
    blocking mode: the non-blocking mode the loop needs would be the shell's terminal's too, and
    asyncio takes a socket that turns readable under stdout (the same socket as stdin, as inetd
    and socat give, or a client's half-close) for a closed one. Once stdin has ended, a client
    that leaves output untaken for DRAIN_ON_EXIT_S is taken for gone."""
    loop = asyncio.get_running_loop()
    wire_in, wire_out = _Wire(0), _Wire(1)
    reader, writer = LineReader(), LineWriter(unread=_unread_counter(wire_out.private))
    read: asyncio.ReadTransport | None = None
    write: asyncio.WriteTransport | None = None
    watching: asyncio.Future[None] | None = None
    try:
        if _is_pipe(wire_in.private):
            read, _ = await loop.connect_read_pipe(lambda: reader, wire_in.stream("rb"))
        else:  # its descriptor is never closed: the thread may be blocked reading it, for good
            read = _ThreadFeed(_private_copy(wire_in.private), reader, loop)
        if _is_pipe(wire_out.private):
            write, _ = await loop.connect_write_pipe(lambda: writer, wire_out.stream("wb"))
            write.set_write_buffer_limits(high=0)  # flush() returns once the pipe has every byte
        else:
            write = _ThreadSink(_private_copy(wire_out.private), writer, loop)
        watching = asyncio.ensure_future(_abandon_a_client_gone_silent(reader, writer, wire_in.private))
        yield reader, writer
    finally:
        if watching is not None:
            watching.cancel()
        if read is not None:
            read.close()
        if write is not None:
            await writer.drain_and_close(DRAIN_ON_EXIT_S)
        wire_in.give_back()
        wire_out.give_back()


async def _abandon_a_client_gone_silent(reader: LineReader, writer: LineWriter, stdin: int) -> None:
    """A client that has closed stdin and takes no output for DRAIN_ON_EXIT_S has gone."""
    await _input_closed(reader, stdin)
    await writer.abandon_when_stalled(DRAIN_ON_EXIT_S)


async def _input_closed(reader: LineReader, stdin: int) -> None:
    """Returns once the client can send nothing more: the reader has seen the end of input, or,
    while it has paused (the read loop may be the one waiting to write, with lines unread), the
    client has closed its end of `stdin`."""
    while True:
        with anyio.move_on_after(HANG_UP_CHECK_S):
            await reader.ended()
            return
        if reader.paused and _hung_up(stdin):
            return


def _hung_up(fd: int) -> bool:
    """Whether the other end of `fd` (a pipe, socket or terminal) is closed, lines unread or not;
    a file holds all it ever will."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return True
    poller = select.poll()
    poller.register(fd, getattr(select, "POLLRDHUP", 0))  # a socket's half-close; hang-ups always count
    hang_ups = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)
    return any(events & hang_ups for _, events in poller.poll(0))


class _ThreadFeed(asyncio.ReadTransport):
    """Blocking reads of `fd` by a daemon thread, handed to a `LineReader` on the event loop one
    at a time: the thread reads again once the reader has taken the last and not paused. A
    daemon, unlike a worker thread of anyio's (whose cancelled call waits for the read to
    return), leaves a stop signal nothing to wait for; a failed read (a terminal hung up: EIO)
    ends the session as the end of input does."""

    def __init__(self, fd: int, reader: LineReader, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._fd = fd
        self._reader = reader
        self._loop = loop
        self._may_read = threading.Event()  # set on the loop once the thread may read on
        self._may_read.set()
        self._paused = False  # the reader holds enough lines (touched on the loop only)
        self._closing = False
        reader.connection_made(self)
        threading.Thread(target=self._run, name="toolbus stdin", daemon=True).start()

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        self._may_read.set()

    def is_reading(self) -> bool:
        return not self._paused

    def close(self) -> None:
        self._closing = True
        self._may_read.set()

    def is_closing(self) -> bool:
        return self._closing

    def _run(self) -> None:
        failure: OSError | None = None
        try:
            while True:
                self._may_read.wait()
                if self._closing or not (data := _read_blocking(self._fd)):
                    break
                self._may_read.clear()
                _on_loop(self._loop, self._take, data)
        except OSError as error:
            failure = error
        _on_loop(self._loop, self._reader.connection_lost, failure)

    def _take(self, data: bytes) -> None:
        self._reader.data_received(data)
        if not self._paused:
            self._may_read.set()


def _on_loop(loop: asyncio.AbstractEventLoop, deliver: Callable[[_Delivered], None], what: _Delivered) -> None:
    """`deliver(what)` called on `loop`, from a thread of ours; not once the loop is closed
    (serving is over)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(deliver, what)


def _read_blocking(fd: int) -> bytes:
    """The next bytes of `fd` (empty at its end), waiting for them even if the descriptor is in
    non-blocking mode, which it shares with whoever else holds it."""
    while True:
        try:
            return os.read(fd, 65536)
        except BlockingIOError:
            select.select([fd], [], [])


# A socket's output queue goes down only as whole writes are read, so parts of a page show a
# client reading slowly to be reading (a pipe's content goes down with every read).
_WRITE_AT_MOST = 1 << 12


class _ThreadSink(asyncio.WriteTransport):
    """Blocking writes to `fd` by a daemon thread, for a `LineWriter`, which it pauses while any
    bytes wait (as a pipe transport with no buffer allowance does): a flush returns once the
    thread has written everything. Abandoned, the thread may stay blocked: a daemon, it keeps
    the process from nothing."""

    def __init__(self, fd: int, writer: LineWriter, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._fd = fd
        self._writer = writer
        self._loop = loop
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()  # None: stop
        self._handed = 0  # bytes handed to the thread (touched on the loop only)
        self._written = 0  # bytes the thread has written (touched by the thread only)
        self._closing = False
        self._lost = False
        writer.connection_made(self)
        threading.Thread(target=self._run, name="toolbus stdout", daemon=True).start()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        if not self.get_write_buffer_size():
            self._writer.pause_writing()
        self._handed += len(data)
        self._chunks.put(bytes(data))

    def get_write_buffer_size(self) -> int:
        """Read on the loop as the thread writes: each part counts once written, and the loop
        is woken once a chunk is, not for each part."""
        return self._handed - self._written

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Closed once the thread has written what waits."""
        self._closing = True
        if not self.get_write_buffer_size():
            self._end(None)

    def abort(self) -> None:
        self._closing = True
        self._end(None)

    def _run(self) -> None:
        while (data := self._chunks.get()) is not None:
            view = memoryview(data)
            while view:
                try:
                    written = _write_some(self._fd, view)
                except OSError as error:  # the client closed its end
                    _on_loop(self._loop, self._end, error)
                    return
                view = view[written:]
                self._written += written
            _on_loop(self._loop, self._chunk_written, None)

    def _chunk_written(self, _: None) -> None:
        if self.get_write_buffer_size():
            return
        if self._closing:
            self._end(None)
        else:
            self._writer.resume_writing()

    def _end(self, error: OSError | None) -> None:
        if self._lost:
            return
        self._lost = self._closing = True
        self._chunks.put(None)
        self._writer.connection_lost(error)


def _write_some(fd: int, data: memoryview) -> int:
    """Write what `fd` takes of the start of `data` (at least a byte, at most _WRITE_AT_MOST),
    waiting for room even if the descriptor is in non-blocking mode."""
    while True:
        try:
            return os.write(fd, data[:_WRITE_AT_MOST])
        except BlockingIOError:
            select.select([], [fd], [])
