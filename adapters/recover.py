"""`toolbus recover --apply`: a recovered text written back to its file, as a bus command.

The `recover` command (`bus.RestoreFile`) goes through the bus like any tool call: recorded
before the file is touched, its `FileRestored` event (with the text written and the text it
replaced, as blobs) committed after. A restore is itself recoverable: `toolbus recover` on its
event gives back what it overwrote.
"""

from __future__ import annotations

import anyio

from toolbus.adapters.bootstrap import build_bus, identity, open_writer
from toolbus.adapters.config import Settings, cli_caller
from toolbus.bus import Fault, Unfinished
from toolbus.handlers.restore import Restored
from toolbus.journal import Recoverable


def apply_recovery(settings: Settings, found: Recoverable) -> int:
    """Restore `found` to its file; returns the position of the FileRestored event."""
    journal = open_writer(settings, create=False)
    bus = build_bus(settings, journal, cli=True)
    arguments = {
        "event": found.event.position,
        "event_id": found.event.event_id,
        "path": found.path,
        "blob": found.blob,
    }
    try:
        reply = anyio.run(bus.handle, "recover", arguments, cli_caller(identity(settings, journal), "toolbus recover"))
    except Fault as error:  # it acted, or tried to: the message and the journal say what came of it
        raise Unfinished(str(error)) from error
    finally:
        journal.close()
    assert isinstance(reply, Restored)
    return reply.position
