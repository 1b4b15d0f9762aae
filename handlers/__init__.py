"""One handler per command type, registered in one table. Handlers do no I/O of their own:
they reach Neovim, memory and the journal through the Protocols in `handlers.ports`."""

from toolbus.bus import (
    CheckDocumentDirty,
    CloseTab,
    Command,
    GetObservations,
    GetOpenEditors,
    Handler,
    ReplayClose,
    ReplayWrite,
    RestoreFile,
    SaveDocument,
    SaveObservation,
    SearchObservations,
    Timeline,
)
from toolbus.handlers import editor, memory, replay, restore
from toolbus.handlers.ports import Editor, Files, MemoryStore, OpenEditor, SaveOutcome, SaveTarget, TabMatch, Texts

HANDLERS: dict[type[Command], Handler] = {
    GetOpenEditors: editor.get_open_editors,
    CheckDocumentDirty: editor.check_document_dirty,
    SaveDocument: editor.save_document,
    CloseTab: editor.close_tab,
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
