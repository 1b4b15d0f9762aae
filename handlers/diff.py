"""openDiff: the agent proposes, the user decides, the journal keeps both.

One request opens the view; the proposal is committed at once; then the call waits, with no
time limit, for the user's decision, which Neovim sends as a notification. Meanwhile the calls
after it go on (`HandlerContext.waiting`). The view is closed however the call ends, but a
proposal the user edited whose decision was lost with toolbus's connection: that one stays.
"""

from __future__ import annotations

from typing import Any, Literal, NoReturn

import anyio

from toolbus.bus import (
    DiffAccepted,
    DiffAcceptFailed,
    DiffAcceptInDoubt,
    DiffProposed,
    DiffRejected,
    EditorUnavailable,
    HandlerContext,
    JournalUnavailable,
    OpenDiff,
    Refused,
    TextItems,
    ToolbusError,
    blob_hash,
)
from toolbus.handlers.editor import commit_write, editor_of, refusal_message, save_through_editor, vim_error
from toolbus.handlers.ports import DiffDecision, DiffRequest, DiffView

FILE_SAVED = "FILE_SAVED"
DIFF_REJECTED = "DIFF_REJECTED"


async def open_diff(command: OpenDiff, context: HandlerContext[Any]) -> TextItems:
    editor = editor_of(context)
    if editor.diff_waiting(command.tab_name):
        raise Refused(
            f'openDiff: a diff named "{command.tab_name}" is already waiting for the user; '
            "wait for it, or close it (close_tab, closeAllDiffTabs). Nothing was opened"
        )
    proposal = command.new_file_contents.encode("utf-8", "surrogateescape")
    request = DiffRequest(path=command.file, old_path=command.old_file, text=proposal, tab_name=command.tab_name)
    await context.write_ahead({blob_hash(proposal): proposal})  # the view is an act in the editor
    context.on_cancel = "cancelled"  # a view cancelled while it opens is closed again: no effect
    view = await editor.open_diff(request)
    if view.status == "dirty":
        raise Refused(
            f"openDiff: {command.new_file_path} has unsaved changes in Neovim; save or discard them, "
            "then propose again. Nothing was opened"
        )
    if view.status == "refused":
        raise Refused(f"openDiff: {vim_error(view.message)}. Nothing was opened")
    try:
        return await _propose_and_wait(command, context, view, proposal)
    finally:
        with anyio.CancelScope(shield=True):
            await editor.close_diff(view.id)


async def _propose_and_wait(
    command: OpenDiff, context: HandlerContext[Any], view: DiffView, proposal: bytes
) -> TextItems:
    proposed = blob_hash(proposal)
    shown = blob_hash(view.shown)
    await context.record(
        DiffProposed(
            path=view.path,
            tab_name=command.tab_name,
            old_path=command.old_file,
            proposed_blob=proposed,
            shown_blob=shown,
        ),
        blobs={proposed: proposal, shown: view.shown},
    )
    # Until a write starts, a cancelled call has changed nothing: its view is closed below.
    context.on_cancel = "cancelled"
    context.waiting()
    decision = await editor_of(context).decision(view.id)
    if decision.action == "lost":
        raise EditorUnavailable(
            "Neovim went away while openDiff waited for the user's decision (or toolbus dropped its "
            "connection after another request timed out): nothing was written. If Neovim is still there, "
            "the view closes once it is free, or stays open if the user edited the proposal. "
            "The proposal is kept in the journal (toolbus recover)"
        )
    if decision.action == "reject":
        await context.commit(
            DiffRejected(path=view.path, tab_name=command.tab_name, proposed_blob=proposed, by=decision.by)
        )
        return TextItems((DIFF_REJECTED, command.tab_name))
    # The user's decision is made: a cancellation from now on must not stop the write it asked
    # for (the view closed under a running :write aborts it, and leaves the file in doubt). The
    # call finishes it and journals what happened; a client that cancelled is not answered, a
    # session that ended is (`ArrivalOrder.answers`).
    # Each request to Neovim has its timeout, so the shield cannot hold for ever.
    with anyio.CancelScope(shield=True):
        written = await _accept(command, context, view, decision, proposal)
    return written


async def _accept(
    command: OpenDiff, context: HandlerContext[Any], view: DiffView, decision: DiffDecision, proposal: bytes
) -> TextItems:
    """Write the accepted text by saveDocument's rules, or say why nothing was written."""
    staged = await editor_of(context).stage_diff(view.id, decision.text)
    if staged.status != "staged":
        message = (
            f"openDiff: nothing was written to {command.new_file_path}: {staged.message}. "
            "The accepted text is kept in the journal (toolbus recover)"
            if staged.status == "conflict"
            else refusal_message("vim_error", staged.message, command.new_file_path)
        )
        await _failed(context, command, view, decision, staged.status, message)
    final = blob_hash(decision.text)
    doubt = DiffAcceptInDoubt(path=view.path, tab_name=command.tab_name, final_blob=final)
    try:
        attempt = await save_through_editor(
            context, view.path, also_in_doubt=(doubt,), also_kept={final: decision.text}
        )
    except JournalUnavailable as error:  # before the write: nothing was written
        await _left_unsaved(context, view, error)
    if attempt.refusal is not None:
        reason = "vim_error" if attempt.refusal == "not_open" else attempt.refusal
        message = refusal_message(attempt.refusal, attempt.detail, command.new_file_path)
        await _failed(context, command, view, decision, reason, message)
    event = DiffAccepted(
        path=attempt.path,
        tab_name=command.tab_name,
        written_blob=blob_hash(attempt.after),
        bytes_written=len(attempt.after),
        replaced_blob=attempt.replaced,
        user_edited=decision.text != proposal,
    )
    await commit_write(context, attempt, event)
    return TextItems((FILE_SAVED, attempt.written_text()))


async def _left_unsaved(context: HandlerContext[Any], view: DiffView, error: JournalUnavailable) -> NoReturn:
    """The journal can keep nothing now, the text the user accepted least of all: it stays in
    the file's buffer, unsaved, for the user to write once the journal is free."""
    waits = f"the text the user accepted waits, unsaved, in the buffer of {view.path} in Neovim"
    try:
        kept = await editor_of(context).keep_staged(view.id, f"toolbus could not record your accept: {waits}")
    except ToolbusError:
        kept = False
    if not kept:  # the view went meanwhile (its connection dropped), and the text with it
        raise error
    raise JournalUnavailable(
        f"{error.without_retry()}; {waits}: do not propose it again; once the journal is free, "
        "saveDocument (or the user's :w) writes it"
    ) from error


async def _failed(
    context: HandlerContext[Any],
    command: OpenDiff,
    view: DiffView,
    decision: DiffDecision,
    reason: Literal["conflict", "vim_error", "busy"],
    message: str,
) -> NoReturn:
    """Record an acceptance that wrote nothing, keeping the accepted text, and answer isError."""
    final = blob_hash(decision.text)
    await context.commit(
        DiffAcceptFailed(path=view.path, tab_name=command.tab_name, final_blob=final, reason=reason, message=message),
        blobs={final: decision.text},
        error=message,
    )
    raise Refused(message)
