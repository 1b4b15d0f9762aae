"""toolbus beside nvim-mcp 1.1.1, the fastest Python peer (it journals nothing).

Round trips: toolbus (durable journal, and again at `--journal-sync NORMAL`), nvim-mcp and the
bare no-op, all over stdio with the same raw client, on the same headless Neovim holding the
same 21 buffers; interleaved call by call in rotating order, block by block, round by round
(editor.measure_blocks). Each comparable operation is a pair of calls:

  list buffers   getOpenEditors       nvim-mcp get_state_brief (buffers, modified_buffers, ...)
  is it modified checkDocumentDirty   nvim-mcp get_state_brief
  save           saveDocument         nvim-mcp send_command `write` (the buffer current, modified)
  close          close_tab            nvim-mcp send_command `bwipeout <path>` (a buffer opened for it)

Behaviour: what each does where they differ, observed on a Neovim of its own (behaviour()).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from tests.bench.context import Context
from tests.bench.editor import Block, Call, Samples, measure_blocks
from tests.bench.report import Figure
from tests.bench.stats import ms, over_rounds, p50, ratio_over_rounds
from tests.rpc_client import NoAnswer, StdioServer

BUFFERS = 21  # open in Neovim while the list is timed, as in the issue's measurement
TARGET = "faster than nvim-mcp: p50 ratio < 1"

# operation: (toolbus tool, nvim-mcp's call)
OPERATIONS = {
    "list": ("getOpenEditors", "get_state_brief"),
    "dirty": ("checkDocumentDirty", "get_state_brief"),
    "save": ("saveDocument", "send_command write"),
    "close": ("close_tab", "send_command bwipeout"),
}


def run(ctx: Context) -> None:
    if find_spec("nvim_mcp") is None:
        for name in OPERATIONS:
            ctx.report.skip(f"editor.peer_{name}", TARGET, "nvim-mcp is not installed (the bench extra)")
        return
    _report(ctx, _round_trips(ctx))
    behaviour(ctx)


# --- round trips ----------------------------------------------------------------------------


def _round_trips(ctx: Context) -> dict[str, Samples]:
    nvim = ctx.nvim
    nvim.command("silent! %bwipeout!")  # the earlier sections' buffers: exactly BUFFERS are open
    files = [ctx.open_file(f"peer/buffer_{i:02}.py", f"x = {i}\n") for i in range(BUFFERS)]
    target = str(files[0].resolve())
    closing = ctx.scratch / "files" / "peer" / "closing.py"
    closing.write_text("closed = True\n")
    edits = iter(range(1 << 62))

    def modify() -> None:  # every save writes a changed buffer, the current one (what `write` saves)
        nvim.lua(
            "local buf = vim.fn.bufnr(...); vim.api.nvim_set_current_buf(buf);"
            " vim.api.nvim_buf_set_lines(buf, 0, -1, false, {select(2, ...)})",
            target,
            f"x = {next(edits)}",
        )

    def reopen() -> None:
        nvim.edit(closing)

    with (
        ctx.toolbus(ctx.scratch / "peer.db", stderr="toolbus_peer") as toolbus,
        ctx.toolbus(ctx.scratch / "peer_normal.db", "--journal-sync", "NORMAL", stderr="toolbus_peer_normal") as normal,
        ctx.nvim_mcp(nvim.address) as peer,
        ctx.noop_server() as noop,
    ):
        for server in (toolbus, normal, noop):
            server.initialize()
        dirty = {"filePath": target}
        save = {"filePath": target}
        close = {"tab_name": str(closing)}
        blocks: list[Block] = [
            {
                "toolbus.list": Call(toolbus, "getOpenEditors"),
                "normal.list": Call(normal, "getOpenEditors"),
                "toolbus.dirty": Call(toolbus, "checkDocumentDirty", dirty),
                "normal.dirty": Call(normal, "checkDocumentDirty", dirty),
                "nvim_mcp.brief": Call(peer, "get_state_brief"),
                "noop.queries": Call(noop, "noop"),
            },
            {
                "toolbus.save": Call(toolbus, "saveDocument", save, modify),
                "normal.save": Call(normal, "saveDocument", save, modify),
                "nvim_mcp.save": Call(peer, "send_command", {"command": "write"}, modify),
                "noop.saves": Call(noop, "noop"),
            },
            {
                "toolbus.close": Call(toolbus, "close_tab", close, reopen),
                "normal.close": Call(normal, "close_tab", close, reopen),
                "nvim_mcp.close": Call(peer, "send_command", {"command": f"bwipeout {closing}"}, reopen),
                "noop.closes": Call(noop, "noop"),
            },
        ]
        _check_listing(toolbus, peer)
        return measure_blocks(blocks, ctx.options.rounds, ctx.options.calls)


def _check_listing(toolbus: StdioServer, peer: StdioServer) -> None:
    """Both see the same BUFFERS buffers: the list compared is the same list."""
    editors = json.loads(toolbus.call_tool("getOpenEditors")["content"][0]["text"])
    brief = json.loads(peer.call_tool("get_state_brief")["content"][0]["text"])
    counts = (len(editors["tabs"]), len(brief["buffers"]))
    if counts != (BUFFERS, BUFFERS):
        raise RuntimeError(f"expected {BUFFERS} buffers in both listings, got {counts}")


# operation -> (the nvim-mcp samples it is compared with, the no-op beside it)
_BESIDE = {
    "list": ("nvim_mcp.brief", "noop.queries"),
    "dirty": ("nvim_mcp.brief", "noop.queries"),
    "save": ("nvim_mcp.save", "noop.saves"),
    "close": ("nvim_mcp.close", "noop.closes"),
}


def _report(ctx: Context, samples: dict[str, Samples]) -> None:
    for name, (tool, peer_call) in OPERATIONS.items():
        peer_key, noop_key = _BESIDE[name]
        toolbus, normal, peer = samples[f"toolbus.{name}"], samples[f"normal.{name}"], samples[peer_key]
        ratio = ratio_over_rounds(toolbus, peer)
        normal_ratio = ratio_over_rounds(normal, peer)
        median = {
            key: ms(over_rounds(values, p50))
            for key, values in (("toolbus", toolbus), ("normal", normal), ("peer", peer), ("noop", samples[noop_key]))
        }
        ctx.report.add(
            Figure(
                key=f"editor.peer_{name}",
                summary=f"{tool} p50 {median['toolbus']:.3f} ms vs nvim-mcp {peer_call} {median['peer']:.3f} ms:"
                f" ratio {ratio:.2f} (NORMAL {median['normal']:.3f} ms, ratio {normal_ratio:.2f};"
                f" no-op {median['noop']:.3f} ms)",
                target=TARGET,
                met=ratio < 1,
                measured={
                    "tool": tool,
                    "p50_ms": median["toolbus"],
                    "p50_ratio": ratio,
                    "journal_sync_normal": {"p50_ms": median["normal"], "p50_ratio": normal_ratio},
                },
                baseline={
                    "nvim_mcp": {"call": peer_call, "p50_ms": median["peer"]},
                    "noop": {"p50_ms": median["noop"]},
                },
                note=f"{BUFFERS} buffers open; ratio: median over rounds of p50(toolbus) / p50(nvim-mcp)",
            )
        )


# --- behaviour where they differ --------------------------------------------------------------


def behaviour(ctx: Context) -> None:
    """On a Neovim of its own (a prompt could leave it waiting): a durable record of a save, a
    save over a file changed on disk, and a path that names a file not open."""
    from tests.conftest import NeovimProcess

    root = ctx.scratch / "peer_behaviour"
    home = root / "home"  # nvim-mcp's HOME, XDG folders, TMPDIR and cwd: anything it keeps lands here
    home.mkdir(parents=True)
    nvim = NeovimProcess(root / "nvim")
    nvim.command(f"cd {root}")
    peer_env = {name: str(home) for name in ("HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "TMPDIR")}
    journal = root / "toolbus.db"
    try:
        with (
            ctx.toolbus(journal, nvim=nvim.address, stderr="toolbus_behaviour") as toolbus,
            ctx.nvim_mcp(nvim.address, env=peer_env, cwd=home) as peer,
        ):
            toolbus.initialize()
            measured = {
                "record_of_a_save": _record(nvim, toolbus, peer, root, home, journal),
                "save_over_a_file_changed_on_disk": _conflict(nvim, toolbus, peer, root),
                "path_naming_a_file_not_open": _paths(nvim, toolbus, peer, root),
            }
    finally:
        nvim.kill()
    ctx.report.add(
        Figure(
            key="editor.peer_behaviour",
            summary=_behaviour_summary(measured),
            target="observed, not judged",
            met=None,
            measured=measured,
            note="each case on a fresh file in a Neovim of its own; see tests/bench/peer.py",
        )
    )


Nvim = Any  # tests.conftest.NeovimProcess, imported lazily as Context.nvim does


def _text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


def _answer(result: dict[str, Any]) -> Any:
    return json.loads(_text(result))


def _open_modified(nvim: Nvim, path: Path, disk: str, buffer: str) -> Path:
    """`path` on disk, open in Neovim, its buffer changed: a save would write `buffer`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(disk)
    nvim.edit(path)
    nvim.set_lines(path, [buffer])
    return path


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _record(
    nvim: Nvim, toolbus: StdioServer, peer: StdioServer, root: Path, home: Path, journal: Path
) -> dict[str, Any]:
    """After a save: what was kept, and where."""
    mine = _open_modified(nvim, root / "record_toolbus.py", "a = 1\n", "a = 2")
    theirs = _open_modified(nvim, root / "record_nvim_mcp.py", "a = 1\n", "a = 2")
    before = _files_under(home)
    peer.call_tool("send_command", {"command": "write"})  # record_nvim_mcp.py: the current buffer
    toolbus.call_tool("saveDocument", {"filePath": str(mine.resolve())})
    with sqlite3.connect(journal) as db:
        rows = db.execute(
            "SELECT event_type, recoverable_bytes FROM file_history WHERE stream = 'file:' || ?", (str(mine.resolve()),)
        ).fetchall()
    return {
        "toolbus": {"journal_events_for_the_file": [list(row) for row in rows]},
        "nvim_mcp": {
            "saved": theirs.read_text() == "a = 2\n",
            "files_it_created_in_its_home_xdg_tmpdir_cwd": sorted(set(_files_under(home)) - set(before)),
        },
    }


def _conflict(nvim: Nvim, toolbus: StdioServer, peer: StdioServer, root: Path) -> dict[str, Any]:
    """A modified buffer whose file someone else changed on disk since it was read."""
    outcomes: dict[str, Any] = {}
    for who in ("toolbus", "nvim_mcp"):
        path = _open_modified(nvim, root / f"conflict_{who}.py", "base = 1\n", "mine = 1")
        path.write_text("theirs = 1\n")
        later = time.time() + 5  # a different mtime, however coarse the clock
        os.utime(path, (later, later))
        if who == "toolbus":
            started = time.perf_counter()
            answer = _text(toolbus.call_tool("saveDocument", {"filePath": str(path.resolve())}))
            waited, meanwhile, after = round(time.perf_counter() - started, 1), None, _mode(nvim)
        else:
            answer, waited, meanwhile, after = _peer_write(nvim, peer)
        disk = path.read_text()
        outcomes[who] = {
            "answer": answer[:300],
            "answered_after_s": waited,
            "neovim_mode_2_s_in": meanwhile,
            "neovim_mode_after": after,
            "disk_after": "overwritten with the buffer" if disk.startswith("mine") else "their change kept",
        }
    return outcomes


def _peer_write(nvim: Nvim, peer: StdioServer, patience: float = 30.0) -> tuple[str, float, str | None, str]:
    """send_command `write` of the current buffer: its answer, how long it took, and Neovim's
    mode 2 s in and after it (a prompt left open is then answered "n", so the rest can go on)."""
    started = time.perf_counter()
    request = peer.send_request("tools/call", {"name": "send_command", "arguments": {"command": "write"}})
    meanwhile: str | None = None
    try:
        answer = _text(peer.wait_for(request, deadline=2))
    except NoAnswer:
        meanwhile = _mode(nvim)
        try:
            answer = _text(peer.wait_for(request, deadline=patience))
        except NoAnswer:
            answer = f"no answer in {patience:.0f} s"
    waited = round(time.perf_counter() - started, 1)
    after = _mode(nvim)
    for _ in range(5):  # nvim_input and nvim_get_mode are served even while Vim waits at a prompt
        if _mode(nvim) == "n":
            break
        nvim.call(lambda n: n.input("n"))
        time.sleep(0.2)
    return answer, waited, meanwhile, after


def _mode(nvim: Nvim) -> str:
    """Neovim's mode: "n" normal, "r?" at a yes/no prompt; "(blocking)": waiting for input."""
    mode = nvim.call(lambda n: n.api.get_mode())
    return f"{mode['mode']}{' (blocking)' if mode['blocking'] else ''}"


def _paths(nvim: Nvim, toolbus: StdioServer, peer: StdioServer, root: Path) -> dict[str, Any]:
    """Only other/path/a.py is open; each is asked about path/a.py (on disk, not open)."""
    other = root / "other" / "path" / "a.py"
    wanted = root / "path" / "a.py"
    for path, text in ((other, "other = 1\n"), (wanted, "wanted = 1\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    nvim.edit(other)

    def other_state() -> str:
        return " ".join(nvim.lines(other)) if str(other) in nvim.buffer_names() else "closed"

    found: dict[str, Any] = {"nvim_mcp": {}, "toolbus": {}}
    for form, name in (("relative to cwd, as its docs ask", "path/a.py"), ("absolute", str(wanted))):
        found["nvim_mcp"][f"read_full_buf, {form}"] = _text(peer.call_tool("read_full_buf", {"file": name}))[:200]
    edit = {"file": "path/a.py", "old_string": "other = 1", "new_string": "edited = 1"}
    found["nvim_mcp"]["find_and_replace_buf path/a.py"] = _text(peer.call_tool("find_and_replace_buf", edit))[:200]
    found["nvim_mcp"]["other/path/a.py afterwards"] = other_state()
    nvim.command(f"edit! {other}")  # its text back, for toolbus
    found["toolbus"]["checkDocumentDirty, absolute"] = _text(
        toolbus.call_tool("checkDocumentDirty", {"filePath": str(wanted)})
    )[:200]
    toolbus.call_tool("close_tab", {"tab_name": str(wanted)})
    found["toolbus"]["close_tab absolute path/a.py: other/path/a.py afterwards"] = other_state()
    toolbus.call_tool("close_tab", {"tab_name": "path/a.py"})
    found["toolbus"]["close_tab bare path/a.py: other/path/a.py afterwards"] = other_state()
    return found


def _behaviour_summary(measured: dict[str, Any]) -> str:
    record, conflict = measured["record_of_a_save"], measured["save_over_a_file_changed_on_disk"]
    peer_files = record["nvim_mcp"]["files_it_created_in_its_home_xdg_tmpdir_cwd"]
    return (
        f"save record: toolbus {len(record['toolbus']['journal_events_for_the_file'])} journal events,"
        f" nvim-mcp {len(peer_files)} files; changed on disk: toolbus {conflict['toolbus']['disk_after']},"
        f" nvim-mcp {conflict['nvim_mcp']['disk_after']}"
        f" (answered after {conflict['nvim_mcp']['answered_after_s']} s,"
        f" Neovim's mode 2 s in {conflict['nvim_mcp']['neovim_mode_2_s_in']!r})"
    )
