"""The restore handler (`toolbus recover --apply`): a text the journal keeps, written back to
its file. What the write replaces is kept in the journal first, so a restore is undoable."""

from __future__ import annotations

from typing import Any

import msgspec

from toolbus.bus import Fault, FileRestored, FileWriteInDoubt, HandlerContext, RestoreFile, blob_hash
from toolbus.handlers.ports import Files, Texts


class Restored(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    position: int  # the FileRestored event's: `toolbus recover` on it undoes the restore
    bytes_written: int
    bytes_replaced: int | None  # None: there was no file


async def restore_file(command: RestoreFile, context: HandlerContext[Any]) -> Restored:
    files: Files = context.services.files
    texts: Texts = context.services.texts
    path = command.file
    content = await texts.text(command.blob)
    if content is None:
        raise Fault(f"the journal has lost blob {command.blob}: it cannot be recovered")
    before = await files.read(path)
    # Durable before the write: whatever happens next, what it overwrites is not lost, and
    # should toolbus die before the outcome, the next server says so under the file.
    kept = {blob_hash(before): before} if before is not None else {}
    doubt = FileWriteInDoubt(path=path, replaced_blob=next(iter(kept), None))
    await context.write_ahead(kept, if_in_doubt=(doubt,))
    replaced = await files.replace(path, content)
    context.if_in_doubt = ()
    blobs = {command.blob: content}
    if replaced is not None:  # normally `before`; it differs if the file changed in between
        blobs[blob_hash(replaced)] = replaced
    event = FileRestored(
        path=path,
        from_position=command.event,
        written_blob=command.blob,
        replaced_blob=blob_hash(replaced) if replaced is not None else None,
    )
    [(position, _)] = await context.commit(event, blobs=blobs)
    return Restored(
        path=path,
        position=position,
        bytes_written=len(content),
        bytes_replaced=len(replaced) if replaced is not None else None,
    )
