"""One handler per command type, registered in one table. Handlers do no I/O of their own:
they reach Neovim, memory and the journal through the Protocols in `handlers.ports`."""

from toolbus.bus import (
    CheckDocumentDirty,
    CloseTab,
    Command,
    GetObservations,
    GetOpenEditors,
    Handler,
    RestoreFile,
    SaveDocument,
    SaveObservation,
    SearchObservations,
    Timeline,
)
from toolbus.handlers import editor, memory, restore
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
    RestoreFile: restore.restore_file,  # not an MCP tool: `toolbus recover --apply`
}

__all__ = ["HANDLERS", "Editor", "Files", "MemoryStore", "OpenEditor", "SaveOutcome", "SaveTarget", "TabMatch", "Texts"]
