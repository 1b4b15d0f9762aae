"""Editor command handlers: ask the Editor, decide the reply, emit what happened."""

from __future__ import annotations

import os
import re
from typing import Any

import msgspec

from toolbus.bus import (
    CheckDocumentDirty,
    CloseTab,
    DocumentSaved,
    DocumentSaveRefused,
    GetOpenEditors,
    HandlerContext,
    SaveDocument,
    TabClosed,
    TabCloseSkipped,
    blob_hash,
)
from toolbus.handlers.ports import Editor, OpenEditor

TAB_CLOSED = "TAB_CLOSED"
WIPE_ATTEMPTS = 3
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


def expand(path: str) -> str:
    """A path as the editor gets it: `~` expanded (the command already checked it is absolute).
    Symlinks are resolved by the editor, on the machine that holds the files."""
    return os.path.expanduser(path)


def editor_of(context: HandlerContext[Any]) -> Editor:
    editor: Editor = context.services.editor
    return editor


async def get_open_editors(command: GetOpenEditors, context: HandlerContext[Any]) -> OpenEditors:
    return OpenEditors(tabs=await editor_of(context).open_editors())


async def check_document_dirty(
    command: CheckDocumentDirty, context: HandlerContext[Any]
) -> DirtyState | NotOpen:
    dirty = await editor_of(context).is_dirty(expand(command.filePath))
    if dirty is None:
        return NotOpen(success=False, message=f"Document not open: {command.filePath}")
    return DirtyState(success=True, filePath=command.filePath, isDirty=dirty)


async def save_document(command: SaveDocument, context: HandlerContext[Any]) -> SaveResult:
    outcome = await editor_of(context).save(expand(command.filePath))
    path = outcome.path  # resolved: every spelling of one file shares its history
    if outcome.status == "saved" and outcome.after is not None:
        written = blob_hash(outcome.after)
        blobs = {written: outcome.after}
        replaced = None
        if outcome.before is not None:
            replaced = blob_hash(outcome.before)
            blobs[replaced] = outcome.before
        await context.commit(
            DocumentSaved(
                path=path,
                written_blob=written,
                bytes_written=len(outcome.after),
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
    elif outcome.status == "saved":  # written, but the file could not be read back
        message = "Failed to save: the file could not be read back after :write; check it on disk"
    else:
        message = f"Failed to save: {vim_error(outcome.message)}"
    reason = "vim_error" if outcome.status == "saved" else outcome.status
    await context.commit(DocumentSaveRefused(path=path, reason=reason, message=message))
    return SaveResult(success=False, filePath=command.filePath, saved=False, message=message)


async def close_tab(command: CloseTab, context: HandlerContext[Any]) -> str:
    editor = editor_of(context)
    expanded = expand(command.tab_name)
    exact = expanded if os.path.isabs(expanded) else None
    for _ in range(WIPE_ATTEMPTS):
        match = await editor.find_tab(command.tab_name, exact)
        if match.status != "found":
            await context.commit(
                TabCloseSkipped(tab_name=command.tab_name, reason=match.status, candidates=match.candidates)
            )
            return TAB_CLOSED
        discarded = None
        if match.discarded is not None:
            # Durable before the wipe: a close is never a loss, whatever happens next.
            discarded = blob_hash(match.discarded)
            await context.keep({discarded: match.discarded})
        if await editor.wipe(match.buffer, match.tick):
            await context.commit(
                TabClosed(
                    path=match.path,
                    tab_name=command.tab_name,
                    was_modified=match.modified,
                    discarded_blob=discarded,
                )
            )
            return TAB_CLOSED
    # The user kept typing into it: leave their buffer alone rather than chase it.
    await context.commit(TabCloseSkipped(tab_name=command.tab_name, reason="busy", candidates=[match.path]))
    return TAB_CLOSED


def vim_error(message: str) -> str:
    """A Vim error as `Exxx: text`, without the Lua traceback or Vim's `(add ! to override)`."""
    match = _VIM_ERROR.search(message)
    return match[1] if match else message.strip().splitlines()[0] if message.strip() else "unknown error"
