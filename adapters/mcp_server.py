"""The MCP edge: a low-level `mcp` Server whose every tool call goes through the bus."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp.types as types
import msgspec
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from toolbus.adapters.answering import arguments_as_sent
from toolbus.adapters.arrival import ArrivalOrder
from toolbus.bus import Bus, Caller, Command, Reply, TextItems, ToolbusError
from toolbus.bus.messagebus import without_lone_surrogates

if TYPE_CHECKING:
    from toolbus.adapters.stdio import LineReader, LineWriter

log = logging.getLogger("toolbus.mcp")
_json = msgspec.json.Encoder()

# A call waiting for a person (openDiff) sends a progress notification this often, counted from
# its arrival, when its request carries a progressToken: clients reset their request timeout on
# each. The spec asks for at least every 10 s: 9 leaves room for a busy loop and the client's
# reading. $TOOLBUS_PROGRESS_INTERVAL (seconds) overrides it, for tests.
PROGRESS_INTERVAL = 9.0


def progress_interval() -> float:
    value = os.environ.get("TOOLBUS_PROGRESS_INTERVAL", "")
    try:
        return float(value) if float(value) > 0 else PROGRESS_INTERVAL
    except ValueError:
        return PROGRESS_INTERVAL


def render(reply: Reply) -> list[types.TextContent]:
    """A reply as the result's text items: plain strings as they are, several items each as it
    is, everything else compact JSON; what is not Unicode (a byte from Neovim that was not
    UTF-8) as U+FFFD."""
    if isinstance(reply, TextItems | str):
        items = reply.items if isinstance(reply, TextItems) else (reply,)
        texts = [without_lone_surrogates(text) for text in items]
    else:
        try:
            texts = [_json.encode(reply).decode()]
        except UnicodeEncodeError:  # rare: spares every other reply the walk
            texts = [_json.encode(_without_lone_surrogates(msgspec.to_builtins(reply))).decode()]
    return [types.TextContent(type="text", text=text) for text in texts]


def _without_lone_surrogates(value: object) -> object:
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, dict):
        return {_without_lone_surrogates(key): _without_lone_surrogates(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_lone_surrogates(item) for item in value]
    return value


def tool_of(command: type[Command]) -> types.Tool:
    """A command's listing: its name, schema and annotations, all declared on the command."""
    hints = command.hints
    return types.Tool(
        name=command.tool,
        title=hints.title,
        description=command.description,
        input_schema=command.schema,
        annotations=types.ToolAnnotations(
            title=hints.title,
            read_only_hint=hints.read_only,
            destructive_hint=hints.destructive,
            idempotent_hint=hints.idempotent,
            open_world_hint=hints.open_world,
        ),
    )


def editor_tools(bus: Bus) -> list[str]:
    return [tool for tool, command in bus.commands.items() if command.editor]


def build_server(
    bus: Bus,
    agent: str,
    department: str,
    version: str,
    arrivals: ArrivalOrder | None = None,
    host: str | None = None,
    *,
    from_login: bool = False,
) -> Server[Any]:
    """The MCP server; with `arrivals` (which the stdio edge fills), editor calls take effect
    in the order they arrived. Every call is journaled as made on `host` (the machine).
    `from_login`: the identity is a team journal's login (see `Caller.from_login`)."""
    arrivals = arrivals or ArrivalOrder(())
    interval = progress_interval()
    tools = [tool_of(cmd) for cmd in bus.commands.values()]
    # stdio serves exactly one client per process: one session id for the process's lifetime.
    session_id = secrets.token_hex(8)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if params is not None and params.cursor is not None:  # one page, which needs none
            raise MCPError(types.INVALID_PARAMS, f"Invalid cursor {params.cursor!r}: the tool list has one page")
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        arrived = time.monotonic()
        caller = _caller(ctx, agent, department, session_id, host, from_login)
        # Progress reports start only for a call that goes on to wait for a person: a task group
        # per call would cost every call, on the hot path, for the one tool that waits.
        reporters: list[asyncio.Task[None]] = []

        def waiting() -> None:
            # The calls after this one go on; its client hears it is alive meanwhile.
            if ctx.request_id is not None:
                arrivals.waits_for_a_person(ctx.request_id)
            if (token := _progress_token(ctx)) is not None:
                reporters.append(
                    asyncio.get_running_loop().create_task(_report_progress(ctx, token, arrived, interval))
                )

        try:
            async with arrivals.turn(ctx.request_id) as its_turn:
                reply = await bus.handle(params.name, arguments_as_sent(params.arguments), caller, waiting, its_turn)
        except ToolbusError as error:
            result = types.CallToolResult(content=[types.TextContent(type="text", text=str(error))], is_error=True)
        else:
            result = types.CallToolResult(content=list(render(reply)))
        finally:
            for reporter in reporters:
                reporter.cancel()
        return result

    return Server("toolbus", version=version, on_list_tools=list_tools, on_call_tool=call_tool)


def _progress_token(ctx: ServerRequestContext[Any]) -> str | int | None:
    meta: Any = ctx.meta or {}
    token = meta.get("progress_token", meta.get("progressToken")) if isinstance(meta, dict) else None
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


async def _report_progress(ctx: ServerRequestContext[Any], token: str | int, arrived: float, interval: float) -> None:
    """A progress notification every `interval` seconds after the call `arrived` (monotonic
    clock) until cancelled: the call is waiting. Due times do not drift with the sends."""
    ticks = 0
    while True:
        ticks += 1
        await anyio.sleep(max(0.0, arrived + ticks * interval - time.monotonic()))
        try:
            await ctx.session.send_progress_notification(
                token,
                float(ticks),
                message="waiting for the user's decision in Neovim",
                related_request_id=str(ctx.request_id) if ctx.request_id is not None else None,
            )
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the client has gone: nobody to tell


def _caller(
    ctx: ServerRequestContext[Any], agent: str, department: str, session_id: str, host: str | None, from_login: bool
) -> Caller:
    client = getattr(ctx.session.client_params, "client_info", None)
    return Caller(
        agent=agent,
        department=department,
        client_name=getattr(client, "name", None),
        client_version=getattr(client, "version", None),
        session_id=session_id,
        host=host,
        from_login=from_login,
    )


# How long the answers to the last requests may take once the client closes stdin (each
# editor call has its own, shorter, timeout; a call waiting for a person is cancelled at once).
ANSWERS_AFTER_EOF_S = 30.0


async def serve_stdio(server: Server[Any], arrivals: ArrivalOrder) -> None:
    """Serve until stdin ends or a SIGTERM, SIGINT or SIGHUP (the terminal or pane the agent ran
    in closed). At the end of stdin the calls under way are answered first, within
    ANSWERS_AFTER_EOF_S, to a client that still takes its output (see `event_loop_stdio`); a
    signal reads as the end of stdin with no such wait, and output waits on the client no more.
    Either way the calls still running (an openDiff waiting for the user) are then cancelled,
    so they close their views and journal `cancelled`, and the SDK answers each with an error;
    a call that finishes shielded (an accepted diff's write) is answered with its outcome
    (`ArrivalOrder.answers`)."""
    ending = _Ending()
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with anyio.create_task_group() as listening:
            listening.start_soon(_stop_on_signals, signals, ending.stop)
            await _serve_stdio(server, arrivals, ending)
            listening.cancel_scope.cancel()


class _Ending:
    """What a stop signal cuts short: the reading of stdin, the wait for the last answers, and
    any wait on a client that does not read (the SDK's read loop itself may be waiting to write)."""

    def __init__(self) -> None:
        self._stopped = False
        self._wire: tuple[LineReader, LineWriter] | None = None
        self._last_answers = anyio.CancelScope()

    def serving(self, stdin: LineReader, stdout: LineWriter) -> None:
        self._wire = (stdin, stdout)
        if self._stopped:
            self._end_wire()

    def stop(self) -> None:
        self._stopped = True
        self._last_answers.cancel()
        if self._wire is not None:
            self._end_wire()

    def _end_wire(self) -> None:
        assert self._wire is not None
        stdin, stdout = self._wire
        stdin.end()
        stdout.release()

    async def answers_owed(self, arrivals: ArrivalOrder) -> None:
        """Once stdin has ended: the answers still owed, within ANSWERS_AFTER_EOF_S; none once stopped."""
        with self._last_answers:
            await arrivals.answered_all(ANSWERS_AFTER_EOF_S)


async def _stop_on_signals(signals: AsyncIterator[int], stop: Callable[[], None]) -> None:
    """The first signal stops serving. Stopping takes a bounded time (views closed within the
    Neovim timeout, the last output drained within DRAIN_ON_EXIT_S), which a second signal (an
    impatient agent, a supervisor) does not cut short; a third ends toolbus at once, leaving
    what it was doing as the journal says."""
    received = 0
    async for number in signals:
        received += 1
        name = signal.Signals(number).name
        if received == 1:
            log.info("stopping on %s", name)
            stop()
        elif received == 2:
            log.warning("still stopping (%s): closing diff views and journaling; a third signal stops at once", name)
        else:
            log.warning("stopping at once on a third signal (%s)", name)
            os._exit(128 + number)


async def _serve_stdio(server: Server[Any], arrivals: ArrivalOrder, ending: _Ending) -> None:
    from mcp.server.stdio import stdio_server

    from toolbus.adapters.answering import LineAnswerer
    from toolbus.adapters.stdio import event_loop_stdio

    answerer = LineAnswerer(arrivals.arrived, functools.partial(ending.answers_owed, arrivals))
    async with event_loop_stdio() as (stdin, stdout):
        ending.serving(stdin, stdout)
        # The SDK does the protocol work; the lines pass through toolbus on their way to it, so
        # that a line the SDK cannot parse still gets an answer.
        lines = answerer.lines(stdin)
        async with stdio_server(cast(Any, lines), cast(Any, stdout)) as (read_stream, write_stream):
            write = arrivals.answers(write_stream)
            read = answerer.read(read_stream, write)
            await server.run(read, write, server.create_initialization_options())
            stdout.release()  # serving is over: what is left to write waits on the client no more
