"""Every line the client sends gets an answer, even one the MCP SDK cannot parse.

The SDK's stdio transport parses each line with pydantic's JSON parser and, when that fails,
hands the dispatcher an exception, which it only logs: the request is never answered and the
agent waits for ever. Pydantic's parser refuses more than JSON does: a lone UTF-16 surrogate
escape (`"\\ud83d"`, which JavaScript agents send when they cut a string inside an emoji) and
nesting past 200 levels.

`LineAnswerer` sits on both sides of the SDK's parser: it notes each line on its way in and,
on the way out, pairs each parsed item with its line (the SDK yields exactly one item per line,
in order). Good lines cost a deque append and pop; only a line the SDK refused is parsed again,
by Python's own JSON parser, which takes both. A request recovered that way goes on to the SDK
as if it had parsed it (so a `tools/call` reaches the bus, which rejects a lone surrogate as an
invalid argument, and journals it); anything else is answered here with a JSON-RPC error. So
is a request whose id is neither a string nor an integer, which the SDK reads as a notification.

A `tools/call` whose `arguments` are not an object (a client that sends them as a JSON string,
say) would get the SDK's bare "Invalid request parameters", unjournaled. It goes on with the
arguments wrapped in an object the SDK accepts (`wrap_arguments`), and the tool handler unwraps
them (`arguments_as_sent`), so the bus rejects the call, saying why, and journals it.
"""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import mcp.types as types
import pydantic
from mcp.shared.message import SessionMessage

from toolbus.bus.messagebus import holds_lone_surrogate

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import ReadStream, WriteStream

log = logging.getLogger("toolbus.stdio")

Item = SessionMessage | Exception


class LineAnswerer:
    """Wraps the SDK's line source (`lines`) and the read stream it parses them into (`read`)."""

    def __init__(self, on_message: Callable[[Any], None], on_end: Callable[[], Awaitable[None]]) -> None:
        self._lines: collections.deque[str] = collections.deque()
        self._on_message = on_message  # sees every message read, in order
        self._on_end = on_end  # awaited once the client closed stdin, before the SDK hears it

    async def lines(self, source: AsyncIterable[str]) -> AsyncIterator[str]:
        async for line in source:
            self._lines.append(line)
            yield line

    def read(self, parsed: ReadStream[Item], write: WriteStream[SessionMessage]) -> ReadStream[Item]:
        return _AnsweredStream(parsed, write, self._lines, self._on_message, self._on_end)


class _AnsweredStream:
    """The SDK's read stream, with each exception (a line it could not parse) replaced by the
    request recovered from that line, or answered here and skipped."""

    def __init__(
        self,
        parsed: ReadStream[Item],
        write: WriteStream[SessionMessage],
        lines: collections.deque[str],
        on_message: Callable[[Any], None],
        on_end: Callable[[], Awaitable[None]],
    ) -> None:
        self._parsed = parsed
        self._write = write
        self._lines = lines
        self._on_message = on_message
        self._on_end = on_end

    @property
    def last_context(self) -> Any:  # the SDK runs each message in its sender's context
        return getattr(self._parsed, "last_context", None)

    async def receive(self) -> Item:
        item = await self._receive()
        if isinstance(item, SessionMessage):
            item = wrap_arguments(item)
            self._on_message(item.message)
        return item

    async def _receive(self) -> Item:
        while True:
            try:
                item = await self._parsed.receive()
            except anyio.EndOfStream:  # the SDK cancels every call still running when it hears it
                await self._on_end()
                raise
            line = self._lines.popleft() if self._lines else None
            if not isinstance(item, Exception):
                if line is not None and (refused := _request_with_a_bad_id(item, line)) is not None:
                    await self._answer(refused)
                    continue
                return item
            if line is None:  # not one of ours: leave it to the SDK, which logs it
                return item
            answer = recover(line)
            if isinstance(answer, SessionMessage):
                return answer
            if answer is not None:
                await self._answer(answer)

    async def _answer(self, error: types.JSONRPCError) -> None:
        log.warning("answered an unreadable line with %s: %s", error.error.code, error.error.message)
        try:
            await self._write.send(SessionMessage(error))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.debug("the session ended before the answer could be sent")

    def __aiter__(self) -> _AnsweredStream:
        return self

    async def __anext__(self) -> Item:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._parsed.aclose()

    async def __aenter__(self) -> _AnsweredStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class _NotAnObject(NamedTuple):
    """Arguments that are not an object, as sent: no JSON a client sends decodes to one."""

    value: Any


def wrap_arguments(item: SessionMessage) -> SessionMessage:
    """`item`, but a `tools/call` whose `arguments` are neither an object nor null carries them
    wrapped in one, which `arguments_as_sent` unwraps."""
    message = item.message
    if not (isinstance(message, types.JSONRPCRequest) and message.method == "tools/call"):
        return item
    params = message.params
    if not isinstance(params, dict) or params.get("arguments") is None or isinstance(params["arguments"], dict):
        return item
    wrapped = {**params, "arguments": {"": _NotAnObject(params["arguments"])}}
    return SessionMessage(message.model_copy(update={"params": wrapped}), item.metadata)


def arguments_as_sent(arguments: dict[str, Any] | None) -> Any:
    """A tool call's arguments as the client sent them, unwrapped if `wrap_arguments` wrapped them."""
    if arguments is not None and len(arguments) == 1 and isinstance(wrapped := arguments.get(""), _NotAnObject):
        return wrapped.value
    return arguments


def recover(line: str) -> SessionMessage | types.JSONRPCError | None:
    """What to do with a line the SDK could not parse: the message it holds after all, the
    error that answers it, or None for a blank line (no request, nothing to answer)."""
    if not line.strip():
        return None
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested past what Python parses either
        return _error(None, types.PARSE_ERROR, "Parse error: the line is not JSON")
    request_id = _request_id(value)
    if _lone_surrogate_outside_arguments(value):  # the reply could echo it, and UTF-8 cannot
        return _error(request_id, types.INVALID_REQUEST, "Invalid request: a lone surrogate outside tool arguments")
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(value, by_name=False))
    except pydantic.ValidationError:
        return _error(request_id, types.INVALID_REQUEST, "Invalid request: not a JSON-RPC 2.0 message")


def _request_with_a_bad_id(item: SessionMessage, line: str) -> types.JSONRPCError | None:
    """The error answering a request whose id is neither a string nor an integer (a float, null,
    a boolean), which the SDK takes for a notification and leaves unanswered. Notifications are
    few: only their lines are read again."""
    if not isinstance(item.message, types.JSONRPCNotification):
        return None
    value = json.loads(line)
    if not (isinstance(value, dict) and "id" in value):
        return None
    number = value["id"]
    matched = int(number) if isinstance(number, float) and number.is_integer() else None  # 2.0 is 2 to JSON
    return _error(matched, types.INVALID_REQUEST, "Invalid request: an id must be a string or an integer")


def _request_id(value: Any) -> int | str | None:
    """The request's id when it has a usable one, so the client can match the answer."""
    request_id = value.get("id") if isinstance(value, dict) else None
    if isinstance(request_id, str) and holds_lone_surrogate(request_id):
        return None
    return request_id if isinstance(request_id, int | str) and not isinstance(request_id, bool) else None


def _lone_surrogate_outside_arguments(value: Any) -> bool:
    """Lone surrogates are let through only inside a `tools/call`'s arguments, where the bus
    rejects them naming the field; anywhere else they would reach replies verbatim."""
    params = value.get("params") if isinstance(value, dict) else None
    if isinstance(params, dict) and value.get("method") == "tools/call":
        value = {**value, "params": {**params, "arguments": None}}
    return holds_lone_surrogate(value)


def _error(request_id: int | str | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message))
