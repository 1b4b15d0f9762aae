"""The journal's command line: audit, history, recover, replay, and the demo.

Read-only commands open the journal with `journal.readonly`, which refuses a missing file or
a stranger's database before SQLite touches it. Every value a person types is parsed before
the journal is opened, so bad input changes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from toolbus.adapters.config import JOURNAL_HELP, Settings, add_settings_arguments, this_host
from toolbus.adapters.demo import add_demo
from toolbus.adapters.report import one_more, print_audit_table, print_history, size
from toolbus.adapters.terminal import for_terminal
from toolbus.bus import STATUSES, AuditQuery, JournalReader, NoSuchEvent, Status, StoredEvent, file_streams
from toolbus.bus.commands import CLI_COMMANDS, SQLITE_INT_MAX, TOOL_COMMANDS
from toolbus.bus.moments import AGO_FORMS, epoch_ns, iso_time, parse_ago, parse_iso
from toolbus.journal import EditorStep, check_path_map, editor_steps, parse_path_map, recoverable

Runner = Callable[[argparse.Namespace, Settings], int]
_json = msgspec.json.Encoder()


def add_commands(commands: argparse._SubParsersAction[Any]) -> None:
    """Register audit, history, recover, replay and demo."""
    _add_audit(commands)
    _add_history(commands)
    _add_recover(commands)
    _add_replay(commands)
    add_demo(commands)


# --- shared plumbing ---------------------------------------------------------------------


def _journal_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--journal",
        metavar="PATH|URL",
        help=JOURNAL_HELP,
    )


def _host_arguments(parser: argparse.ArgumentParser, what: str, default: str = "this machine's") -> None:
    """`--host NAME` and `--all-hosts`: which machine's `what` (one path on two machines is two files)."""
    machines = parser.add_mutually_exclusive_group()
    machines.add_argument(
        "--host",
        metavar="NAME",
        help=f"only the {what} of machine NAME, and those recorded before machines were (default: {default})",
    )
    machines.add_argument("--all-hosts", action="store_true", help=f"the {what} of every machine")


def chosen_host(args: argparse.Namespace, default: str | None) -> str | None:
    """The machine `--host` names, None for `--all-hosts` (every machine), else `default`. Rows
    recorded before journals kept the machine show on every one."""
    if args.all_hosts:
        return None
    if args.host is None:
        return default
    if not args.host.strip():
        raise ValueError("--host: expected a machine name (--all-hosts for every machine), got ''")
    return str(args.host)


@contextmanager
def _reading(settings: Settings) -> Iterator[JournalReader]:
    from toolbus.adapters.bootstrap import open_reader  # Neovim's and the backend's imports: only when used

    reader = open_reader(settings)
    try:
        yield reader
    finally:
        reader.close()


def _refuse_another_login(settings: Settings, reader: JournalReader) -> None:
    """A print, check or dry run refuses the `--agent` or `--department` that the command
    would, run for real on a team journal: they name a login other than this one."""
    if isinstance(settings.journal, str):
        from toolbus.adapters.bootstrap import require_login_options
        from toolbus.journal.postgres import PostgresReader

        assert isinstance(reader, PostgresReader)
        require_login_options(settings, reader)


def _json_lines(items: Iterable[msgspec.Struct]) -> int:
    count = 0
    for item in items:
        sys.stdout.write(_json.encode(item).decode() + "\n")
        count += 1
    return count


# --- parsing what people type ----------------------------------------------------------------

_POSITION = re.compile(r"^@?(\d+)$")
_EVENT_ID = re.compile(r"^[0-9a-fA-F]{32}$")


def parse_time(option: str, text: str, now: datetime | None = None) -> str:
    """An ISO time (UTC unless it says otherwise) or a time ago (`30m`, `2h`, `7d`), as a
    journal timestamp. A bare date is that day's midnight: a window's ends are instants."""
    try:
        moment = parse_ago(text, now or datetime.now(UTC)) or parse_iso(text).at
        return iso_time(epoch_ns(moment.astimezone(UTC)))
    except ValueError:
        raise ValueError(
            f"{option}: expected an ISO time (2026-05-01, 2026-05-01T12:00:00Z) or {AGO_FORMS}, got {text!r}"
        ) from None
    except OverflowError:  # before year 1 or after 9999, in UTC
        raise ValueError(f"{option}: {text!r} is out of range (years 1 to 9999, UTC)") from None


def parse_limit(text: str) -> int | None:
    """`--limit N`: at most N rows; 0 means all."""
    if not (text.isascii() and text.isdigit()):  # not '²', which isdigit() takes for one
        raise ValueError(f"--limit: expected a whole number (0 for all), got {text!r}")
    if int(text) > SQLITE_INT_MAX:
        raise ValueError(f"--limit: expected at most {SQLITE_INT_MAX} (0 for all), got {text!r}")
    return int(text) or None


def parse_position(option: str, text: str) -> int:
    """An event position as typed: `12` or `@12`."""
    if not (match := _POSITION.match(text.strip())) or int(match[1]) > SQLITE_INT_MAX:
        raise ValueError(f"{option}: expected an event position (e.g. 12, at most {SQLITE_INT_MAX}), got {text!r}")
    return int(match[1])


def parse_status(text: str) -> Status:
    for status in STATUSES:
        if text == status:
            return status
    raise ValueError(f"--status: expected one of {', '.join(STATUSES)}, got {text!r}")


def parse_event_reference(text: str) -> int | str:
    """`EVENT` as typed: a position (`12`, `@12`) or an event id (32 hex digits)."""
    if _EVENT_ID.match(text.strip()):
        return text.strip().lower()
    try:
        return parse_position("EVENT", text)
    except ValueError:
        raise ValueError(
            f"EVENT: expected an event position (e.g. 12) or an event id (32 hex digits), got {text!r}"
        ) from None


def find_event(reader: JournalReader, reference: int | str, typed: str, scope: str = "") -> StoredEvent:
    """The event `reference` names; `scope` says whose events the reader shows, when not everyone's."""
    try:
        return reader.event_at(reference) if isinstance(reference, int) else reader.event_by_id(reference)
    except NoSuchEvent:
        whose = f" of {scope}" if scope else ""
        raise NoSuchEvent(f"no event {typed.strip()}{whose} in the journal") from None


def _whose(settings: Settings, reader: JournalReader) -> str:
    """Whose events a reader of the journal shows, when not everyone's: a team journal shows
    each agent only its own file events (row-level security), and its admin every login's."""
    if not isinstance(settings.journal, str):
        return ""
    from toolbus.journal.postgres import PostgresReader

    assert isinstance(reader, PostgresReader)
    return "" if reader.administers else "this login's"


# --- audit -------------------------------------------------------------------------------


def _add_audit(commands: argparse._SubParsersAction[Any]) -> None:
    sub = commands.add_parser(
        "audit",
        help="query the journal: who called what, on which file, with what outcome",
        description="Commands in the journal, newest first, each with what it changed.",
    )
    _journal_argument(sub)
    sub.add_argument("--tool", help="only this tool (saveDocument, close_tab, save, recover, ...)")
    sub.add_argument("--path", help="only the saves, closes, restores and diffs of this file, failed ones too")
    sub.add_argument("--status", help="only this outcome: ok, rejected, failed, in_doubt or cancelled")
    sub.add_argument(
        "--since",
        metavar="TIME",
        help="received at or after TIME: ISO (UTC unless it says) or 2h, 30m, 7d ago",
    )
    sub.add_argument("--until", metavar="TIME", help="received before TIME (same forms as --since)")
    sub.add_argument("--session", help="only this MCP session id")
    sub.add_argument("--agent", dest="agent_filter", metavar="AGENT", help="only calls made as this agent")
    _host_arguments(sub, "calls", "with --path, this machine's; without, every machine's")
    sub.add_argument("--limit", default="50", help="at most this many commands (default 50; 0 for all)")
    sub.add_argument("--json", action="store_true", help="JSON lines: one command with its events per line")
    sub.set_defaults(run=run_audit)


def audit_query(args: argparse.Namespace) -> Any:
    """The filters as typed, checked: raises ValueError naming the option."""
    query = AuditQuery(
        tool=args.tool,
        paths=file_streams(args.path) if args.path else (),
        status=parse_status(args.status) if args.status is not None else None,
        since=parse_time("--since", args.since) if args.since is not None else None,
        until=parse_time("--until", args.until) if args.until is not None else None,
        session=args.session,
        agent=args.agent_filter,
        # A path names a file on one machine: this one's, unless told.
        host=chosen_host(args, this_host() if args.path else None),
        limit=parse_limit(args.limit),
        here=this_host(),
    )
    if query.since is not None and query.until is not None and query.since >= query.until:
        raise ValueError(f"--since {args.since} is not before --until {args.until}: no call could match")
    return query


def _nothing_matched(query: AuditQuery) -> str:
    """Why an audit found nothing, when a filter as typed is the likely reason."""
    known = {command.tool for command in (*TOOL_COMMANDS, *CLI_COMMANDS)}
    if query.tool is not None and query.tool not in known:
        alike = [tool for tool in sorted(known) if tool.lower() == query.tool.lower()]
        return f"no commands match: --tool {query.tool} is no tool" + (f" (did you mean {alike[0]}?)" if alike else "")
    if query.paths and query.host is not None:
        return f"no commands match on {query.host} (--all-hosts for every machine's)"
    return "no commands match"


def run_audit(args: argparse.Namespace, settings: Settings) -> int:
    query = audit_query(args)
    with _reading(settings) as reader:
        entries = iter(reader.audit(dataclasses.replace(query, limit=one_more(query.limit))))
        page = itertools.islice(entries, query.limit)
        shown = _json_lines(page) if args.json else print_audit_table(page, hosts=args.all_hosts)
        left_out = next(entries, None) is not None
    if not args.json:
        if shown == 0:
            print(_nothing_matched(query), file=sys.stderr)
        elif left_out:
            print(f"(the newest {shown} shown; --limit 0 for all)", file=sys.stderr)
    return 0


# --- history -----------------------------------------------------------------------------


def _add_history(commands: argparse._SubParsersAction[Any]) -> None:
    sub = commands.add_parser(
        "history",
        help="the story of one file: every save and close, newest first",
        description="Every save (bytes, whether the disk had changed, what it replaced) and close "
        "(whether unsaved text was discarded) of one file, newest first.",
    )
    _journal_argument(sub)  # it only reads: who is asking changes nothing
    sub.add_argument("path", metavar="PATH", help="the file")
    sub.add_argument("--limit", default="0", help="at most this many events (default 0: all)")
    sub.add_argument("--json", action="store_true", help="JSON lines: one event with its command per line")
    _host_arguments(sub, "events")
    sub.set_defaults(run=run_history)


def run_history(args: argparse.Namespace, settings: Settings) -> int:
    limit = parse_limit(args.limit)
    host = chosen_host(args, this_host())
    with _reading(settings) as reader:
        if args.json:
            _json_lines(reader.history(args.path, limit, host))
        else:
            print_history(reader, args.path, limit, host, _whose(settings, reader))
    return 0


# --- recover -----------------------------------------------------------------------------


def _add_recover(commands: argparse._SubParsersAction[Any]) -> None:
    sub = commands.add_parser(
        "recover",
        help="get back the text a save replaced, a close discarded or a diff rejected",
        description="Print the text that a save or an accepted diff replaced, a close discarded, or "
        "the proposal of a rejected diff (or write it with -o). "
        "With --apply, write it back to its file; the restore is journaled like any command.",
    )
    add_settings_arguments(sub, editor=False)  # --apply writes the file itself
    sub.add_argument("event", metavar="EVENT", help="the event: its position (12 or @12) or its event id")
    target = sub.add_mutually_exclusive_group()
    target.add_argument("-o", "--output", metavar="FILE", help="write the text to FILE instead of stdout")
    target.add_argument("--apply", action="store_true", help="write the text back to the file it came from")
    sub.add_argument("--force", action="store_true", help="with -o: overwrite FILE if it exists")
    sub.set_defaults(run=run_recover)


def run_recover(args: argparse.Namespace, settings: Settings) -> int:
    reference = parse_event_reference(args.event)
    if args.force and args.output is None:
        raise ValueError("--force goes only with -o FILE, whose existing file it lets recover overwrite")
    output = _output_file(os.path.expanduser(args.output), args.force) if args.output is not None else None
    with _reading(settings) as reader:
        _refuse_another_login(settings, reader)
        found = recoverable(reader, find_event(reader, reference, args.event, _whose(settings, reader)))
        machine = _machine_of(reader, found.event) if args.apply else None
    shown = for_terminal(found.path)  # a path an agent named: no control character reaches the terminal
    where = f"event @{found.event.position}, {shown}"
    if args.apply:
        if machine is not None and machine != this_host():
            raise ValueError(
                f"event @{found.event.position} happened on {machine}, and --apply writes this machine's "
                f"{shown}: print the text (or -o FILE) and take it there"
            )
        from toolbus.adapters.recover import apply_recovery

        position = apply_recovery(settings, found)
        print(
            f"restored {shown} ({size(len(found.content))}): {found.description} ({where}); "
            f"journaled as event @{position}"
        )
    elif output is not None:
        _write_output(output, found.content, args.force)
        print(
            f"wrote {size(len(found.content))} to {args.output}: {found.description} ({where})",
            file=sys.stderr,
        )
    else:
        sys.stdout.buffer.write(found.content)
        sys.stdout.flush()
        print(f"toolbus recover: {found.description} ({where})", file=sys.stderr)
    return 0


def _machine_of(reader: JournalReader, event: StoredEvent) -> str | None:
    """The machine an event about a file happened on; None when recorded before journals kept it."""
    for entry in reader.history(str(event.data["path"])):
        if entry.event.position == event.position:
            return entry.host
    return None


def _output_file(name: str, force: bool) -> Path:
    """`-o FILE`, checked before the journal is read: its directory exists, and it is not a
    directory, nor (without --force) a file that exists."""
    if not name:
        raise ValueError("-o: expected a file's name, got '' (leave -o out to print the text)")
    path = Path(name)
    if path.is_dir() or name.endswith(os.sep):  # `newdir/` names a folder, though Path drops the slash
        raise ValueError(f"-o: {name} is a directory: name a file")
    if not path.parent.is_dir():
        raise ValueError(f"-o: {path.parent} does not exist: create it first, or name a file elsewhere")
    if path.exists() and not force:
        raise ValueError(f"-o: {name} exists: add --force to overwrite it")
    return path


def _write_output(path: Path, content: bytes, force: bool) -> None:
    try:
        with open(path, "wb" if force else "xb") as file:
            file.write(content)
    except FileExistsError:
        raise ValueError(f"-o: {path} exists: add --force to overwrite it") from None
    except OSError as error:
        raise ValueError(f"-o: cannot write {path}: {error.strerror}") from None


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
    add_settings_arguments(memory, editor=False)
    memory.add_argument(
        "--check",
        action="store_true",
        help="rebuild into a scratch database and report differences from the live store (exit 1 if any)",
    )
    memory.set_defaults(run=run_replay_memory)

    editor = what.add_parser(
        "editor",
        help="re-apply recorded saves and closes, in order, to a Neovim",
        description="Re-apply recorded saves and accepted diffs (the exact text written, from the "
        "journal), restores and closes, in journal order, to the Neovim at --nvim: a session's files "
        "are reproduced there. "
        "A buffer with unsaved changes is never overwritten or wiped: the replay stops there. A file "
        "that holds text the journal does not have for it (edited since, or another file where --map "
        "puts it) is first copied to FILE.~N~, numbered so that an earlier copy is never overwritten. "
        "Every Neovim request waits at most --nvim-timeout seconds: a blocked Neovim stops the replay "
        "with an error, never a hang.",
    )
    # Never found by itself: a replay changes files, so the Neovim it goes to is named.
    add_settings_arguments(
        editor, nvim_help="socket path or host:port of the Neovim to replay to (required unless --dry-run)"
    )
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
    _host_arguments(editor, "saves and closes")
    editor.set_defaults(run=run_replay_editor)


def run_replay_memory(args: argparse.Namespace, settings: Settings) -> int:
    if args.check:
        with _reading(settings) as reader:
            _refuse_another_login(settings, reader)
            report = reader.check_memory()
        for line in report.differences:
            print(for_terminal(line))  # rows quote a note's fields
        print(
            f"checked the memory store against {report.observations} saved observations: "
            + (f"{len(report.differences)} difference(s)" if report.differences else "no differences")
        )
        return 1 if report.differences else 0
    from toolbus.adapters.bootstrap import open_writer

    journal = open_writer(settings, create=False)
    try:
        count = journal.rebuild_memory()
    finally:
        journal.close()
    print(f"rebuilt the memory store from {count} saved observation{'s' if count != 1 else ''}")
    return 0


def run_replay_editor(args: argparse.Namespace, settings: Settings) -> int:
    start = parse_position("--from", args.start) if args.start is not None else None
    end = parse_position("--to", args.end) if args.end is not None else None
    path_map = parse_path_map(args.map)
    host = chosen_host(args, this_host())
    if start is not None and end is not None and start > end:
        raise ValueError(f"--from {start} is after --to {end}: no event could be replayed")
    if not args.dry_run and not settings.nvim:
        raise ValueError(
            "--nvim ADDRESS is required: the Neovim to re-apply the saves and closes to (a replay"
            " changes files, so it goes only where it is told: $TOOLBUS_NVIM and $NVIM are not used)"
        )
    with _reading(settings) as reader:
        _refuse_another_login(settings, reader)
        whose = _whose(settings, reader)
        steps = list(editor_steps(reader, start, end, path_map, host))
        elsewhere = 0 if steps or host is None else sum(1 for _ in editor_steps(reader, start, end, path_map))
    if elsewhere:
        print(f"0 steps on {host}; {elsewhere} on other machines (--host NAME or --all-hosts)", file=sys.stderr)
        return 0
    check_path_map(args.map, steps)
    if args.dry_run:
        for step in steps:
            print(f"would {for_terminal(step.describe())}")
        print(f"{_steps(steps, whose)} to replay (dry run: nothing changed)")
        return 0
    from toolbus.adapters.replay_editor import replay_to_neovim

    assert settings.nvim is not None
    idle = replay_to_neovim(settings, settings.nvim, steps, lambda done: print(for_terminal(done), flush=True))
    closes = f"{idle} close{'s' if idle != 1 else ''}"
    idle_closes = f"; {closes} found the file not open there: nothing to do" if idle else ""
    print(f"replayed {_steps(steps, whose)} to Neovim at {settings.nvim}{idle_closes}")
    return 0


def _steps(steps: list[EditorStep], whose: str) -> str:
    """How many steps, and from whose events when not everyone's."""
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''}" + (f" from {whose} events" if whose else "")
