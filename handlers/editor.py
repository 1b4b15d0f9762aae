"""Editor command handlers: ask the Editor, decide the reply, emit what happened."""

from __future__ import annotations

import os
import re
from typing import Any, Literal

import msgspec

from toolbus.bus import (
    CheckDocumentDirty,
    CloseTab,
    DocumentSaved,
    DocumentSaveRefused,
    EditorLost,
    EditorTimeout,
    GetOpenEditors,
    HandlerContext,
    JournalUnavailable,
    SaveDocument,
    TabClosed,
    TabCloseSkipped,
    blob_hash,
)
from toolbus.handlers.ports import Editor, OpenEditor, SaveOutcome, SaveTarget

Refusal = Literal["not_open", "conflict", "vim_error", "busy"]  # why a save wrote nothing
TAB_CLOSED = "TAB_CLOSED"
WIPE_ATTEMPTS = 3
WRITE_ATTEMPTS = 3
SAVED = "Document saved successfully"
CONFLICT = (
    "Failed to save: the file changed on disk since Neovim read it, and the buffer has unsaved changes. "
    "Nothing was written: both versions are intact. Reload or merge in Neovim, then save again"
)
BUSY = (
    "Failed to save: the buffer or its file kept changing while toolbus was saving it. "
    "Nothing was written; try again"
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


class Failure(msgspec.Struct, frozen=True):
    """`{"success":false,"message"}`: a domain outcome, not an error."""

    success: bool
    message: str


class SaveResult(msgspec.Struct, frozen=True):
    success: bool
    filePath: str
    saved: bool
    message: str


def editor_of(context: HandlerContext[Any]) -> Editor:
    editor: Editor = context.services.editor
    return editor


async def get_open_editors(command: GetOpenEditors, context: HandlerContext[Any]) -> OpenEditors:
    return OpenEditors(tabs=await editor_of(context).open_editors())


async def check_document_dirty(
    command: CheckDocumentDirty, context: HandlerContext[Any]
) -> DirtyState | Failure:
    dirty = await editor_of(context).is_dirty(command.file)
    if dirty is None:
        return Failure(success=False, message=f"Document not open: {command.filePath}")
    return DirtyState(success=True, filePath=command.filePath, isDirty=dirty)


async def save_document(command: SaveDocument, context: HandlerContext[Any]) -> SaveResult:
    editor = editor_of(context)
    path = command.file
    for _ in range(WRITE_ATTEMPTS):
        target = await editor.inspect_save(path)
        if target.status != "ready":
            return await _refuse(command, context, target.path, target.status, target.message)
        replaced = await _keep_replaced(context, target)
        outcome = await _write(editor, target)
        if outcome.status == "saved" and outcome.after is not None:
            await _commit_saved(context, target, outcome.after, replaced)
            return SaveResult(success=True, filePath=command.filePath, saved=True, message=SAVED)
        if outcome.status == "saved":  # written, but the file could not be read back
            message = "the file could not be read back after :write; check it on disk"
            return await _refuse(command, context, target.path, "vim_error", message)
        if outcome.status == "vim_error":
            return await _refuse(command, context, target.path, "vim_error", outcome.message)
    # The user kept typing, or the file kept changing: leave both alone rather than chase them.
    return await _refuse(command, context, target.path, "busy", "")


async def _keep_replaced(context: HandlerContext[Any], target: SaveTarget) -> str | None:
    """Write ahead, with the disk text the write will replace: durable before the write, so a
    save is never a loss."""
    kept = {} if target.before is None else {blob_hash(target.before): target.before}
    try:
        await context.write_ahead(kept)
    except JournalUnavailable as error:
        raise JournalUnavailable(f"{error}. Nothing was written: {target.path} is unchanged") from error
    return next(iter(kept), None)


async def _write(editor: Editor, target: SaveTarget) -> SaveOutcome:
    try:
        return await editor.write(target)
    except (EditorTimeout, EditorLost) as error:
        raise type(error)(
            f"{error}. The save's outcome is unknown: {target.path} may have been written; "
            "the text it would replace is kept in the journal (toolbus history, toolbus recover)"
        ) from error


async def _commit_saved(
    context: HandlerContext[Any], target: SaveTarget, after: bytes, replaced: str | None
) -> None:
    written = blob_hash(after)
    blobs = {written: after} | ({replaced: target.before} if replaced and target.before is not None else {})
    event = DocumentSaved(
        path=target.path,
        written_blob=written,
        bytes_written=len(after),
        replaced_blob=replaced,
        disk_changed=target.changed,
        reloaded=target.reloaded,
    )
    try:
        await context.commit(event, blobs=blobs)
    except JournalUnavailable as error:  # the command stays in_doubt: it did act
        kept = " The text it replaced is kept in the journal (toolbus recover)." if replaced else ""
        raise JournalUnavailable(
            f"{target.path} was written, but the journal could not record the save: {error}.{kept}"
        ) from error


async def _refuse(
    command: SaveDocument, context: HandlerContext[Any], path: str, reason: Refusal, detail: str
) -> SaveResult:
    if reason == "not_open":
        message = f"Document not open: {command.filePath}"
    elif reason == "conflict":
        message = CONFLICT
    elif reason == "busy":
        message = BUSY
    else:
        message = f"Failed to save: {vim_error(detail)}"
    await context.commit(DocumentSaveRefused(path=path, reason=reason, message=message))
    return SaveResult(success=False, filePath=command.filePath, saved=False, message=message)


async def close_tab(command: CloseTab, context: HandlerContext[Any]) -> str:
    editor = editor_of(context)
    expanded = os.path.expanduser(command.tab_name)  # a bare name is matched as typed
    exact = expanded if os.path.isabs(expanded) else None
    for _ in range(WIPE_ATTEMPTS):
        match = await editor.find_tab(command.tab_name, exact)
        if match.status != "found":
            await context.commit(
                TabCloseSkipped(tab_name=command.tab_name, reason=match.status, candidates=match.candidates)
            )
            return TAB_CLOSED
        kept = {} if match.discarded is None else {blob_hash(match.discarded): match.discarded}
        # Durable before the wipe, with the unsaved text: a close is never a loss, whatever happens next.
        await context.write_ahead(kept)
        if await editor.wipe(match.buffer, match.tick):
            await context.commit(
                TabClosed(
                    path=match.path,
                    tab_name=command.tab_name,
                    was_modified=match.modified,
                    discarded_blob=next(iter(kept), None),
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
