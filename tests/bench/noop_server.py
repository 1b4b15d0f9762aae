"""The baseline: a bare `mcp` low-level server over stdio with one tool that does nothing.

Run as a script (`python tests/bench/noop_server.py`), so it imports nothing but `mcp`.
With `--event-loop-stdio` it reads and writes stdio as `toolbus serve` does (adapters/stdio.py):
the same transport, to show what toolbus's own work costs.
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager, nullcontext
from pathlib import Path
from typing import Any, cast

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

NOOP = types.Tool(
    name="noop",
    description="Does nothing",
    input_schema={"type": "object", "properties": {"filePath": {"type": "string"}}},
)


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[NOOP])


async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text='{"success":true}')])


async def main() -> None:
    server = Server("noop", version="0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with _streams() as streams:
        stdin, stdout = streams or (None, None)
        async with stdio_server(cast(Any, stdin), cast(Any, stdout)) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def _streams() -> AbstractAsyncContextManager[Any]:
    if "--event-loop-stdio" not in sys.argv:
        return nullcontext()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from toolbus.adapters.stdio import event_loop_stdio

    return event_loop_stdio()


if __name__ == "__main__":
    anyio.run(main)
