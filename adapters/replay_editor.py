"""`toolbus replay editor`: re-apply recorded saves, restores and closes to a Neovim.

It goes through `NvimEditor` like every editor tool: one thread per connection, every request
within `--nvim-timeout`, a Neovim that stops answering interrupted rather than waited for.
A replayed save writes the exact bytes the journal recorded (through Neovim, so the Neovim
may be on another machine) and leaves the file open there, loaded from what was written; a
replayed close wipes the buffer. A buffer with unsaved changes is never overwritten or wiped:
the replay stops and says so. A file holding a text the journal does not have for it (edited
since, or another file at the mapped place) is copied to `FILE.~N~` before it is overwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import anyio

from toolbus.adapters.nvim import NvimAddress, NvimEditor, NvimRequestError
from toolbus.bus import Fault, ToolbusError
from toolbus.journal.sqlite.replay import EditorStep

Report = Callable[[str], None]


def replay_to_neovim(address: str, timeout: float, steps: Iterable[EditorStep], report: Report) -> None:
    """Apply each step in order, reporting each once done; raise a `Fault` at the first that fails."""
    editor = NvimEditor(lambda: NvimAddress(address, "--nvim"), timeout)
    try:
        anyio.run(replay_steps, editor, steps, report)
    finally:
        editor.disconnect()


async def replay_steps(editor: NvimEditor, steps: Iterable[EditorStep], report: Report) -> None:
    for step in steps:
        try:
            done = await _apply(editor, step)
        except (ToolbusError, NvimRequestError) as error:
            message = str(error).removeprefix("Error executing lua: ").split("\n")[0]
            raise Fault(f"replay stopped at @{step.position}: {message}") from None
        report(done)


async def _apply(editor: NvimEditor, step: EditorStep) -> str:
    """What was done, in words; a `Fault` when it could not be."""
    if step.action == "close":
        if await editor.close_file(step.path) == "modified":
            raise Fault(_unsaved(step.path))
        return step.describe()
    result = await editor.replace_file(step.path, step.content or b"", step.known)
    kept = f"; kept the text the file held in {result.kept}" if result.kept else ""
    if result.status == "modified":
        raise Fault(_unsaved(step.path))
    if result.status == "error":
        raise Fault(result.message + kept)
    return step.describe() + kept


def _unsaved(path: str) -> str:
    return f"{path} has unsaved changes in this Neovim: save or close it, then replay again"
