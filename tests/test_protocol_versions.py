"""Every protocol version the SDK speaks works, for every tool.

The editor and memory suites run in the SDK client's default mode; the protocol is an
envelope around the same bus, so here each way of connecting calls every tool once: the
client's two modes (`auto` negotiates the newest, stateless protocol; `legacy` the
`initialize` handshake), and a raw client offering each handshake version in turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import NeovimProcess, json_of, text_of, toolbus
from tests.rpc_client import StdioServer, result_json, result_text, toolbus_argv

HANDSHAKE_VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
READ_ONLY_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("getOpenEditors", {}),
    ("getWorkspaceFolders", {}),
    ("getCurrentSelection", {}),
    ("getDiagnostics", {}),
    ("search", {"query": "protocol"}),
    ("timeline", {"query": "protocol"}),
]


def calls_on(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """A call of every kind of tool on `path` (open and modified in Neovim), in a sensible order."""
    return [
        ("checkDocumentDirty", {"filePath": str(path)}),
        ("saveDocument", {"filePath": str(path)}),
        ("save", {"title": "protocol", "text": f"saved {path.name}"}),
        *READ_ONLY_CALLS,
        ("openFile", {"filePath": str(path), "makeFrontmost": False}),
        ("closeAllDiffTabs", {}),
        ("close_tab", {"tab_name": str(path)}),
    ]


def prepared(nvim: NeovimProcess, files: Path, name: str) -> Path:
    path = files / name
    path.write_text("old\n")
    nvim.edit(path)
    nvim.set_lines(path, ["new"])
    return path


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_every_tool_in_each_client_mode(mode: str, journal_path: Path, nvim: NeovimProcess, files: Path) -> None:
    path = prepared(nvim, files, f"{mode}.txt")
    async with toolbus(journal_path, nvim.address, mode=mode) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        calls = calls_on(path)
        assert {tool for tool, _ in calls} <= listed
        answers = {tool: await client.call_tool(tool, args) for tool, args in calls}
    assert json_of(answers["checkDocumentDirty"])["isDirty"] is True
    assert json_of(answers["saveDocument"])["saved"] is True
    assert json_of(answers["save"])["success"] is True
    assert text_of(answers["close_tab"]) == "TAB_CLOSED"
    assert not any(answer.is_error for answer in answers.values())
    assert path.read_text() == "new\n"


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
def test_every_tool_in_each_handshake_version(
    version: str, tmp_path: Path, journal_path: Path, nvim: NeovimProcess, files: Path
) -> None:
    path = prepared(nvim, files, f"{version}.txt")
    with StdioServer(toolbus_argv(journal_path, nvim=nvim.address), stderr=tmp_path / "serve.stderr") as server:
        initialized = server.request(
            "initialize",
            {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
        )
        server.notify("notifications/initialized")
        assert initialized["protocolVersion"] == version
        calls = calls_on(path)
        answers = {tool: server.call_tool(tool, args) for tool, args in calls}
    assert result_json(answers["saveDocument"])["saved"] is True
    assert result_text(answers["close_tab"]) == "TAB_CLOSED"
    assert not any(answer.get("isError") for answer in answers.values())
    assert path.read_text() == "new\n"
