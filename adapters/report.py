"""Journal entries for people: tables and a few words per event."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from toolbus.adapters.terminal import for_terminal
from toolbus.bus import RECOVERABLE_FIELDS, AuditEntry, HistoryEntry, JournalReader, StoredEvent, typed_path
from toolbus.bus.commands import SQLITE_INT_MAX


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> str:
    """Columns two spaces apart, each as wide as its widest cell and its header + 2 at least,
    every cell `for_terminal`. On a terminal the last column is cut to fit."""
    rows = [[for_terminal(cell) for cell in row] for row in rows]
    widths = [max([len(header) + 2, *(len(row[i]) for row in rows)]) for i, header in enumerate(headers)]
    if sys.stdout.isatty():
        others = sum(width + 2 for width in widths[:-1])
        room = max(os.get_terminal_size(sys.stdout.fileno()).columns - others, 24)
        rows = [[*row[:-1], shorten(row[-1], room)] for row in rows]

    def line(cells: Sequence[str]) -> str:
        columns = zip(cells, widths, strict=False)  # the last width may be past a cut cell's
        padded = (cell.rjust(width) if i in right else cell.ljust(width) for i, (cell, width) in enumerate(columns))
        return "  ".join(padded).rstrip()

    return "\n".join(line(row) for row in [headers, *rows])


def clock(timestamp: str | None) -> str:
    """`2026-05-01T12:00:00.123456Z` as `2026-05-01 12:00:00`."""
    return timestamp[:19].replace("T", " ") if timestamp else "-"


def one_more(limit: int | None) -> int | None:
    """One row more than `limit`, to tell whether it left any out."""
    return None if limit is None else min(limit + 1, SQLITE_INT_MAX)


def size(count: int | None) -> str:
    if count is None:
        return "?"
    if count < 1024:
        return f"{count} B"
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / 1024 / 1024:.1f} MiB"


def duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.1f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def shorten(text: str, limit: int, keep_end: bool = False) -> str:
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


def print_audit_table(entries: Iterable[AuditEntry], hosts: bool = False) -> int:
    """The commands as a table, with a HOST column when they are of several machines (`hosts`),
    and an AGENT column when of several agents (a team's admin sees every agent's)."""
    entries = list(entries)
    agents = len({entry.agent for entry in entries}) > 1
    rows = [
        [
            clock(entry.received_at),
            *([machine(entry.host)] if hosts else []),
            *([entry.agent or "?"] if agents else []),
            entry.tool,
            shorten(entry.target or "", 60, keep_end=True),
            entry.status,
            duration(entry.duration_ms),
            describe_outcome(entry),
        ]
        for entry in entries
    ]
    if rows:
        headers = [
            "TIME (UTC)",
            *(["HOST"] if hosts else []),
            *(["AGENT"] if agents else []),
            *("TOOL", "TARGET", "STATUS", "DURATION", "WHAT HAPPENED"),
        ]
        print(table(headers, rows, frozenset({headers.index("DURATION")})))
    return len(rows)


def machine(host: str | None) -> str:
    """A command's machine; `?` for one recorded before journals kept it."""
    return host if host is not None else "?"


def describe_outcome(entry: AuditEntry) -> str:
    """What a command did, in a few words; events are named `@position` for `toolbus recover`."""
    if entry.events:
        return "; ".join(describe_event(event) for event in entry.events)
    if entry.error:
        return entry.error.removeprefix(f"Invalid arguments for {entry.tool}: ")
    if entry.status == "in_doubt":
        return "no outcome recorded: still running, or toolbus stopped before it finished"
    if entry.status == "cancelled":
        return "cancelled before it finished: nothing done"
    return ""


def _kept_size(blobs: dict[str, int], digest: object) -> str:
    """The size of a kept text an event names by its hash ('?' when it is not kept)."""
    return size(blobs.get(digest)) if isinstance(digest, str) else "?"


def describe_event(event: StoredEvent) -> str:
    data = event.data
    describe = _EVENT_WORDS.get(event.type)
    return f"@{event.position} " + (describe(data, event.blobs) if describe else event.type)


def _saved(data: dict[str, Any], blobs: dict[str, int]) -> str:
    text = f"saved {size(data.get('bytes_written'))}"
    replaced = data.get("replaced_blob")
    text += f", replaced {_kept_size(blobs, replaced)}" if replaced else ", new file"
    if data.get("disk_changed"):
        text += ", file had changed on disk" + (" (reloaded first)" if data.get("reloaded") else "")
    return text


def _refused(data: dict[str, Any], blobs: dict[str, int]) -> str:
    reason = data.get("reason")
    if reason == "conflict":
        return "not saved: changed on disk and in the buffer (both kept)"
    if reason == "not_open":
        return "not saved: not open"
    return f"not saved: {data.get('message', reason)}"


def _closed(data: dict[str, Any], blobs: dict[str, int]) -> str:
    discarded = data.get("discarded_blob")
    return f"closed, discarded {_kept_size(blobs, discarded)} unsaved" if discarded else "closed"


def _write_in_doubt(data: dict[str, Any], blobs: dict[str, int]) -> str:
    replaced = data.get("replaced_blob")
    kept = f"; the text it would replace ({_kept_size(blobs, replaced)}) is kept" if replaced else " (a new file)"
    return f"may have been written (outcome unknown){kept}"


def _close_in_doubt(data: dict[str, Any], blobs: dict[str, int]) -> str:
    discarded = data.get("discarded_blob")
    kept = f"; its unsaved text ({_kept_size(blobs, discarded)}) is kept" if discarded else ""
    return f"may have been closed (outcome unknown){kept}"


def _close_skipped(data: dict[str, Any], blobs: dict[str, int]) -> str:
    reason = data.get("reason")
    if reason == "ambiguous":
        return f"closed nothing: {len(data.get('candidates', []))} buffers match"
    if reason == "busy":
        return "closed nothing: its buffer kept changing"
    if reason == "diff_closed":
        return "closed nothing: the name is a diff view's, closed already"
    return "closed nothing: no buffer matches"


def _restored(data: dict[str, Any], blobs: dict[str, int]) -> str:
    return f"restored {_kept_size(blobs, data.get('written_blob'))} from @{data.get('from_position')}"


def _replayed(data: dict[str, Any], blobs: dict[str, int]) -> str:
    if data.get("action") == "close":
        return f"replayed the close @{data.get('from_position')}"
    kept = f"; kept what the file held in {data['kept_copy']}" if data.get("kept_copy") else ""
    return f"replayed {_kept_size(blobs, data.get('written_blob'))} from @{data.get('from_position')}{kept}"


def _proposed(data: dict[str, Any], blobs: dict[str, int]) -> str:
    return f"diff proposed ({_kept_size(blobs, data.get('proposed_blob'))})"


def _accepted(data: dict[str, Any], blobs: dict[str, int]) -> str:
    edited = ", edited by the user" if data.get("user_edited") else ""
    replaced = data.get("replaced_blob")
    was = f", replaced {_kept_size(blobs, replaced)}" if replaced else ", new file"
    return f"diff accepted{edited}: saved {size(data.get('bytes_written'))}{was}"


def _accept_failed(data: dict[str, Any], blobs: dict[str, int]) -> str:
    return f"diff accepted, not saved: {data.get('message', data.get('reason'))}"


def _accept_in_doubt(data: dict[str, Any], blobs: dict[str, int]) -> str:
    return f"diff accepted, its write in doubt: the accepted text ({_kept_size(blobs, data.get('final_blob'))}) is kept"


def _rejected(data: dict[str, Any], blobs: dict[str, int]) -> str:
    by = data.get("by")
    return "diff rejected by the user" if by in (None, "user") else f"diff closed by {by} (rejected)"


def _observation(data: dict[str, Any], blobs: dict[str, int]) -> str:
    kind, project, visibility = data.get("type"), data.get("project"), data.get("visibility")
    return f"observation saved: {kind} in project {project}, visible to {visibility}"


_EVENT_WORDS: dict[str, Callable[[dict[str, Any], dict[str, int]], str]] = {
    "DocumentSaved": _saved,
    "DocumentSaveRefused": _refused,
    "TabClosed": _closed,
    "FileWriteInDoubt": _write_in_doubt,
    "TabCloseInDoubt": _close_in_doubt,
    "TabCloseSkipped": _close_skipped,
    "FileRestored": _restored,
    "FileReplayed": _replayed,
    "DiffProposed": _proposed,
    "DiffAccepted": _accepted,
    "DiffAcceptFailed": _accept_failed,
    "DiffAcceptInDoubt": _accept_in_doubt,
    "DiffRejected": _rejected,
    "ObservationSaved": _observation,
}


def print_history(
    reader: JournalReader, path: str, limit: int | None = None, host: str | None = None, scope: str = ""
) -> None:
    """One file's events, newest first: those of machine `host`, or of every machine (None) with
    a HOST column. `scope` says whose events the reader shows, when not everyone's."""
    entries = reader.history(path, one_more(limit), host)
    left_out = limit is not None and len(entries) > limit
    entries = entries[:limit]
    shown = for_terminal(typed_path(path))
    where = f" on {host}" if host is not None else ""
    if not entries:
        hint = " (--all-hosts for every machine's)" if host is not None else ""
        whose = f" of {scope}" if scope else ""
        print(f"{shown}: no saves or closes{whose}{where} in the journal{hint}", file=sys.stderr)
        return
    count = f"the newest {len(entries)}" if left_out else str(len(entries))
    order = " (--limit 0 for all)" if left_out else ", newest first"
    print(f"{shown}: {count} event{'s' if len(entries) != 1 else ''}{where}{order}")
    decided = {entry.event.command_id for entry in entries if entry.event.type in _DIFF_DECISIONS}
    rows = [_history_row(entry, hosts=host is None, decided=decided) for entry in entries]
    headers = ["EVENT", "TIME (UTC)", *(["HOST"] if host is None else []), "BY", "WHAT HAPPENED", "RECOVERABLE"]
    print(table(headers, rows))
    if any(_recoverable_words(entry.event) != "-" for entry in entries):
        print("\n`toolbus recover EVENT` prints a recoverable text; add --apply to write it back to the file.")


def _history_row(entry: HistoryEntry, hosts: bool, decided: set[int | None]) -> list[str]:
    event = entry.event
    who = entry.agent or "-"
    if entry.tool and entry.tool not in ("saveDocument", "close_tab", "openDiff"):
        who += f" ({entry.tool})"
    what = describe_event(event).split(" ", 1)[1]
    if event.type == "DiffProposed" and event.command_id not in decided:
        what += _UNDECIDED.get(entry.status or "in_doubt", "")
    return [
        f"@{event.position}",
        clock(event.recorded_at),
        *([machine(entry.host)] if hosts else []),
        who,
        what,
        _recoverable_words(event),
    ]


# A proposal with no decision of the user's after it: how its call ended.
_DIFF_DECISIONS = frozenset({"DiffAccepted", "DiffAcceptFailed", "DiffAcceptInDoubt", "DiffRejected"})
_UNDECIDED = {
    "cancelled": ", withdrawn: the call was cancelled before the user decided",
    "failed": ", undecided: the call failed (toolbus audit says why)",
    "in_doubt": ", undecided: still waiting, or toolbus stopped first",
}


_RECOVERABLE_KIND = {
    "TabClosed": "unsaved, discarded",
    "FileWriteInDoubt": "before the write",
    "TabCloseInDoubt": "unsaved",
    "DiffProposed": "proposal",
    "DiffRejected": "proposal, rejected",
    "DiffAcceptFailed": "accepted, not written",
    "DiffAcceptInDoubt": "accepted, write in doubt",
}


def _recoverable_words(event: StoredEvent) -> str:
    field = RECOVERABLE_FIELDS.get(event.type)
    digest = event.data.get(field[0]) if field else None
    if digest is None:
        return "-"
    kind = _RECOVERABLE_KIND.get(event.type, "replaced")
    return f"{size(event.blobs.get(digest))} {kind}"
