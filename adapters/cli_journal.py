"""The journal's command line: audit, history, recover, replay, and the demo.

Read-only commands open the journal with `journal.readonly`, which refuses a missing file or
a stranger's database before SQLite touches it. Every value a person types is parsed before
the journal is opened, so bad input changes nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from toolbus.adapters.config import Settings, add_settings_arguments

if TYPE_CHECKING:
    from toolbus.journal.sqlite.audit import AuditEntry, HistoryEntry, StoredEvent

Runner = Callable[[argparse.Namespace, Settings], int]
_json = msgspec.json.Encoder()


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Register audit, history, recover, replay and demo."""
    _add_audit(commands)
    _add_history(commands)
    _add_recover(commands)
    _add_replay(commands)
    from toolbus.adapters.demo import add_demo

    add_demo(commands)


# --- shared plumbing ---------------------------------------------------------------------


def _journal_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--journal",
        metavar="PATH",
        help="journal file ($TOOLBUS_JOURNAL; default $XDG_STATE_HOME/toolbus/journal.db)",
    )


@contextmanager
def _reading(settings: Settings) -> Iterator[sqlite3.Connection]:
    from toolbus.journal.sqlite.readonly import open_readonly

    conn = open_readonly(settings.journal, settings.journal_busy_timeout)
    try:
        yield conn
    finally:
        conn.close()


def _quiet_broken_pipe(run: Runner) -> Runner:
    """`toolbus audit | head` ends quietly when `head` stops reading."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace, settings: Settings) -> int:
        try:
            return run(args, settings)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return wrapper


def _json_lines(items: Iterable[msgspec.Struct]) -> int:
    count = 0
    for item in items:
        sys.stdout.write(_json.encode(item).decode() + "\n")
        count += 1
    return count


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell. On a terminal the last column is cut to fit."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    room = _terminal_columns() - sum(widths[:-1]) - 2 * (len(widths) - 1)
    lines = []
    for row in [headers, *rows]:
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        cells[-1] = shorten(row[-1], max(room, 24))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _terminal_columns() -> int:
    return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else 1_000_000


def clock(timestamp: str | None) -> str:
    """`2026-05-01T12:00:00.123456Z` as `2026-05-01 12:00:00`."""
    return timestamp[:19].replace("T", " ") if timestamp else "-"


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


# --- audit -------------------------------------------------------------------------------


def _add_audit(commands: argparse._SubParsersAction[Any]) -> None:
    sub = commands.add_parser(
        "audit",
        help="query the journal: who called what, on which file, with what outcome",
        description="Commands in the journal, newest first, each with what it changed.",
    )
    _journal_argument(sub)
    sub.add_argument("--tool", help="only this tool (saveDocument, close_tab, save, recover, ...)")
    sub.add_argument("--path", help="only the saves, closes and restores of this file")
    sub.add_argument("--status", help="only this outcome: ok, rejected, failed or in_doubt")
    sub.add_argument(
        "--since",
        metavar="TIME",
        help="received at or after TIME: ISO (UTC unless it says) or 2h, 30m, 7d ago",
    )
    sub.add_argument("--until", metavar="TIME", help="received before TIME (same forms as --since)")
    sub.add_argument("--session", help="only this MCP session id")
    sub.add_argument("--agent", dest="agent_filter", metavar="AGENT", help="only calls made as this agent")
    sub.add_argument("--limit", default="50", help="at most this many commands (default 50; 0 for all)")
    sub.add_argument("--json", action="store_true", help="JSON lines: one command with its events per line")
    sub.set_defaults(run=run_audit)


def audit_query(args: argparse.Namespace) -> Any:
    """The filters as typed, checked: raises ValueError naming the option."""
    from toolbus.journal.sqlite.audit import AuditQuery, file_streams, parse_limit, parse_status, parse_time

    return AuditQuery(
        tool=args.tool,
        paths=file_streams(args.path) if args.path else (),
        status=parse_status(args.status) if args.status is not None else None,
        since=parse_time("--since", args.since) if args.since is not None else None,
        until=parse_time("--until", args.until) if args.until is not None else None,
        session=args.session,
        agent=args.agent_filter,
        limit=parse_limit(args.limit),
    )


@_quiet_broken_pipe
def run_audit(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.sqlite.audit import audit

    query = audit_query(args)
    with _reading(settings) as conn:
        entries = audit(conn, query)
        shown = _json_lines(entries) if args.json else print_audit_table(entries)
    if not args.json:
        if shown == 0:
            print("no commands match", file=sys.stderr)
        elif query.limit is not None and shown == query.limit:
            print(f"(the newest {shown} shown; --limit 0 for all)", file=sys.stderr)
    return 0


def print_audit_table(entries: Iterable[AuditEntry]) -> int:
    rows = [
        [
            clock(entry.received_at),
            entry.tool,
            shorten(entry.target or "", 60, keep_end=True),
            entry.status,
            duration(entry.duration_ms),
            describe_outcome(entry),
        ]
        for entry in entries
    ]
    if rows:
        print(
            table(
                ["TIME (UTC)", "TOOL", "TARGET", "STATUS", "DURATION", "WHAT HAPPENED"], rows, frozenset({4})
            )
        )
    return len(rows)


def describe_outcome(entry: AuditEntry) -> str:
    """What a command did, in a few words; events are named `@position` for `toolbus recover`."""
    if entry.events:
        return "; ".join(describe_event(event) for event in entry.events)
    if entry.error:
        return entry.error.removeprefix(f"Invalid arguments for {entry.tool}: ")
    if entry.status == "in_doubt":
        return "no outcome recorded: still running, or toolbus stopped before it finished"
    return ""


def describe_event(event: StoredEvent) -> str:
    data = event.data
    describe = _EVENT_WORDS.get(event.type)
    return f"@{event.position} " + (describe(data, event.blobs) if describe else event.type)


def _saved(data: dict[str, Any], blobs: dict[str, int]) -> str:
    text = f"saved {size(data.get('bytes_written'))}"
    replaced = data.get("replaced_blob")
    text += f", replaced {size(blobs.get(replaced))}" if replaced else ", new file"
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
    return f"closed, discarded {size(blobs.get(discarded))} unsaved" if discarded else "closed"


def _close_skipped(data: dict[str, Any], blobs: dict[str, int]) -> str:
    if data.get("reason") == "ambiguous":
        return f"closed nothing: {len(data.get('candidates', []))} buffers match"
    return "closed nothing: no buffer matches"


def _restored(data: dict[str, Any], blobs: dict[str, int]) -> str:
    return f"restored {size(blobs.get(data.get('written_blob')))} from @{data.get('from_position')}"


def _observation(data: dict[str, Any], blobs: dict[str, int]) -> str:
    kind, project, visibility = data.get("type"), data.get("project"), data.get("visibility")
    return f"observation saved: {kind} in project {project}, visible to {visibility}"


_EVENT_WORDS: dict[str, Callable[[dict[str, Any], dict[str, int]], str]] = {
    "DocumentSaved": _saved,
    "DocumentSaveRefused": _refused,
    "TabClosed": _closed,
    "TabCloseSkipped": _close_skipped,
    "FileRestored": _restored,
    "ObservationSaved": _observation,
}


# --- history -----------------------------------------------------------------------------


def _add_history(commands: argparse._SubParsersAction[Any]) -> None:
    sub = commands.add_parser(
        "history",
        help="the story of one file: every save and close, newest first",
        description="Every save (bytes, whether the disk had changed, what it replaced) and close "
        "(whether unsaved text was discarded) of one file, newest first.",
    )
    add_settings_arguments(sub)
    sub.add_argument("path", metavar="PATH", help="the file")
    sub.add_argument("--limit", default="0", help="at most this many events (default 0: all)")
    sub.add_argument("--json", action="store_true", help="JSON lines: one event with its command per line")
    sub.set_defaults(run=run_history)


@_quiet_broken_pipe
def run_history(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.sqlite.audit import history, parse_limit

    limit = parse_limit(args.limit)
    with _reading(settings) as conn:
        if args.json:
            _json_lines(history(conn, args.path, limit))
        else:
            print_history(conn, args.path, limit)
    return 0


def print_history(conn: sqlite3.Connection, path: str, limit: int | None = None) -> None:
    from toolbus.journal.sqlite.audit import history

    entries = history(conn, path, limit)
    shown = os.path.abspath(os.path.expanduser(path))
    if not entries:
        print(f"{shown}: no saves or closes in the journal", file=sys.stderr)
        return
    print(f"{shown}: {len(entries)} event{'s' if len(entries) != 1 else ''}, newest first")
    rows = [_history_row(entry) for entry in entries]
    print(table(["EVENT", "TIME (UTC)", "BY", "WHAT HAPPENED", "RECOVERABLE"], rows))
    if any(_recoverable_words(entry.event) != "-" for entry in entries):
        print(
            "\n`toolbus recover EVENT` prints a recoverable text; add --apply to write it back to the file."
        )


def _history_row(entry: HistoryEntry) -> list[str]:
    event = entry.event
    who = entry.agent or "-"
    if entry.tool and entry.tool not in ("saveDocument", "close_tab"):
        who += f" ({entry.tool})"
    return [
        f"@{event.position}",
        clock(event.recorded_at),
        who,
        describe_event(event).split(" ", 1)[1],
        _recoverable_words(event),
    ]


def _recoverable_words(event: StoredEvent) -> str:
    from toolbus.journal.sqlite.audit import RECOVERABLE_FIELDS

    field = RECOVERABLE_FIELDS.get(event.type)
    digest = event.data.get(field[0]) if field else None
    if digest is None:
        return "-"
    kind = "unsaved, discarded" if event.type == "TabClosed" else "replaced"
    return f"{size(event.blobs.get(digest))} {kind}"


# --- recover -----------------------------------------------------------------------------


def _add_recover(commands: argparse._SubParsersAction[Any]) -> None:
    sub = commands.add_parser(
        "recover",
        help="get back the text a save replaced or a close discarded",
        description="Print the text that a save replaced or a close discarded (or write it with -o). "
        "With --apply, write it back to its file; the restore is journaled like any command.",
    )
    add_settings_arguments(sub)
    sub.add_argument("event", metavar="EVENT", help="the event: its position (12 or @12) or its event id")
    target = sub.add_mutually_exclusive_group()
    target.add_argument("-o", "--output", metavar="FILE", help="write the text to FILE instead of stdout")
    target.add_argument("--apply", action="store_true", help="write the text back to the file it came from")
    sub.set_defaults(run=run_recover)


def run_recover(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.sqlite.audit import find_event, recoverable

    with _reading(settings) as conn:
        found = recoverable(conn, find_event(conn, args.event))
    where = f"event @{found.event.position}, {found.path}"
    if args.apply:
        from toolbus.adapters.recover import apply_recovery

        position = apply_recovery(settings, found)
        print(
            f"restored {found.path} ({size(len(found.content))}): {found.description} ({where}); "
            f"journaled as event @{position}"
        )
    elif args.output:
        Path(args.output).write_bytes(found.content)
        print(
            f"wrote {size(len(found.content))} to {args.output}: {found.description} ({where})",
            file=sys.stderr,
        )
    else:
        sys.stdout.buffer.write(found.content)
        sys.stdout.flush()
        print(f"toolbus recover: {found.description} ({where})", file=sys.stderr)
    return 0


# --- replay ------------------------------------------------------------------------------


def _add_replay(commands: argparse._SubParsersAction[Any]) -> None:
    replay = commands.add_parser(
        "replay",
        help="rebuild the memory store, or re-apply saves and closes to a Neovim",
        description="Rebuild something from the journal.",
    )
    what = replay.add_subparsers(dest="what", required=True, metavar="WHAT")
    memory = what.add_parser(
        "memory",
        help="rebuild the memory store from the journal's saved observations",
        description="Drop the memory store and rebuild it from every ObservationSaved event, in order.",
    )
    add_settings_arguments(memory)
    memory.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a scratch database and report differences from the live store (exit 1 if any)",
    )
    memory.set_defaults(run=run_replay_memory)

    editor = what.add_parser(
        "editor",
        help="re-apply recorded saves and closes, in order, to a Neovim",
        description="Re-apply recorded saves (the exact text written, from the journal), restores and "
        "closes, in journal order, to the Neovim at --nvim: a session's files are reproduced there. "
        "A buffer with unsaved changes is never overwritten or wiped: the replay stops there. A file "
        "that holds text the journal does not have for it (edited since, or another file where --map "
        "puts it) is first copied to FILE.~N~, numbered so that an earlier copy is never overwritten. "
        "Every Neovim request waits at most --nvim-timeout seconds: a blocked Neovim stops the replay "
        "with an error, never a hang.",
    )
    add_settings_arguments(editor)
    editor.add_argument("--from", dest="start", metavar="POSITION", help="first event position to replay")
    editor.add_argument("--to", dest="end", metavar="POSITION", help="last event position to replay")
    editor.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="replay files under directory FROM into directory TO instead (repeatable)",
    )
    editor.add_argument("--dry-run", action="store_true", help="list what would be done; change nothing")
    editor.set_defaults(run=run_replay_editor)


def run_replay_memory(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.sqlite.readonly import require_journal
    from toolbus.journal.sqlite.replay import check_memory, rebuild_memory

    if args.check:
        with _reading(settings) as conn:
            report = check_memory(conn)
        for line in report.differences:
            print(line)
        print(
            f"checked the memory store against {report.observations} saved observations: "
            + (f"{len(report.differences)} difference(s)" if report.differences else "no differences")
        )
        return 1 if report.differences else 0
    require_journal(settings.journal)
    from toolbus.adapters.bootstrap import open_journal

    journal = open_journal(settings, create=False)
    try:
        count = journal.run_sync(rebuild_memory)
    finally:
        journal.close()
    print(f"rebuilt the memory store from {count} saved observation{'s' if count != 1 else ''}")
    return 0


def run_replay_editor(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.sqlite.audit import parse_position
    from toolbus.journal.sqlite.replay import editor_steps, parse_path_map

    start = parse_position("--from", args.start) if args.start is not None else None
    end = parse_position("--to", args.end) if args.end is not None else None
    path_map = parse_path_map(args.map)
    if not args.dry_run and not settings.nvim:
        raise ValueError("--nvim ADDRESS is required: the Neovim to re-apply the saves and closes to")
    with _reading(settings) as conn:
        steps = list(editor_steps(conn, start, end, path_map))
    if args.dry_run:
        for step in steps:
            print(f"would {step.describe()}")
        print(f"{len(steps)} step{'s' if len(steps) != 1 else ''} to replay (dry run: nothing changed)")
        return 0
    from toolbus.adapters.replay_editor import replay_to_neovim

    assert settings.nvim is not None
    replay_to_neovim(settings.nvim, settings.nvim_timeout, steps, lambda done: print(done, flush=True))
    print(f"replayed {len(steps)} step{'s' if len(steps) != 1 else ''} to Neovim at {settings.nvim}")
    return 0
