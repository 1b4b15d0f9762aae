"""The baseline: a bare `mcp` low-level server over stdio with one tool that does nothing.

Run as a script (`python tests/bench/noop_server.py`), so it imports nothing but `mcp`.
"""

from __future__ import annotations

from typing import Any

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


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text='{"success":true}')])


async def main() -> None:
    server = Server("noop", version="0", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
