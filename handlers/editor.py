"""Editor command handlers: ask the Editor, decide the reply, emit what happened."""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec

from bus import (
    CheckDocumentDirty,
    CloseTab,
    DocumentSaved,
    DocumentSaveRefused,
    GetOpenEditors,
    HandlerContext,
    SaveDocument,
    TabClosed,
    TabCloseSkipped,
    absolute_path,
    blob_hash,
)
from handlers.ports import Editor, OpenEditor

TAB_CLOSED = "TAB_CLOSED"
SAVED = "Document saved successfully"
CONFLICT = (
    "Failed to save: the file changed on disk since Neovim read it, and the buffer has unsaved changes. "
    "Nothing was written: both versions are intact. Reload or merge in Neovim, then save again"
)
# "E45: 'readonly' option is set (add ! to override)" -> "E45: 'readonly' option is set"
_VIM_ERROR = re.compile(r"(E\d+: .*?)(?: \(add ! to override\))?$", re.MULTILINE)


class OpenEditors(msgspec.Struct, frozen=True):
    tabs: list[OpenEditor]


class DirtyState(msgspec.Struct, frozen=True):
    success: bool
    filePath: str
    isDirty: bool
    isUntitled: bool = False


class NotOpen(msgspec.Struct, frozen=True):
    success: bool
    message: str


class SaveResult(msgspec.Struct, frozen=True):
    success: bool
    filePath: str
    saved: bool
    message: str


def normalise(path: str) -> str:
    """The one path form buffers are compared in: absolute, `~` expanded, symlinks resolved."""
    return os.path.realpath(absolute_path("filePath", path))


def editor_of(context: HandlerContext[Any]) -> Editor:
    editor: Editor = context.services.editor
    return editor


async def get_open_editors(command: GetOpenEditors, context: HandlerContext[Any]) -> OpenEditors:
    return OpenEditors(tabs=await editor_of(context).open_editors())


async def check_document_dirty(
    command: CheckDocumentDirty, context: HandlerContext[Any]
) -> DirtyState | NotOpen:
    dirty = await editor_of(context).is_dirty(normalise(command.filePath))
    if dirty is None:
        return NotOpen(success=False, message=f"Document not open: {command.filePath}")
    return DirtyState(success=True, filePath=command.filePath, isDirty=dirty)


async def save_document(command: SaveDocument, context: HandlerContext[Any]) -> SaveResult:
    path = normalise(command.filePath)
    outcome = await editor_of(context).save(path)
    if outcome.status == "saved":
        after = outcome.after or b""
        blobs = {blob_hash(after): after}
        replaced = None
        if outcome.before is not None:
            replaced = blob_hash(outcome.before)
            blobs[replaced] = outcome.before
        await context.commit(
            DocumentSaved(
                path=path,
                written_blob=blob_hash(after),
                bytes_written=len(after),
                replaced_blob=replaced,
                disk_changed=outcome.changed,
                reloaded=outcome.reloaded,
            ),
            blobs=blobs,
        )
        return SaveResult(success=True, filePath=command.filePath, saved=True, message=SAVED)
    if outcome.status == "not_open":
        message = f"Document not open: {command.filePath}"
    elif outcome.status == "conflict":
        message = CONFLICT
    else:
        message = f"Failed to save: {vim_error(outcome.message)}"
    await context.commit(DocumentSaveRefused(path=path, reason=outcome.status, message=message))
    return SaveResult(success=False, filePath=command.filePath, saved=False, message=message)


async def close_tab(command: CloseTab, context: HandlerContext[Any]) -> str:
    expanded = os.path.expanduser(command.tab_name)
    exact = os.path.realpath(expanded) if os.path.isabs(expanded) else None
    outcome = await editor_of(context).close_tab(command.tab_name, exact)
    if outcome.status == "closed":
        blobs = {}
        discarded = None
        if outcome.discarded is not None:
            discarded = blob_hash(outcome.discarded)
            blobs[discarded] = outcome.discarded
        await context.commit(
            TabClosed(
                path=outcome.path,
                tab_name=command.tab_name,
                was_modified=outcome.modified,
                discarded_blob=discarded,
            ),
            blobs=blobs,
        )
    else:
        await context.commit(
            TabCloseSkipped(tab_name=command.tab_name, reason=outcome.status, candidates=outcome.candidates)
        )
    return TAB_CLOSED


def vim_error(message: str) -> str:
    """A Vim error as `Exxx: text`, without the Lua traceback or Vim's `(add ! to override)`."""
    match = _VIM_ERROR.search(message)
    return match[1] if match else message.strip().splitlines()[0] if message.strip() else "unknown error"
