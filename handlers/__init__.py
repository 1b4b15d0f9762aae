"""One handler per command type, registered in one table. Handlers do no I/O of their own:
they reach Neovim, memory and the journal through the Protocols in `handlers.ports`."""

from toolbus.bus import (
    CheckDocumentDirty,
    CloseAllDiffTabs,
    CloseTab,
    Command,
    GetCurrentSelection,
    GetDiagnostics,
    GetLatestSelection,
    GetObservations,
    GetOpenEditors,
    GetWorkspaceFolders,
    Handler,
    OpenDiff,
    OpenFile,
    ReplayClose,
    ReplayWrite,
    RestoreFile,
    SaveDocument,
    SaveObservation,
    SearchObservations,
    Timeline,
)
from toolbus.handlers import diff, editor, ide, memory, replay, restore
from toolbus.handlers.ports import Editor, Files, MemoryStore, OpenEditor, SaveOutcome, SaveTarget, TabMatch, Texts

HANDLERS: dict[type[Command], Handler] = {
    GetOpenEditors: editor.get_open_editors,
    CheckDocumentDirty: editor.check_document_dirty,
    SaveDocument: editor.save_document,
    CloseTab: editor.close_tab,
    OpenFile: ide.open_file,
    OpenDiff: diff.open_diff,
    CloseAllDiffTabs: ide.close_all_diff_tabs,
    GetCurrentSelection: ide.get_current_selection,
    GetLatestSelection: ide.get_latest_selection,
    GetDiagnostics: ide.get_diagnostics,
    GetWorkspaceFolders: ide.get_workspace_folders,
    SaveObservation: memory.save,
    SearchObservations: memory.search,
    Timeline: memory.timeline,
    GetObservations: memory.get_observations,
    # Not MCP tools: only the command line runs these (`toolbus recover --apply`, `replay editor`).
    RestoreFile: restore.restore_file,
    ReplayWrite: replay.replay_write,
    ReplayClose: replay.replay_close,
}

__all__ = ["HANDLERS", "Editor", "Files", "MemoryStore", "OpenEditor", "SaveOutcome", "SaveTarget", "TabMatch", "Texts"]
