"""Editor figures: tool round trips over stdio, and the Neovim part of a call.

Round trips: `toolbus serve` (durable journal, a real headless Neovim) and a bare `mcp`
low-level server with a no-op tool run side by side; each iteration makes one call of each
kind, in a rotating order, so both see the same machine at the same moment.

The Neovim part: toolbus's `NvimEditor` awaited from an event loop, against the same Lua
request made with pynvim directly on a worker thread (timed inside that thread: the bare cost
of the request), alternating call by call.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.context import Context
from tests.bench.report import Figure
from tests.bench.stats import difference_over_rounds, ms, over_rounds, p50, p99, ratio_over_rounds
from tests.rpc_client import StdioServer

WARMUP = 30
DIRTY_RATIO = 1.2  # checkDocumentDirty's p50 over the bare no-op's
SAVE_EXTRA_MS = 1.0  # saveDocument's p50 above the bare no-op's
Samples = list[list[float]]


def run(ctx: Context) -> None:
    round_trips(ctx)
    nvim_part(ctx)


# --- round trips over stdio ---------------------------------------------------------------


def round_trips(ctx: Context) -> None:
    """Two blocks per round, each interleaving its calls: the queries, then the saves. Apart,
    because a save's disk writes (Neovim's fsync of the file, the journal's, a checkpoint)
    would otherwise land on the next query's fsync, which no no-op pays."""
    options = ctx.options
    path = ctx.open_file("round_trip.py", "print('hello')\n")
    arguments = {"filePath": str(path)}
    relaxed_journal = ctx.scratch / "round_trip_normal.db"
    with (
        ctx.toolbus(ctx.scratch / "round_trip.db") as toolbus,
        ctx.toolbus(relaxed_journal, "--journal-sync", "NORMAL", stderr="toolbus_normal") as relaxed,
        ctx.noop_server() as noop,
        ctx.noop_server("--event-loop-stdio") as noop_same_transport,
    ):
        for server in (toolbus, relaxed, noop, noop_same_transport):
            server.initialize()
        blocks: list[Block] = [
            {
                "noop": Call(noop, "noop", arguments),
                # The no-op again, on the stdio transport toolbus uses: what toolbus's own work costs.
                "noop_event_loop_stdio": Call(noop_same_transport, "noop", arguments),
                "checkDocumentDirty": Call(toolbus, "checkDocumentDirty", arguments),
                # The same query on a journal that does not wait for the disk: the disk's share, shown.
                "checkDocumentDirty_no_fsync": Call(relaxed, "checkDocumentDirty", arguments),
            },
            {
                "noop_beside_saves": Call(noop, "noop", arguments),
                "saveDocument": Call(toolbus, "saveDocument", arguments),
            },
        ]
        samples = measure_blocks(blocks, options.rounds, options.calls)
    _report_round_trips(ctx, samples)


@dataclass(frozen=True)
class Call:
    """One kind of timed call, and what to set up (untimed) before each one."""

    server: StdioServer
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None


Block = dict[str, Call]


def measure_blocks(blocks: list[Block], rounds: int, calls: int) -> dict[str, Samples]:
    """A warm-up, then `rounds` rounds; each round runs every block in turn, `calls` calls of each kind."""
    samples: dict[str, Samples] = {name: [] for block in blocks for name in block}
    for block in blocks:
        _interleaved(block, WARMUP)
    for _ in range(rounds):
        for block in blocks:
            for name, values in _interleaved(block, calls).items():
                samples[name].append(values)
    return samples


def _interleaved(block: Block, count: int) -> dict[str, list[float]]:
    """`count` calls of each kind, one of each in turn, in a rotating order."""
    order = list(block)
    timings: dict[str, list[float]] = {name: [] for name in order}
    for index in range(count):
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            timings[name].append(_timed_call(block[name]))
    return timings


def _timed_call(call: Call) -> float:
    if call.prepare is not None:
        call.prepare()
    started = time.perf_counter()
    result = call.server.call_tool(call.tool, call.arguments, deadline=30)
    elapsed = time.perf_counter() - started
    if failed(result):
        raise RuntimeError(f"{call.tool} failed during the benchmark: {result}")
    return elapsed


def failed(result: dict[str, Any]) -> bool:
    """A tool error, or a result whose JSON text carries an "error" (how nvim-mcp reports one)."""
    if result.get("isError"):
        return True
    content = result.get("content") or [{}]
    text = content[0].get("text", "")
    return text.startswith("{") and '"error"' in text and "error" in json.loads(text)


def latency(samples: Samples) -> dict[str, float]:
    return {"p50_ms": ms(over_rounds(samples, p50)), "p99_ms": ms(over_rounds(samples, p99))}


def _report_round_trips(ctx: Context, samples: dict[str, Samples]) -> None:
    noop = latency(samples["noop"])
    dirty = latency(samples["checkDocumentDirty"])
    ratio = ratio_over_rounds(samples["checkDocumentDirty"], samples["noop"])
    relaxed_ratio = ratio_over_rounds(samples["checkDocumentDirty_no_fsync"], samples["noop"])
    same_transport = latency(samples["noop_event_loop_stdio"])
    own_work = difference_over_rounds(samples["checkDocumentDirty"], samples["noop_event_loop_stdio"])
    ctx.report.add(
        Figure(
            key="editor.checkDocumentDirty_round_trip",
            summary=f"p50 {dirty['p50_ms']:.3f} ms vs no-op {noop['p50_ms']:.3f} ms: ratio {ratio:.2f}"
            f" (p99 {dirty['p99_ms']:.2f} vs {noop['p99_ms']:.2f} ms; --journal-sync NORMAL: ratio"
            f" {relaxed_ratio:.2f}); toolbus's own work: + {ms(own_work):.3f} ms over a no-op on its stdio transport",
            target=f"p50 ratio <= {DIRTY_RATIO:g}",
            met=ratio <= DIRTY_RATIO,
            measured=dirty
            | {
                "p50_ratio": ratio,
                "p50_minus_same_transport_noop_ms": ms(own_work),
                "journal_sync": "FULL",
                "journal_sync_normal": latency(samples["checkDocumentDirty_no_fsync"]) | {"p50_ratio": relaxed_ratio},
            },
            baseline=noop | {"event_loop_stdio": same_transport},
            note="journal_sync_normal: the same call on a journal that does not fsync each commit;"
            " baseline.event_loop_stdio: the no-op server reading and writing stdio as toolbus does",
        )
    )
    save = latency(samples["saveDocument"])
    extra = difference_over_rounds(samples["saveDocument"], samples["noop_beside_saves"])
    ctx.report.add(
        Figure(
            key="editor.saveDocument_round_trip",
            summary=f"p50 {save['p50_ms']:.3f} ms = no-op + {ms(extra):.3f} ms (p99 {save['p99_ms']:.2f} ms)",
            target=f"p50 <= no-op + {SAVE_EXTRA_MS:g} ms",
            met=extra <= SAVE_EXTRA_MS / 1000,
            measured=save | {"p50_minus_noop_ms": ms(extra), "journal_sync": "FULL"},
            baseline=latency(samples["noop_beside_saves"]),
        )
    )


# --- the Neovim part of a call --------------------------------------------------------------


class RawNvim:
    """pynvim on its own worker thread, timing each request inside that thread."""

    def __init__(self, address: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[Any], Any], queue.SimpleQueue[float]] | None]
        self._jobs = queue.SimpleQueue()
        self._address = address
        threading.Thread(target=self._serve, name="bench-raw-pynvim", daemon=True).start()

    def _serve(self) -> None:
        from toolbus.adapters.nvim import attach

        nvim = attach(self._address)
        while (job := self._jobs.get()) is not None:
            call, answer = job
            started = time.perf_counter()
            call(nvim)
            answer.put(time.perf_counter() - started)
        nvim.close()

    def timed(self, call: Callable[[Any], Any]) -> float:
        answer: queue.SimpleQueue[float] = queue.SimpleQueue()
        self._jobs.put((call, answer))
        return answer.get(timeout=30)

    def stop(self) -> None:
        self._jobs.put(None)


def nvim_part(ctx: Context) -> None:
    path = ctx.open_file("nvim_part.py", "x = 1\n")
    samples = asyncio.run(_nvim_part_samples(ctx, path))
    editor, raw = samples["editor"], samples["raw"]
    ratio = ratio_over_rounds(editor, raw)
    ctx.report.add(
        Figure(
            key="editor.nvim_part",
            summary=f"NvimEditor.is_dirty p50 {ms(over_rounds(editor, p50)):.3f} ms vs raw pynvim "
            f"{ms(over_rounds(raw, p50)):.3f} ms: ratio {ratio:.2f}",
            target="ratio <= 1.5",
            met=ratio <= 1.5,
            measured={"p50_ms": ms(over_rounds(editor, p50)), "p99_ms": ms(over_rounds(editor, p99))},
            baseline={"p50_ms": ms(over_rounds(raw, p50)), "p99_ms": ms(over_rounds(raw, p99))},
            note="baseline: the same exec_lua request from a worker thread, timed in that thread",
        )
    )


async def _nvim_part_samples(ctx: Context, path: Path) -> dict[str, Samples]:
    from toolbus.adapters.nvim import LUA_MODULE, NvimAddress, NvimEditor

    address = ctx.nvim.address
    editor = NvimEditor(lambda: NvimAddress(address, "bench"), timeout=10)
    raw = RawNvim(address)
    code = f"return _G[{LUA_MODULE!r}].dirty(...)"
    target = str(path.resolve())

    def raw_dirty(nvim: Any) -> None:
        nvim.exec_lua(code, target)

    async def timed_editor() -> float:
        started = time.perf_counter()
        await editor.is_dirty(target)
        return time.perf_counter() - started

    samples: dict[str, Samples] = {"editor": [], "raw": []}
    try:
        for _ in range(WARMUP):  # the first call also loads toolbus's Lua module into Neovim
            await timed_editor()
            raw.timed(raw_dirty)
        for _ in range(ctx.options.rounds):
            editor_round: list[float] = []
            raw_round: list[float] = []
            for _ in range(ctx.options.calls * 2):
                editor_round.append(await timed_editor())
                raw_round.append(raw.timed(raw_dirty))
            samples["editor"].append(editor_round)
            samples["raw"].append(raw_round)
    finally:
        raw.stop()
        editor.disconnect()
    return samples
