"""stdio on the event loop (adapters/stdio.py): lines in, text out, stray output kept off the
wire, and threads of toolbus's for a stdin or stdout that is not a pipe."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any, cast

import pytest

from tests.faults_helpers import wait_until
from tests.rpc_client import PROTOCOL_VERSION, clean_env, toolbus_argv
from toolbus.adapters.stdio import (
    MAX_PENDING_LINES,
    LineReader,
    LineWriter,
    _hung_up,
    _ThreadFeed,
    _ThreadSink,
    _unread_counter,
)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.anyio


@pytest.fixture(params=["event loop", "thread"])
def feed(request: pytest.FixtureRequest) -> str:
    """How stdin reaches the LineReader: watched by the event loop (a pipe), or read by a thread
    of its own (anything else)."""
    return str(request.param)


@asynccontextmanager
async def reading(data: bytes, feed: str) -> AsyncIterator[tuple[LineReader, asyncio.ReadTransport]]:
    """A LineReader on a pipe that a thread fills with `data`, then closes."""
    read_end, write_end = os.pipe()

    def fill() -> None:
        with os.fdopen(write_end, "wb") as pipe, contextlib.suppress(BrokenPipeError):
            pipe.write(data)

    filler = threading.Thread(target=fill)
    filler.start()
    reader = LineReader()
    loop = asyncio.get_running_loop()
    if feed == "thread":
        transport: asyncio.ReadTransport = _ThreadFeed(read_end, reader, loop)
    else:
        transport, _ = await loop.connect_read_pipe(lambda: reader, os.fdopen(read_end, "rb"))
    try:
        yield reader, transport
    finally:
        transport.close()
        if feed == "thread":  # the transport does not own it: stdin's is never closed
            os.close(read_end)
        filler.join()


async def all_lines(reader: LineReader) -> list[str]:
    return [line async for line in reader]


async def test_lines_split_at_newlines_only_and_the_last_needs_none(feed: str) -> None:
    data = b'{"a":1}\n{"b":\r2}\r\n\n\xff tail'
    async with reading(data, feed) as (reader, _):
        assert await all_lines(reader) == ['{"a":1}', '{"b":\r2}\r', "", "\ufffd tail"]


async def test_a_line_longer_than_any_read_is_one_line(feed: str) -> None:
    line = b"x" * 5_000_000
    async with reading(line + b"\n" + b"next\n", feed) as (reader, _):
        assert [len(text) for text in await all_lines(reader)] == [5_000_000, 4]


async def test_reading_pauses_while_lines_wait_and_resumes_when_taken(feed: str) -> None:
    count = MAX_PENDING_LINES * 40  # lines of 1 KiB: many reads' worth
    lines = [b"%04d" % n + b"x" * 1020 for n in range(count)]
    async with reading(b"\n".join(lines) + b"\n", feed) as (reader, transport):
        first = await reader.__anext__()
        while transport.is_reading():  # the rest arrives, until too many lines wait
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # time for reads that should not happen
        assert len(reader._lines) < MAX_PENDING_LINES * 3  # what one more read could bring, at most
        assert [first, *await all_lines(reader)] == [line.decode() for line in lines]


@asynccontextmanager
async def writing(feed: str = "event loop", wire: str = "pipe") -> AsyncIterator[tuple[LineWriter, int]]:
    """A LineWriter on a pipe (or, written by a thread, a socket), written by the event loop or
    by a thread of its own; yields it and the wire's read end."""
    read_end, write_end = os.pipe() if wire == "pipe" else (s.detach() for s in socket.socketpair())
    writer = LineWriter(unread=_unread_counter(write_end))
    loop = asyncio.get_running_loop()
    if feed == "thread":
        transport: asyncio.WriteTransport = _ThreadSink(write_end, writer, loop)
    else:
        transport, _ = await loop.connect_write_pipe(lambda: writer, os.fdopen(write_end, "wb"))
        transport.set_write_buffer_limits(high=0)
    try:
        yield writer, read_end
    finally:
        if feed == "thread":  # it does not own the wire, as it does not own stdout
            os.close(read_end)  # its thread, if blocked writing, fails and stops
            transport.close()
            await asyncio.wait_for(writer.wait_closed(), 10)
            os.close(write_end)
        else:
            transport.close()
        with contextlib.suppress(OSError):  # a test may have closed it
            os.close(read_end)


async def test_flush_waits_until_the_other_end_has_read_everything() -> None:
    text = "é" * 1_000_000  # far more than a pipe holds
    async with writing() as (writer, read_end):
        await writer.write(text)
        flushed = asyncio.ensure_future(writer.flush())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not flushed.done()
        received = bytearray()

        def drain() -> None:
            while len(received) < len(text.encode()):
                received.extend(os.read(read_end, 1 << 16))

        await asyncio.gather(flushed, asyncio.to_thread(drain))
        assert received.decode() == text


async def test_a_client_reading_slowly_is_not_taken_for_gone_and_one_that_stopped_is(feed: str) -> None:
    """Once stdin has ended: output the client takes a little at a time, for far longer than
    the patience, is still being read; output it takes none of is abandoned."""
    size = 6_000_000
    async with writing(feed) as (writer, read_end):
        await writer.write("x" * size)
        watching = asyncio.ensure_future(writer.abandon_when_stalled(0.5))

        def read_slowly() -> None:
            received = 0
            while received < size:
                received += len(os.read(read_end, 1 << 16))
                time.sleep(0.02)

        await asyncio.to_thread(read_slowly)
        await writer.flush()
        assert not writer.abandoned
        await writer.write("y" * 1_000_000)  # and nobody reads it
        await watching
        assert writer.abandoned
        await writer.flush()  # released: a flush no longer waits on the client


@pytest.mark.parametrize(
    ("feed", "wire", "size", "read_at_once"),
    [("event loop", "pipe", 20_000, 256), ("thread", "socket", 300_000, 2048)],
)
async def test_a_client_reading_a_little_at_a_time_is_still_reading(
    feed: str, wire: str, size: int, read_at_once: int
) -> None:
    """A writer waiting on a full pipe is woken only once a page is free, one on a socket once
    its buffer is down to a quarter: a client reading steadily, but too slowly for either within
    the patience, is seen to read by what it takes out of the wire."""
    async with writing(feed, wire) as (writer, read_end):
        if wire == "pipe":
            fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)  # one page: 16 reads free it
        await writer.write("x" * size)
        watching = asyncio.ensure_future(writer.abandon_when_stalled(0.2))

        def read_slowly() -> None:
            received = 0
            while received < size:
                received += len(os.read(read_end, read_at_once))
                time.sleep(0.02)

        await asyncio.to_thread(read_slowly)
        await writer.flush()
        assert not writer.abandoned
        watching.cancel()


def test_stdin_has_hung_up_once_the_client_can_send_nothing_more() -> None:
    read_end, write_end = os.pipe()
    other_writer = os.dup(write_end)
    os.write(write_end, b"unread\n")
    os.close(write_end)
    assert not _hung_up(read_end)  # another writer still has it
    os.close(other_writer)
    assert _hung_up(read_end)  # lines unread or not
    os.close(read_end)
    client_does: list[tuple[Callable[[socket.socket], None], bool]] = [
        (lambda client: None, False),
        (lambda client: client.shutdown(socket.SHUT_RD), False),
        (lambda client: client.shutdown(socket.SHUT_WR), True),
        (socket.socket.close, True),
    ]
    for done_by_client, hung_up in client_does:
        ours, client = socket.socketpair()
        with ours, client:
            client.sendall(b"unread\n")
            done_by_client(client)
            ours.shutdown(socket.SHUT_WR)  # toolbus's own end closing is not the client's hang-up
            assert _hung_up(ours.fileno()) is hung_up
    controller, terminal = os.openpty()
    os.write(controller, b"unread\n")
    assert not _hung_up(terminal)
    os.close(controller)
    assert _hung_up(terminal)
    os.close(terminal)


def test_a_file_as_stdin_holds_all_it_ever_will(tmp_path: Path) -> None:
    """Nothing more can come: with its reading paused, it counts as ended."""
    (tmp_path / "requests").write_bytes(b"line\n")
    with (tmp_path / "requests").open("rb") as file:
        assert _hung_up(file.fileno())


async def test_closing_gives_a_client_reading_slowly_all_of_its_output(
    feed: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Output still buffered when serving ends reaches a client that takes it a little at a
    time, for far longer than the patience; a client that takes none has it dropped."""
    size = 3_000_000
    async with writing(feed) as (writer, read_end):
        await writer.write("x" * size)

        def read_slowly() -> int:
            received = 0
            while received < size and (chunk := os.read(read_end, 1 << 16)):  # till all, or the end
                received += len(chunk)
                time.sleep(0.02)
            return received

        reading = asyncio.ensure_future(asyncio.to_thread(read_slowly))
        await writer.drain_and_close(0.3)
        assert writer.closed and await reading == size and not caplog.records
    async with writing(feed) as (writer, read_end):
        await writer.write("y" * 1_000_000)  # and nobody reads it
        await writer.drain_and_close(0.3)
    assert "the client did not read the last" in caplog.text


async def test_a_reply_to_a_reader_that_has_gone_is_a_broken_pipe() -> None:
    async with writing() as (writer, read_end):
        os.close(read_end)
        with pytest.raises(BrokenPipeError):
            await writer.write('{"id":1}\n')
            await writer.flush()


async def test_a_cancelled_flush_leaves_the_next_one_working() -> None:
    async with writing() as (writer, read_end):
        await writer.write("x" * 200_000)
        flush = asyncio.ensure_future(writer.flush())
        for _ in range(20):
            await asyncio.sleep(0)
        flush.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flush
        received = bytearray()

        def drain() -> None:
            while not received.endswith(b"y\n"):
                received.extend(os.read(read_end, 1 << 16))

        reading_all = asyncio.ensure_future(asyncio.to_thread(drain))
        await writer.write("y\n")
        await writer.flush()
        await reading_all
        assert received == b"x" * 200_000 + b"y\n"


ECHO = textwrap.dedent(
    """
    import asyncio, os, sys
    from toolbus.adapters.stdio import event_loop_stdio

    async def main():
        async with event_loop_stdio() as streams:
            reader, writer = streams
            print("stray print", flush=True)
            os.write(1, b"stray write\\n")
            async for line in reader:
                await writer.write(line.upper() + "\\n")
                await writer.flush()
        os.write(1, b"after: blocking %d %d\\n" % (os.get_blocking(0), os.get_blocking(1)))

    asyncio.run(main())
    """
)


def test_stray_output_goes_to_stderr_while_serving_and_stdout_comes_back() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ECHO], input=b"one\ntwo\n", capture_output=True, cwd=ROOT, timeout=30, check=True
    )
    assert done.stdout == b"ONE\nTWO\nafter: blocking 1 1\n"
    assert b"stray print\n" in done.stderr and b"stray write\n" in done.stderr


CUT_SHORT = textwrap.dedent(
    """
    import asyncio
    from toolbus.adapters.stdio import event_loop_stdio

    async def main():
        async with event_loop_stdio() as (reader, writer):
            await writer.write("x" * 1_000_000 + "\\n")
            try:  # as when shutdown cancels the writer in the middle of a flush
                await asyncio.wait_for(writer.flush(), 0.1)
            except asyncio.TimeoutError:
                pass

    asyncio.run(main())
    """
)


def test_output_still_buffered_at_exit_reaches_a_slow_client() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", CUT_SHORT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    assert server.stdout is not None
    time.sleep(0.5)  # a client that reads late: the flush gives up first
    received = server.stdout.read()
    assert server.wait(timeout=30) == 0
    assert received == b"x" * 1_000_000 + b"\n"


def test_serve_answers_on_a_socket_shared_by_stdin_and_stdout(tmp_path: Path) -> None:
    """inetd and socat give one socket as both: threads of toolbus's read and write it."""
    client, server_end = socket.socketpair()
    with client, server_end:
        end = server_end.fileno()  # what Popen takes of a socket
        server = subprocess.Popen(toolbus_argv(tmp_path / "journal.db"), stdin=end, stdout=end, env=clean_env())
        server_end.close()
        client.settimeout(30)
        answers = client.makefile("rb")
        initialize = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        client.sendall(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize}).encode() + b"\n"
        )
        assert json.loads(answers.readline())["result"]["serverInfo"]["name"] == "toolbus"
        client.sendall(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        client.sendall(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list"}\n')
        assert "saveDocument" in {tool["name"] for tool in json.loads(answers.readline())["result"]["tools"]}
        client.shutdown(socket.SHUT_WR)
        assert server.wait(timeout=30) == 0


def test_serve_answers_when_stdout_is_a_file(tmp_path: Path) -> None:
    """Not a pipe: a thread of toolbus's writes it, with the same answers."""
    output = tmp_path / "answers.jsonl"
    with output.open("wb") as stdout:
        server = subprocess.Popen(
            toolbus_argv(tmp_path / "journal.db"), stdin=subprocess.PIPE, stdout=stdout, env=clean_env()
        )
    assert server.stdin is not None
    try:
        initialize = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        send(server.stdin, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize})
        assert answer(output, 1)["result"]["serverInfo"]["name"] == "toolbus"
        send(server.stdin, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(server.stdin, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert "saveDocument" in {tool["name"] for tool in answer(output, 2)["result"]["tools"]}
    finally:
        server.stdin.close()
        assert server.wait(timeout=30) == 0


def send(stdin: IO[bytes], message: dict[str, Any]) -> None:
    stdin.write(json.dumps(message).encode() + b"\n")
    stdin.flush()


def answer(output: Path, request_id: int, deadline: float = 30) -> dict[str, Any]:
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        for line in output.read_bytes().splitlines():
            if (message := json.loads(line)).get("id") == request_id:
                return cast(dict[str, Any], message)
        time.sleep(0.02)
    raise AssertionError(f"no answer to request {request_id} in {output}")


# --- a line the SDK cannot parse still gets an answer (adapters/answering.py) ---------------

SURROGATE_SAVE = (
    b'{"jsonrpc":"2.0","id":5,"method":"tools/call",'
    b'"params":{"name":"save","arguments":{"title":"\\ud83d","text":"x"}}}'
)
# Arguments sent as a JSON string, as some clients encode them.
STRING_ARGUMENTS = (
    b'{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"save","arguments":"{\\"title\\":\\"t\\"}"}}'
)
UNREADABLE_LINES: list[tuple[bytes, dict[str, Any] | None]] = [
    (b"not json", {"id": None, "code": -32700}),
    (b"[1, 2]", {"id": None, "code": -32600}),
    (b'{"id": 3, "method": "tools/list"}', {"id": 3, "code": -32600}),  # no "jsonrpc": "2.0"
    (b"[" * 5000, {"id": None, "code": -32700}),  # past what Python's parser nests, too
    (b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"\\udfff"}}', {"id": 4, "code": -32600}),
    (SURROGATE_SAVE, {"id": 5, "tool_error": "Invalid arguments for save: title: expected valid Unicode text"}),
    (b"   ", None),  # a blank line holds no request: nothing to answer
    # Read by the SDK, but arguments it would refuse with a bare -32602: the bus says why.
    (STRING_ARGUMENTS, {"id": 6, "tool_error": "Invalid arguments for save: arguments: expected an object, got str"}),
    (
        b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"save","arguments":[1]}}',
        {"id": 7, "tool_error": "Invalid arguments for save: arguments: expected an object, got array"},
    ),
    (  # ...which no client can pass off as an object of its own
        b'{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"save","arguments":{"":"x"}}}',
        {"id": 8, "tool_error": "Invalid arguments for save: title: required field is missing"},
    ),
    (
        b'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"save","arguments":"\\ud83d"}}',
        {"id": 10, "tool_error": "Invalid arguments for save: arguments: expected an object, got str"},
    ),
    # An id neither a string nor an integer: the SDK read these as notifications, answering none.
    (b'{"jsonrpc":"2.0","id":11.0,"method":"tools/list"}', {"id": 11, "code": -32600}),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', {"id": None, "code": -32600}),
    (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', {"id": None, "code": -32600}),
    (b'{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"save"}}', {"id": None, "code": -32600}),
    (b'{"jsonrpc":"2.0","id":12,"method":"tools/list","params":{"cursor":"bogus"}}', {"id": 12, "code": -32602}),
]


@pytest.mark.parametrize("stdout_kind", ["pipe", "file"], ids=["event-loop", "sdk-threads"])
def test_every_unreadable_line_is_answered_and_serving_goes_on(tmp_path: Path, stdout_kind: str) -> None:
    journal = tmp_path / "journal.db"
    output = tmp_path / "answers.jsonl"
    with output.open("wb") as file:
        server = subprocess.Popen(
            toolbus_argv(journal),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if stdout_kind == "pipe" else file,
            env=clean_env(),
            bufsize=0,  # unbuffered: select() then sees every byte not yet read
        )
    assert server.stdin is not None
    received = Received(server, output)
    try:
        send(server.stdin, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE})
        assert received.next()["id"] == 1
        send(server.stdin, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        for line, expected in UNREADABLE_LINES:
            server.stdin.write(line + b"\n")
            server.stdin.flush()
            if expected is not None:
                check_answer(received.next(), expected)
        send(server.stdin, {"jsonrpc": "2.0", "id": 9, "method": "tools/list"})
        assert "save" in {tool["name"] for tool in received.next()["result"]["tools"]}
    finally:
        server.stdin.close()
        assert server.wait(timeout=30) == 0
    with contextlib.closing(sqlite3.connect(journal)) as db:
        rows = db.execute("SELECT tool, status, arguments FROM commands ORDER BY id").fetchall()
    assert [row[:2] for row in rows] == 5 * [("save", "rejected")]
    # as the client sent them (a lone surrogate, which UTF-8 cannot hold, as U+FFFD)
    assert [json.loads(row[2]) for row in rows[1:]] == ['{"title":"t"}', [1], {"": "x"}, "\ufffd"]


INITIALIZE = {"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}


def check_answer(message: dict[str, Any], expected: dict[str, Any]) -> None:
    assert message["id"] == expected["id"], message
    if "tool_error" in expected:
        [content] = message["result"]["content"]
        assert message["result"]["isError"] and content["text"].startswith(expected["tool_error"]), message
    else:
        assert message["error"]["code"] == expected["code"], message


class Received:
    """The server's messages in order, from its stdout pipe or the file its stdout writes."""

    def __init__(self, server: subprocess.Popen[bytes], output: Path) -> None:
        self._pipe = server.stdout
        self._output = output
        self._taken = 0

    def next(self, deadline: float = 30) -> dict[str, Any]:
        if self._pipe is not None:
            ready, _, _ = select.select([self._pipe], [], [], deadline)
            assert ready, "no answer in time"
            return cast(dict[str, Any], json.loads(self._pipe.readline()))
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            lines = self._output.read_bytes().splitlines()
            if len(lines) > self._taken:
                self._taken += 1
                return cast(dict[str, Any], json.loads(lines[self._taken - 1]))
            time.sleep(0.02)
        raise AssertionError("no answer in time")


def test_requests_sent_before_stdin_closes_are_all_answered(tmp_path: Path) -> None:
    """A client that writes its requests and closes stdin (`printf … | toolbus serve`) still
    reads stdout: each request is answered before toolbus exits, as the journal says."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "save", "arguments": {"title": "t", "text": "x"}},
        },
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "getOpenEditors", "arguments": {}}},
    ]
    journal = tmp_path / "journal.db"
    done = subprocess.run(
        toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock")),
        input=b"".join(json.dumps(request).encode() + b"\n" for request in requests),
        capture_output=True,
        env=clean_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answers = {answer["id"]: answer for answer in map(json.loads, done.stdout.splitlines())}
    assert sorted(answers) == [1, 2, 3, 4]
    assert answers[4]["result"]["isError"] and not answers[3]["result"].get("isError")
    with contextlib.closing(sqlite3.connect(journal)) as db:
        rows = db.execute("SELECT tool, status FROM commands ORDER BY id").fetchall()
    assert sorted(rows) == [("getOpenEditors", "failed"), ("save", "ok")]


def requests_with_a_big_last_answer() -> bytes:
    """A session whose last answer is larger than a pipe or socket holds: a note of 300 KB."""
    note = {"title": "big", "text": "x" * 300_000}
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "save", "arguments": note}},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "get_observations", "arguments": {"ids": [1]}},
        },
    ]
    return b"".join(json.dumps(request).encode() + b"\n" for request in requests)


@contextlib.contextmanager
def a_client_that_never_reads(
    wire: str, argv: list[str], errors: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[bytes], None], Callable[[], None]]]:
    """`toolbus serve` over pipes or one socket for both ends (as a Node agent gives), its
    stderr in `errors`; yields it, a way to send to its stdin, and one to close its stdin. Its
    stdout stays open and unread throughout."""
    with contextlib.ExitStack() as stack:
        stderr = stack.enter_context(errors.open("wb"))
        if wire == "pipes":
            server = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=clean_env()
            )
            assert server.stdin is not None and server.stdout is not None
            stack.enter_context(server.stdout)
            pipe = server.stdin

            def send(data: bytes) -> None:
                pipe.write(data)
                pipe.flush()

            yield server, send, pipe.close
        else:
            client, server_end = socket.socketpair()
            stack.enter_context(client)
            with server_end:
                end = server_end.fileno()
                server = subprocess.Popen(argv, stdin=end, stdout=end, stderr=stderr, env=clean_env())
            yield server, client.sendall, functools.partial(client.shutdown, socket.SHUT_WR)


@pytest.mark.parametrize("wire", ["pipes", "socket"])  # socket: one for both ends, as a Node agent gives
def test_a_client_that_closes_stdin_and_never_reads_does_not_keep_toolbus_alive(tmp_path: Path, wire: str) -> None:
    """The last answer is larger than the wire holds and nobody reads it: toolbus gives the
    client a bounded time to take it, says so, and exits; what it did stays journaled."""
    journal, errors = tmp_path / "journal.db", tmp_path / "stderr"
    argv = toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock"))
    with a_client_that_never_reads(wire, argv, errors) as (server, send, close):
        send(requests_with_a_big_last_answer())
        close()
        assert server.wait(timeout=60) == 0
    assert "the client did not read the last" in errors.read_text()
    assert journaled(journal) == [("save", "ok"), ("get_observations", "ok")]


def journaled(journal: Path) -> list[tuple[str, str]]:
    """Each command's tool and status, in order."""
    with contextlib.closing(sqlite3.connect(journal)) as db:
        return db.execute("SELECT tool, status FROM commands ORDER BY id").fetchall()


def test_a_stop_signal_ends_toolbus_while_an_answer_waits_on_a_client_that_does_not_read(tmp_path: Path) -> None:
    """The big answer fills the pipe, and the SDK's read loop itself waits to write (the answer
    to an unreadable line): a stop signal still ends toolbus, after the bounded drain."""
    journal, errors = tmp_path / "journal.db", tmp_path / "stderr"
    argv = toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock"))
    with errors.open("wb") as stderr:
        server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=clean_env())
    assert server.stdin is not None and server.stdout is not None
    with server.stdin, server.stdout:
        server.stdin.write(requests_with_a_big_last_answer())
        server.stdin.flush()
        wait_until(lambda: journal.exists() and len(journaled(journal)) == 2, timeout=30)  # the big answer is out
        server.stdin.write(b"not json\n")
        server.stdin.flush()
        wait_until(lambda: "answered an unreadable line" in errors.read_text(), timeout=30)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    assert "the client did not read the last" in errors.read_text()


@pytest.mark.parametrize("wire", ["pipes", "socket"])
def test_a_client_that_closes_stdin_and_takes_no_output_while_the_read_loop_waits_to_write(
    tmp_path: Path, wire: str
) -> None:
    """The big answer fills the wire and the SDK's read loop itself waits to write (the answer
    to an unreadable line), so it never reads the end of stdin, and more lines than it holds
    unread stop it reading at all: toolbus still sees the client has gone, gives it the
    bounded time, and exits; what it did stays journaled."""
    journal, errors = tmp_path / "journal.db", tmp_path / "stderr"
    argv = toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock"))
    with a_client_that_never_reads(wire, argv, errors) as (server, send, close):
        send(requests_with_a_big_last_answer())
        wait_until(lambda: journal.exists() and len(journaled(journal)) == 2, timeout=30)  # the big answer is out
        send(b"not json\n" * (1 + MAX_PENDING_LINES + 1))
        close()
        assert server.wait(timeout=30) == 0
    assert "the client did not read the last" in errors.read_text()
    assert journaled(journal) == [("save", "ok"), ("get_observations", "ok")]


def test_a_file_as_stdin_whose_lines_reading_has_paused_on_ends_a_session_nobody_reads(tmp_path: Path) -> None:
    """The same with stdin a file: reading pauses on lines the read loop, waiting to write
    (their answers are more than the pipe holds), cannot take, and nothing more can come.
    toolbus gives the client the bounded time and exits."""
    journal, errors, requests = tmp_path / "journal.db", tmp_path / "stderr", tmp_path / "requests"
    requests.write_bytes(requests_with_a_big_last_answer() + b"not json\n" * 2_000)
    argv = toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock"))
    with requests.open("rb") as stdin, errors.open("wb") as stderr:
        server = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, env=clean_env())
    assert server.stdout is not None
    with server.stdout:
        assert server.wait(timeout=30) == 0
    assert "the client did not read the last" in errors.read_text()
    assert journaled(journal) == [("save", "ok"), ("get_observations", "ok")]


@contextlib.contextmanager
def quiet_stdin(kind: str) -> Iterator[tuple[int, Callable[[bytes], None], Callable[[], None]]]:
    """A stdin that is not a pipe (`socket`: as a Node agent's socketpair; `terminal`), as the
    descriptor for the server, a way to write to it and a way to hang it up."""
    if kind == "socket":
        client, server_end = socket.socketpair()
        with client, server_end:
            yield server_end.detach(), client.sendall, client.close
    else:
        controller, terminal = os.openpty()

        def write(data: bytes) -> None:
            os.write(controller, data)

        try:
            yield terminal, write, lambda: os.close(controller)
        finally:
            with contextlib.suppress(OSError):
                os.close(controller)


def serve_on(tmp_path: Path, stdin: int) -> subprocess.Popen[bytes]:
    with (tmp_path / "stderr").open("wb") as stderr:
        server = subprocess.Popen(
            toolbus_argv(tmp_path / "journal.db", "--nvim", str(tmp_path / "no-neovim.sock")),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=clean_env(),
            start_new_session=True,  # a terminal's hangup then reaches it as a failed read, not a SIGHUP
        )
    os.close(stdin)
    return server


@pytest.mark.parametrize(
    ("kind", "stop"), [("socket", signal.SIGTERM), ("terminal", signal.SIGINT)], ids=["socket", "terminal"]
)
def test_a_stop_signal_ends_serve_while_stdin_that_is_no_pipe_stays_open(
    tmp_path: Path, kind: str, stop: signal.Signals
) -> None:
    with quiet_stdin(kind) as (stdin, write, _):
        server = serve_on(tmp_path, stdin)
        assert server.stdout is not None
        write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}).encode() + b"\n")
        assert json.loads(server.stdout.readline())["result"]["serverInfo"]["name"] == "toolbus"
        server.send_signal(stop)
        assert server.wait(timeout=30) == 0  # not once stdin next has a line, or closes
        server.stdout.close()
    assert "Traceback" not in (tmp_path / "stderr").read_text()


def test_a_terminal_that_hangs_up_ends_the_session_as_end_of_input_does(tmp_path: Path) -> None:
    with quiet_stdin("terminal") as (stdin, write, hang_up):
        server = serve_on(tmp_path, stdin)
        assert server.stdout is not None
        write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}).encode() + b"\n")
        assert json.loads(server.stdout.readline())["result"]["serverInfo"]["name"] == "toolbus"
        hang_up()  # reading the terminal now fails (EIO), or finds its end (once Linux hung it up)
        assert server.wait(timeout=30) == 0
        server.stdout.close()
    stderr = (tmp_path / "stderr").read_text()
    assert "Traceback" not in stderr


def test_a_third_stop_signal_ends_toolbus_at_once(tmp_path: Path) -> None:
    """Stopping waits for a client that does not read its last answer (a bounded time); a second
    signal does not cut that short, a third does."""
    journal, errors = tmp_path / "journal.db", tmp_path / "stderr"
    argv = toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock"), "-v")
    with errors.open("wb") as stderr:
        server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=clean_env())
    assert server.stdin is not None and server.stdout is not None

    def until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.02)

    def logged(text: str) -> bool:
        return text in errors.read_text()

    def answered() -> bool:
        with contextlib.closing(sqlite3.connect(journal)) as db:
            return bool(db.execute("SELECT count(*) FROM commands WHERE status = 'ok'").fetchone() == (2,))

    with server.stdin, server.stdout:
        server.stdin.write(requests_with_a_big_last_answer())
        server.stdin.flush()
        until(lambda: journal.exists() and answered(), "both calls done: the last answer waits on the client")
        for said in ("stopping on SIGTERM", "still stopping (SIGTERM)"):
            server.send_signal(signal.SIGTERM)
            until(functools.partial(logged, said), said)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 128 + signal.SIGTERM
    assert "stopping at once on a third signal" in errors.read_text()


def test_toolbus_with_a_standard_stream_closed_does_its_work_and_exits_cleanly(tmp_path: Path) -> None:
    """`toolbus serve >&-`: the closed descriptor is not taken by the journal (answers written
    into it), nor is it a traceback; the answers go nowhere, as the caller chose."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "save", "arguments": {"title": "t", "text": "x"}},
        },
    ]
    journal = tmp_path / "journal.db"
    done = subprocess.run(
        toolbus_argv(journal, "--nvim", str(tmp_path / "no-neovim.sock")),
        input=b"".join(json.dumps(request).encode() + b"\n" for request in requests),
        stderr=subprocess.PIPE,
        env=clean_env(),
        timeout=60,
        preexec_fn=lambda: os.close(1),  # stdout closed, as `>&-` leaves it
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    with contextlib.closing(sqlite3.connect(journal)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("SELECT tool, status FROM commands").fetchall() == [("save", "ok")]
    cli = [sys.executable, "-m", "toolbus.adapters.cli"]
    audit = subprocess.run(
        [*cli, "audit", "--journal", str(journal)],
        stderr=subprocess.PIPE,
        env=clean_env(),
        timeout=60,
        preexec_fn=lambda: os.close(1),
    )
    assert audit.returncode == 0 and audit.stderr == b"", audit.stderr  # its table went nowhere, as asked
    usage = subprocess.run(
        [*cli, "audit", "--bogus"], stdout=subprocess.PIPE, env=clean_env(), timeout=60, preexec_fn=lambda: os.close(2)
    )
    assert usage.returncode == 2 and usage.stdout == b""  # not onto stdout, the data's stream
