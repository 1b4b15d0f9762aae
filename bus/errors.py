"""The errors a command can end in, each with a message meant for the agent to read."""

from __future__ import annotations

import re


class ToolbusError(Exception):
    """Base of every error toolbus reports to a caller."""


class InvalidArguments(ToolbusError):
    """The arguments do not fit the tool's schema. Nothing was changed."""

    def __init__(self, tool: str, detail: str) -> None:
        super().__init__(f"Invalid arguments for {tool}: {detail}")
        self.tool = tool
        self.detail = detail


class Fault(ToolbusError):
    """Something outside toolbus failed (Neovim, the disk). The server keeps serving."""


class Unfinished(Fault):
    """A command-line command failed after it began to act: some of what it set out to do may
    be done, and its output and the journal say what."""


class EditorUnavailable(Fault):
    """No Neovim could be reached."""


class EditorLost(EditorUnavailable):
    """The connection to Neovim broke after a request was sent: it may or may not have run."""


class EditorTimeout(Fault):
    """Neovim did not answer in time (blocked by a prompt, or busy)."""


class JournalUnavailable(Fault):
    """The journal cannot be written (locked, read-only, full, or not a toolbus journal)."""

    def without_retry(self) -> str:
        """What failed, without the advice to try again: for an answer saying that the call's
        act was done (or its text kept) all the same, which a retry would repeat or undo."""
        return _TRY_AGAIN.sub("", str(self))


# How the journal's messages advise a retry: after what failed, before a sentence or the end.
_TRY_AGAIN = re.compile(r"[:,] (?:check the server, and )?try again(?: later)?(?=\.|$)")


class JournalNotFound(JournalUnavailable):
    """A read-only command was pointed at a journal file that does not exist."""


class NotFound(ToolbusError):
    """What the call names is not there (a file that does not exist, a document not open) and
    the tool's protocol answers that with `isError`, not a `success:false` result. Nothing was
    changed."""


class Refused(ToolbusError):
    """The call cannot be done in the state the user's editor is in (unsaved changes, a view of
    that name already waiting), and its protocol answers that with `isError`. Nothing was changed."""
