"""Handlers of the IDE tools beyond the seeds: selections, diagnostics, workspace folders,
openFile and closeAllDiffTabs (openDiff has a module of its own). They ask the Editor and shape
the protocol's answers."""

from __future__ import annotations

from typing import Any

import msgspec

from toolbus.bus import (
    CloseAllDiffTabs,
    GetCurrentSelection,
    GetDiagnostics,
    GetLatestSelection,
    GetWorkspaceFolders,
    HandlerContext,
    NotFound,
    OpenFile,
    Refused,
)
from toolbus.handlers.editor import Failure, editor_of
from toolbus.handlers.ports import FileDiagnostics, FileOpened, Selection, WorkspaceFolder

NO_EDITOR = Failure(success=False, message="No active editor found")
NO_SELECTION = Failure(success=False, message="No selection available")


class Workspace(msgspec.Struct, frozen=True):
    success: bool
    folders: list[WorkspaceFolder]
    rootPath: str


class Loaded(msgspec.Struct, frozen=True):
    success: bool
    filePath: str
    languageId: str
    lineCount: int


async def get_current_selection(command: GetCurrentSelection, context: HandlerContext[Any]) -> Selection | Failure:
    return await editor_of(context).current_selection() or NO_EDITOR


async def get_latest_selection(command: GetLatestSelection, context: HandlerContext[Any]) -> Selection | Failure:
    return await editor_of(context).latest_selection() or NO_SELECTION


async def get_diagnostics(command: GetDiagnostics, context: HandlerContext[Any]) -> list[FileDiagnostics]:
    found = await editor_of(context).diagnostics(command.file)
    if found is None:
        raise NotFound(f"Document not open: {command.uri}")
    return found


async def get_workspace_folders(command: GetWorkspaceFolders, context: HandlerContext[Any]) -> Workspace:
    folders = await editor_of(context).workspace_folders()
    if not folders:
        raise Refused("getWorkspaceFolders: Neovim's working directory was removed; :cd to another, then try again")
    return Workspace(success=True, folders=folders, rootPath=folders[0].path)


async def open_file(command: OpenFile, context: HandlerContext[Any]) -> str | Loaded:
    opened = await editor_of(context).open_file(command)
    if opened.status == "not_found":
        raise NotFound(f"File not found: {command.filePath}")
    if opened.status == "directory":
        raise NotFound(f"File not found: {command.filePath} is a directory")
    if opened.status == "refused":
        raise Refused(f"Cannot open {command.filePath}: {opened.message}")
    if opened.status == "loaded":
        return Loaded(success=True, filePath=command.filePath, languageId=opened.languageId, lineCount=opened.lineCount)
    what = _what_was_selected(opened)
    return f"Opened file: {command.filePath}" + (f" ({what})" if what else "")


def _what_was_selected(opened: FileOpened) -> str:
    if opened.missing == "startText":
        return "startText not found; nothing selected"
    if opened.selected is None:
        return ""
    first, last = opened.selected
    lines = f"selected line {first}" if first == last else f"selected lines {first}-{last}"
    return f"{lines}; endText not found after startText" if opened.missing == "endText" else lines


async def close_all_diff_tabs(command: CloseAllDiffTabs, context: HandlerContext[Any]) -> str:
    """Every waiting diff is rejected and its view closed; each openDiff call it ends commits
    its own `DiffRejected` (by closeAllDiffTabs). Decided views close with their call."""
    await context.write_ahead()  # closing a waiting diff is a decision, made in the editor
    closed = await editor_of(context).close_diffs(None, "closeAllDiffTabs")
    return f"CLOSED_{closed}_DIFF_TABS"
