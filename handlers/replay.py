"""The replay handlers (`toolbus replay editor`): a recorded write or close, re-applied to a
Neovim through the bus, so the replay itself is journaled like any other change."""

from __future__ import annotations

from typing import Any

import msgspec

from toolbus.bus import Fault, FileReplayed, HandlerContext, ReplayClose, ReplayWrite, Unfinished
from toolbus.handlers.editor import vim_error
from toolbus.handlers.ports import Editor, Texts


class Replayed(msgspec.Struct, frozen=True, kw_only=True):
    done: bool  # False: there was nothing to do (a close of a file not open there)
    kept: str | None = None  # where the file's unknown earlier text was copied first
    not_loaded: str | None = None  # why Neovim could not load the file written, if it could not


async def replay_write(command: ReplayWrite, context: HandlerContext[Any]) -> Replayed:
    editor: Editor = context.services.editor
    content = await _text(context.services.texts, command.blob)
    known = [await _text(context.services.texts, digest) for digest in command.known]
    await context.write_ahead()
    result = await editor.replace_file(command.file, content, known)
    if result.status == "modified":
        raise Fault(_unsaved(command.file))
    if result.status == "error":
        if result.kept:  # the file is as it was, and a copy of it beside it
            raise Unfinished(f"{vim_error(result.message)}; kept the text the file held in {result.kept}")
        raise Fault(vim_error(result.message))
    path = result.path or command.file
    event = FileReplayed(
        path=path, from_position=command.event, action="write", written_blob=command.blob, kept_copy=result.kept
    )
    await context.commit(event)
    return Replayed(done=True, kept=result.kept, not_loaded=vim_error(result.message) if result.message else None)


async def replay_close(command: ReplayClose, context: HandlerContext[Any]) -> Replayed:
    editor: Editor = context.services.editor
    await context.write_ahead()
    closed = await editor.close_file(command.file)
    if closed.status == "modified":
        raise Fault(_unsaved(command.file))
    if closed.status == "refused":
        raise Fault(closed.message)
    if closed.status == "not_open":
        return Replayed(done=False)
    await context.commit(FileReplayed(path=closed.path or command.file, from_position=command.event, action="close"))
    return Replayed(done=True)


async def _text(texts: Texts, digest: str) -> bytes:
    content = await texts.text(digest)
    if content is None:
        raise Fault(f"the journal has lost blob {digest}: it cannot be replayed")
    return content


def _unsaved(path: str) -> str:
    return f"{path} has unsaved changes in this Neovim: save or close it, then replay again"
