"""A minimal, synchronous MCP client over stdio, for fault tests and benchmarks.

`mcp.Client` hides its server process; these tests need the process itself (to kill -9 it,
to read its RSS, to time its start) and byte-level control of what is sent (lone surrogates,
20 MB lines). It speaks newline-delimited JSON-RPC with the legacy `initialize` handshake.
Every read has a deadline: nothing here can hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PROTOCOL_VERSION = "2025-11-25"
DEFAULT_DEADLINE = 30.0


class ServerGone(Exception):
    """The server closed its stdout (it exited or was killed)."""


class NoAnswer(TimeoutError):
    """The server did not answer before the deadline."""


class RpcError(Exception):
    """A JSON-RPC error response (not a tool error: those are results with isError)."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.error = dict(error)


def toolbus_argv(journal: Path, *flags: str, nvim: str | None = None) -> list[str]:
    """`toolbus serve` through the interpreter running the tests (the venv's)."""
    argv = [sys.executable, "-m", "toolbus.adapters.cli", "serve", "--journal", str(journal)]
    if nvim:
        argv += ["--nvim", nvim]
    return [*argv, *flags]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without anything that would point toolbus at another Neovim or journal."""
    dropped = ("NVIM", "TOOLBUS_NVIM", "TOOLBUS_JOURNAL", "TOOLBUS_AGENT", "TOOLBUS_DEPARTMENT")
    return {k: v for k, v in os.environ.items() if k not in dropped} | dict(extra or {})


class StdioServer:
    """One MCP server process and a blocking client for it. Use as a context manager."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stderr: Path | None = None,
        cwd: Path | None = None,
    ) -> None:
        self._stderr = open(stderr, "ab") if stderr else subprocess.DEVNULL  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=dict(env) if env is not None else clean_env(),
            cwd=cwd,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin.fileno()
        self._out = self.process.stdout.fileno()
        self._buffer = bytearray()
        self._next_id = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    def __enter__(self) -> StdioServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- protocol -------------------------------------------------------------------------

    def initialize(self, deadline: float = DEFAULT_DEADLINE) -> dict[str, Any]:
        result = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "toolbus-tests", "version": "0"},
            },
            deadline=deadline,
        )
        self.notify("notifications/initialized")
        return result

    def call_tool(self, name: str, arguments: Any = None, *, deadline: float = DEFAULT_DEADLINE) -> dict[str, Any]:
        """A `tools/call` result: `{"content": [...], "isError": bool?}`."""
        params: dict[str, Any] = {"name": name}
        if arguments is not None:
            params["arguments"] = arguments
        return self.request("tools/call", params, deadline=deadline)

    def request(self, method: str, params: Any, *, deadline: float = DEFAULT_DEADLINE) -> dict[str, Any]:
        request_id = self.send_request(method, params)
        return self.wait_for(request_id, deadline=deadline)

    def send_request(self, method: str, params: Any) -> int:
        """Send without waiting; returns the request id for `wait_for`."""
        self._next_id += 1
        self.send_raw(json.dumps({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}))
        return self._next_id

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send_raw(json.dumps(message))

    def send_raw(self, line: str | bytes) -> None:
        data = line.encode() if isinstance(line, str) else line
        try:
            view = memoryview(data + b"\n")
            while view:
                view = view[os.write(self._in, view) :]
        except (BrokenPipeError, ConnectionResetError) as error:
            raise ServerGone(f"server stdin closed (exit code {self.process.poll()})") from error

    def wait_for(self, request_id: int, *, deadline: float = DEFAULT_DEADLINE) -> dict[str, Any]:
        """The response to `request_id`; notifications and other responses are skipped."""
        until = time.monotonic() + deadline
        while True:
            message = json.loads(self._read_line(until))
            if message.get("id") != request_id or "method" in message:
                continue
            if "error" in message:
                raise RpcError(message["error"])
            result: dict[str, Any] = message["result"]
            return result

    def wait_for_all(self, request_ids: Sequence[int], *, deadline: float = DEFAULT_DEADLINE) -> list[dict[str, Any]]:
        """The results of `request_ids`, in that order, whatever order they come back in."""
        until = time.monotonic() + deadline
        results: dict[int, dict[str, Any]] = {}
        while len(results) < len(request_ids):
            message = json.loads(self._read_line(until))
            if message.get("id") in request_ids and "method" not in message:
                if "error" in message:
                    raise RpcError(message["error"])
                results[message["id"]] = message["result"]
        return [results[request_id] for request_id in request_ids]

    def _read_line(self, until: float) -> bytes:
        while (end := self._buffer.find(b"\n")) < 0:
            remaining = until - time.monotonic()
            if remaining <= 0 or not select.select([self._out], [], [], remaining)[0]:
                raise NoAnswer("the server did not answer in time")
            chunk = os.read(self._out, 1 << 20)
            if not chunk:
                raise ServerGone(f"server stdout closed (exit code {self.process.poll()})")
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        return line

    # --- process --------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """kill -9, and reap."""
        if self.alive():
            self.process.kill()
        self.process.wait(timeout=10)

    def close(self, timeout: float = 10) -> int | None:
        """Close stdin (the MCP way to stop a stdio server) and wait; kill if it lingers."""
        if self.process.stdin and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()
        if not isinstance(self._stderr, int):  # our file, not DEVNULL
            self._stderr.close()
        return self.process.returncode


def result_text(result: Mapping[str, Any]) -> str:
    [content] = result["content"]
    return str(content["text"])


def result_json(result: Mapping[str, Any]) -> Any:
    assert not result.get("isError"), result_text(result)
    return json.loads(result_text(result))
