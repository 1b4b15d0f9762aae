"""Editor command handlers: ask the Editor, decide the reply, emit what happened."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from toolbus.bus import (
    CheckDocumentDirty,
    CloseTab,
    DocumentSaved,
    DocumentSaveRefused,
    EditorLost,
    EditorTimeout,
    Event,
    FileWriteInDoubt,
    GetOpenEditors,
    HandlerContext,
    JournalUnavailable,
    Refused,
    SaveDocument,
    TabClosed,
    TabCloseInDoubt,
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
    "Failed to save: the buffer or its file kept changing while toolbus was saving it. Nothing was written; try again"
)
# "E45: 'readonly' option is set (add ! to override)" -> "E45: 'readonly' option is set"
_VIM_ERROR = re.compile(r"(E\d+: .*?)(?: \(add ! to override\))?$", re.MULTILINE)
# What wraps an error's own words (a formatter's message), as many as there are, in any order:
# "Error executing lua" up to the last (a Vim command's, a Lua autocmd's '...Error executing lua
# callback: ', a `:lua` autocmd's 'E5108: Error executing lua '); where in Lua it was raised
# (`[string "<nvim>"]:744: `, `x.lua:12: `); `nvim_exec2()[1]..`, Vim's note that it came through
# toolbus's own `vim.cmd`; and the Vim command that raised it, in an autocommand or not
# ('BufWritePre Autocommands for "*": Vim(echoerr):').
_LUA_WHERE = re.compile(
    r"^(?:.*Error executing lua(?: callback)?:? "
    r'|(?:\[string "[^"]*"\]|\S+\.lua):\d+: '
    r"|nvim_exec2\(\)\[\d+\]\.\."
    r'|(?:[^:"]*Autocommands for "[^"]*": )?Vim\(\w+\):)*'
)
# Neovim's codes for "a Lua error": the words after them are Lua's, to be read as above.
_LUA_ERROR = "Error executing lua"


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


async def check_document_dirty(command: CheckDocumentDirty, context: HandlerContext[Any]) -> DirtyState | Failure:
    dirty = await editor_of(context).is_dirty(command.file)
    if dirty is None:
        return Failure(success=False, message=f"Document not open: {command.filePath}")
    return DirtyState(success=True, filePath=command.filePath, isDirty=dirty)


async def save_document(command: SaveDocument, context: HandlerContext[Any]) -> SaveResult:
    attempt = await save_through_editor(context, command.file)
    if attempt.refusal is not None:
        message = refusal_message(attempt.refusal, attempt.detail, command.filePath)
        await context.commit(DocumentSaveRefused(path=attempt.path, reason=attempt.refusal, message=message))
        return SaveResult(success=False, filePath=command.filePath, saved=False, message=message)
    assert attempt.target is not None
    event = DocumentSaved(
        path=attempt.path,
        written_blob=blob_hash(attempt.after),
        bytes_written=len(attempt.after),
        replaced_blob=attempt.replaced,
        disk_changed=attempt.target.changed,
        reloaded=attempt.target.reloaded,
    )
    await commit_write(context, attempt, event)
    return SaveResult(success=True, filePath=command.filePath, saved=True, message=SAVED)


# Vim's names ('fileencoding') for the Unicode encodings Python knows by other names, or whose
# byte order Python's codec of the same name would guess: Vim's 'utf-16' is big-endian.
VIM_UNICODE_CODECS = {
    "utf-16": "utf-16-be",
    "ucs-2": "utf-16-be",
    "ucs-2le": "utf-16-le",
    "ucs-4": "utf-32-be",
    "ucs-4le": "utf-32-le",
}


@dataclass(frozen=True, slots=True)
class SaveAttempt:
    """What saving a file's buffer came to: written (`target`, the file `after`, the replaced
    text's blob), or refused and why. Nothing of it is committed yet."""

    path: str  # the file as Neovim resolves it
    refusal: Refusal | None = None
    detail: str = ""
    target: SaveTarget | None = None
    after: bytes = b""
    replaced: str | None = None
    encoding: str = ""  # the file's, as Neovim wrote it ('' for UTF-8)

    def written_text(self) -> str:
        """The file as written, as text: decoded as Neovim encoded it, without a byte order mark."""
        codec = VIM_UNICODE_CODECS.get(self.encoding, self.encoding or "utf-8")
        try:
            text = self.after.decode(codec)
        except (LookupError, UnicodeDecodeError):  # an encoding Python does not know by that name
            text = self.after.decode("utf-8", "replace")
        return text.removeprefix("\ufeff")


async def save_through_editor(
    context: HandlerContext[Any],
    path: str,
    *,
    also_in_doubt: tuple[Event, ...] = (),
    also_kept: Mapping[str, bytes] | None = None,
) -> SaveAttempt:
    """Save the buffer of `path` by saveDocument's rules: the replaced text durable before the
    write, a disk change settled without a prompt, a buffer that keeps changing left alone.
    `also_in_doubt` and `also_kept`: what else a write in doubt leaves in the journal."""
    editor = editor_of(context)
    for _ in range(WRITE_ATTEMPTS):
        target = await editor.inspect_save(path)
        if target.status != "ready":
            return SaveAttempt(target.path, target.status, target.message)
        replaced = await _keep_replaced(context, target, also_in_doubt, also_kept)
        outcome = await _write(editor, target)
        context.if_in_doubt = ()
        if outcome.status == "saved" and outcome.after is not None:
            return SaveAttempt(
                target.path, target=target, after=outcome.after, replaced=replaced, encoding=outcome.encoding
            )
        if outcome.status == "saved":  # written, but the file could not be read back
            unread = "the file could not be read back after :write; check it on disk"
            return SaveAttempt(target.path, "vim_error", unread)
        if outcome.status == "vim_error":
            return SaveAttempt(target.path, "vim_error", outcome.message)
    # The user kept typing, or the file kept changing: leave both alone rather than chase them.
    return SaveAttempt(target.path, "busy")


async def _keep_replaced(
    context: HandlerContext[Any],
    target: SaveTarget,
    also_in_doubt: tuple[Event, ...],
    also_kept: Mapping[str, bytes] | None,
) -> str | None:
    """Write ahead, with the disk text the write will replace: durable before the write, so a
    save is never a loss. Until Neovim answers, the write may or may not happen: if it ends in
    doubt, the journal says so under the file, with the text kept."""
    kept = dict(also_kept or {})
    replaced = None
    if target.before is not None:
        replaced = blob_hash(target.before)
        kept[replaced] = target.before
    doubt = (FileWriteInDoubt(path=target.path, replaced_blob=replaced), *also_in_doubt)
    try:
        await context.write_ahead(kept, if_in_doubt=doubt)
    except JournalUnavailable as error:
        # The journal's words say what it did; these, what the save did.
        raise JournalUnavailable(f"{error}. {target.path} was not saved: it is unchanged") from error
    return replaced


async def _write(editor: Editor, target: SaveTarget) -> SaveOutcome:
    try:
        return await editor.write(target)
    except (EditorTimeout, EditorLost) as error:
        raise type(error)(
            f"{error}. The save's outcome is unknown: {target.path} may have been written; "
            "the text it would replace is kept in the journal (toolbus history, toolbus recover)"
        ) from error


async def commit_write(context: HandlerContext[Any], attempt: SaveAttempt, event: Event) -> None:
    """Commit the event of a written file, with the texts written and replaced."""
    assert attempt.target is not None
    blobs = {blob_hash(attempt.after): attempt.after}
    if attempt.replaced and attempt.target.before is not None:
        blobs[attempt.replaced] = attempt.target.before
    kept = "The text it replaced" if attempt.replaced else None
    await commit_done(context, event, f"{attempt.path} was written", kept, blobs)


async def commit_done(
    context: HandlerContext[Any], event: Event, done: str, kept: str | None, blobs: Mapping[str, bytes] | None = None
) -> None:
    """Commit the event of what was `done` in the editor. If the journal cannot take it, the
    answer still says it was done (never "try again"), and what of it the write-ahead `kept`."""
    try:
        await context.commit(event, blobs=blobs)
    except JournalUnavailable as error:  # the command stays in_doubt: it did act
        also = f" {kept} is kept in the journal (toolbus recover)." if kept else ""
        why = error.without_retry()
        raise JournalUnavailable(f"{done}, but the journal could not record it: {why}.{also}") from error


def refusal_message(reason: Refusal, detail: str, file_path: str) -> str:
    """Why a save wrote nothing, in saveDocument's words."""
    if reason == "not_open":
        return f"Document not open: {file_path}"
    if reason == "conflict":
        return CONFLICT
    if reason == "busy":
        return BUSY
    return f"Failed to save: {vim_error(detail)}"


async def close_tab(command: CloseTab, context: HandlerContext[Any]) -> str:
    editor = editor_of(context)
    # A diff view's name closes that view (rejecting it if it waits), and its clean-up (agents
    # close their diffs by name when done) never a file buffer whose name happens to end the
    # same way. A close_tab of that name after the clean-up is a file's again.
    if editor.diff_waiting(command.tab_name):
        await context.write_ahead()  # rejecting a waiting diff is a decision, made in the editor
    if await editor.close_diffs(command.tab_name, "close_tab"):
        return TAB_CLOSED
    if editor.forget_diff_tab(command.tab_name):
        await context.commit(TabCloseSkipped(tab_name=command.tab_name, reason="diff_closed"))
        return TAB_CLOSED
    expanded = os.path.expanduser(command.tab_name)  # a bare name is matched as typed
    exact = expanded if os.path.isabs(expanded) else None
    # Written ahead before the lookup, which wipes a buffer with nothing unsaved at once (one
    # request). Such a wipe changes only Neovim's memory, which a power cut takes as well: the
    # row need only survive a crash of toolbus, and the outcome's sync brings it to the disk.
    await context.write_ahead(durable=False)
    for _ in range(WIPE_ATTEMPTS):
        match = await editor.find_tab(command.tab_name, exact, wipe_unmodified=True)
        if match.status == "refused":  # a state the user can leave: said, never taken for "closed"
            raise Refused(f"close_tab: {match.message}. Nothing was closed")
        if match.status == "not_found" or match.status == "ambiguous":
            await context.commit(
                TabCloseSkipped(tab_name=command.tab_name, reason=match.status, candidates=match.candidates)
            )
            return TAB_CLOSED
        kept = {} if match.discarded is None else {blob_hash(match.discarded): match.discarded}
        discarded = next(iter(kept), None)
        if match.status == "found":
            # Unsaved text, on disk before the wipe: a close is never a loss, whatever happens
            # next (the wipe deletes the buffer's swap file too).
            await context.write_ahead(
                kept,
                if_in_doubt=(TabCloseInDoubt(path=match.path, tab_name=command.tab_name, discarded_blob=discarded),),
            )
            wiped = await editor.wipe(match.buffer, match.tick)
            context.if_in_doubt = ()
            if not wiped:
                continue
        closed = TabClosed(
            path=match.path, tab_name=command.tab_name, was_modified=match.modified, discarded_blob=discarded
        )
        await commit_done(context, closed, f"{match.path} was closed", "Its unsaved text" if discarded else None)
        return TAB_CLOSED
    # The user kept typing into it: leave their buffer alone rather than chase it.
    await context.commit(TabCloseSkipped(tab_name=command.tab_name, reason="busy", candidates=[match.path]))
    return TAB_CLOSED


def vim_error(message: str) -> str:
    """A Vim error as `Exxx: text`, without the Lua traceback or Vim's `(add ! to override)`;
    a Lua error, or one without a code, as its first line without where it was raised."""
    match = _VIM_ERROR.search(message)
    if match and _LUA_ERROR not in match[1]:
        return match[1]
    first = match[1] if match else message.strip().split("\n", 1)[0]
    return _LUA_WHERE.sub("", first, count=1) or "unknown error"
