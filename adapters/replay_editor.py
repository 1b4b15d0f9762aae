"""`toolbus replay editor`: re-apply recorded saves, restores and closes to a Neovim.

Each step is a bus command (`replay_write`, `replay_close`), journaled like any change: its
write-ahead row before Neovim is touched, its event after. A replayed write sends the exact
bytes the journal recorded (through Neovim, so the Neovim may be on another machine) and
leaves the file open there, loaded from what was written; a replayed close wipes the buffer.
A buffer with unsaved changes is never overwritten or wiped: the replay stops and says so. A
file holding a text the journal does not have for it is copied to `FILE.~N~` first. Every
Neovim request waits at most `--nvim-timeout`: a blocked Neovim stops the replay, never hangs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import anyio

from toolbus.adapters.bootstrap import build_bus, identity, neovim_at, open_writer
from toolbus.adapters.config import Settings, cli_caller
from toolbus.bus import Bus, Caller, EditorLost, EditorTimeout, Fault, ToolbusError, Unfinished
from toolbus.handlers.replay import Replayed
from toolbus.journal import EditorStep

Report = Callable[[str], None]


def replay_to_neovim(settings: Settings, address: str, steps: Iterable[EditorStep], report: Report) -> int:
    """Apply each step in order, reporting each once done; raise a `Fault` at the first that fails
    (`Unfinished` once a step is done, or may be)."""
    editor = neovim_at(address, settings.nvim_timeout)
    journal = open_writer(settings, create=False)
    try:
        bus = build_bus(settings, journal, editor, cli=True)
        return anyio.run(replay_steps, bus, cli_caller(identity(settings, journal), "toolbus replay"), steps, report)
    finally:
        editor.disconnect()
        journal.close()


async def replay_steps(bus: Bus, caller: Caller, steps: Iterable[EditorStep], report: Report) -> int:
    """The number of steps there was nothing to do for."""
    idle = 0
    for count, step in enumerate(steps):
        try:
            done, acted = await _apply(bus, caller, step)
        except ToolbusError as error:
            message = str(error).removeprefix("Error executing lua: ").split("\n")[0]
            steps_done = f"{count} step{'s' if count != 1 else ''}"
            go_on = f" ({steps_done} before it done: --from {step.position} goes on from here)" if count else ""
            # Files were changed by the steps before it, or may have been by this one: a copy
            # kept, or a request Neovim may still carry out (timed out, or cut off once sent).
            changed = count > 0 or isinstance(error, (Unfinished, EditorTimeout, EditorLost))
            stopped = Unfinished if changed else Fault
            raise stopped(f"replay stopped at @{step.position}: {message}{go_on}") from None
        report(done)
        idle += not acted
    return idle


async def _apply(bus: Bus, caller: Caller, step: EditorStep) -> tuple[str, bool]:
    """What was done, in words, and whether there was anything to do; a `ToolbusError` when it
    could not be done."""
    if step.action == "close":
        closed = await bus.handle("replay_close", {"path": step.path, "event": step.position}, caller)
        assert isinstance(closed, Replayed)
        return step.describe() + ("" if closed.done else " (not open there: nothing to close)"), closed.done
    arguments = {"path": step.path, "blob": step.blob, "event": step.position, "known": list(step.known)}
    result = await bus.handle("replay_write", arguments, caller)
    assert isinstance(result, Replayed)
    kept = f"; kept the text the file held in {result.kept}" if result.kept else ""
    not_loaded = f"; Neovim could not load it: {result.not_loaded}" if result.not_loaded else ""
    return step.describe() + kept + not_loaded, True
