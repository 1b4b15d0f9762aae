"""`toolbus`: the command line. Heavy imports (mcp, pynvim) happen only in the commands that need them."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolbus.adapters.config import Settings, add_settings_arguments, settings_from, this_host, version
from toolbus.adapters.terminal import for_terminal
from toolbus.bus import ToolbusError, Unfinished

if TYPE_CHECKING:
    from mcp.server.lowlevel import Server

    from toolbus.adapters.arrival import ArrivalOrder
    from toolbus.adapters.nvim import NvimEditor
    from toolbus.journal.postgres import PostgresJournal
    from toolbus.journal.sqlite import SqliteJournal

UNFINISHED = 1  # began to act, then failed: its output and the journal say what it did
USAGE_ERROR = 2  # bad input: a clear one-line message, nothing created or changed

Runner = Callable[[argparse.Namespace, Settings], int]


class UsageError(Exception):
    """Bad command-line input; reported in one line with exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    _hold_closed_standard_descriptors()
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version or a usage error, printed by argparse
        return _flush_stdout(stop.code if isinstance(stop.code, int) else 1, "toolbus")
    except OSError as error:  # --version into a closed pipe or a full disk, stdout unbuffered
        return _unwritable("toolbus", error)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
        format="toolbus: %(levelname)s %(name)s: %(message)s",
    )
    return _flush_stdout(_run(args), f"toolbus {args.command}")


def _hold_closed_standard_descriptors() -> None:
    """A standard descriptor the caller closed (`serve >&-`) would be the next file opened: the
    journal, which serving would then take for stdout and write answers into. Each closed one
    holds the null device instead, and its stream (None, as Python left it) reads or writes it."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, encoding="utf-8", closefd=False))  # noqa: SIM115 - for the process


def _run(args: argparse.Namespace) -> int:
    command = f"toolbus {args.command}"
    settings: Settings | None = None
    try:
        settings = settings_from(args)
        runner: Runner = args.run
        return runner(args, settings)
    except (UsageError, ToolbusError, ValueError) as error:
        print(f"{command}: {for_terminal(str(error))}", file=sys.stderr)  # it may quote an agent's text
        return UNFINISHED if isinstance(error, Unfinished) else USAGE_ERROR
    except BaseExceptionGroup as group:  # a closed pipe inside a task group (`toolbus demo | head`)
        if group.split(BrokenPipeError)[1] is not None:
            raise
        return _reader_gone()
    except OSError as error:  # `toolbus audit | head`: the reader has all it wanted; or a full disk
        return _unwritable(command, error)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if settings is None or (words := _journal_failure(error, settings.journal)) is None:
            raise
        print(f"{command}: {for_terminal(words)}", file=sys.stderr)
        return USAGE_ERROR


def _journal_failure(error: Exception, journal: Path | str) -> str | None:
    """toolbus's words for a database error met while a command read the journal (a damaged
    file; a team journal's server gone, or a lock it waited for, mid-read); None for another."""
    import sqlite3

    if isinstance(error, sqlite3.DatabaseError) and isinstance(journal, Path):
        from toolbus.journal.sqlite.store import explain_sqlite

        return explain_sqlite(journal, error)
    psycopg = sys.modules.get("psycopg")  # loaded if the command reached a team journal
    if psycopg is not None and isinstance(error, psycopg.Error) and isinstance(journal, str):
        from toolbus.journal.location import shown
        from toolbus.journal.postgres.store import reason

        return f"the team journal at {shown(journal)} failed: {reason(error)}"
    return None


def _flush_stdout(code: int, command: str) -> int:
    """Write what stdout still holds here, not at exit, where a closed pipe or a full disk
    would be a complaint from the interpreter and exit code 120."""
    try:
        sys.stdout.flush()
    except OSError as error:
        return _unwritable(command, error)
    return code


def _unwritable(command: str, error: OSError) -> int:
    """stdout failed: its reader is gone (quietly, exit 0) or its disk is full (one line, exit 1)."""
    if isinstance(error, BrokenPipeError):
        return _reader_gone()
    if error.errno not in _NO_ROOM:
        raise error
    return _no_room(command, error)


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _no_room(command: str, error: OSError) -> int:
    """`toolbus audit > /dev/full`: one line, exit 1. (Files toolbus writes say so themselves:
    the journal's disk, `recover -o`.)"""
    what = error.filename or "its output"
    print(f"{command}: cannot write {what}: {error.strerror}", file=sys.stderr)
    _quiet_stdout()
    return 1


def _reader_gone() -> int:
    _quiet_stdout()
    return 0


def _quiet_stdout() -> None:
    """Point stdout at the null device, so that the exit's flush of what is left is quiet too."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class _PrintVersion(argparse.Action):
    """`--version`, reading the installed version only when asked (importlib.metadata's import
    would cost every command 25 ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_: Any) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"toolbus {version()}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    from toolbus.adapters import cli_journal
    from toolbus.adapters.cli_team import add_journal_commands

    parser = argparse.ArgumentParser(
        prog="toolbus",
        description="MCP server for coding agents: Neovim editor tools and a memory, journaled.",
    )
    parser.add_argument("--version", action=_PrintVersion)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the MCP server over stdio (what an agent starts)",
        description="The MCP server an agent starts: MCP on stdin and stdout, logs on stderr. "
        "Neovim is the one at --nvim, $TOOLBUS_NVIM or $NVIM, else a running Neovim found by its "
        "default socket (of several, the newest whose working directory holds this one's, else the "
        "newest); without one, the editor tools answer with an error and the memory tools work.",
    )
    serve.set_defaults(run=run_serve)
    doctor = commands.add_parser(
        "doctor",
        help="show the Neovim and journal toolbus would use, and check them",
        description="The Neovim and journal `toolbus serve` would use with these settings, and "
        "whether each answers; exits non-zero, saying what to do, when something is wrong.",
    )
    doctor.set_defaults(run=run_doctor)
    for sub in (serve, doctor):
        add_settings_arguments(sub)
        sub.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr")
    cli_journal.add_commands(commands)
    add_journal_commands(commands)
    return parser


def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    import gc

    # The SDK's import builds some 550 pydantic models: with the collector off meanwhile, serve
    # starts 10 % sooner. Frozen, what the imports made is never scanned by a collection again.
    gc.disable()
    import anyio

    from toolbus.adapters.arrival import ArrivalOrder
    from toolbus.adapters.bootstrap import build_bus, identity, open_writer
    from toolbus.adapters.mcp_server import build_server, editor_tools
    from toolbus.journal.location import shown

    gc.freeze()
    gc.enable()

    journal = open_writer(settings)
    try:
        caller = identity(settings, journal)
    except ValueError:
        journal.close()
        raise
    bus = build_bus(settings, journal)
    arrivals = ArrivalOrder(editor_tools(bus))
    server = build_server(
        bus, caller.agent, caller.department, version(), arrivals, host=this_host(), from_login=caller.from_login
    )
    logging.getLogger("toolbus").info("serving; journal %s", shown(settings.journal))
    try:
        anyio.run(_serve, server, arrivals, bus.services.editor, journal)
    finally:
        bus.services.editor.disconnect()
        journal.close()
    return 0


async def _serve(
    server: Server[Any], arrivals: ArrivalOrder, editor: NvimEditor, journal: SqliteJournal | PostgresJournal
) -> None:
    import anyio

    from toolbus.adapters.mcp_server import serve_stdio

    log = logging.getLogger("toolbus")

    async def settle_abandoned() -> None:
        """What an earlier toolbus here was doing when it died, said under its files."""
        try:
            if settled := await journal.settle_abandoned(this_host()):
                log.warning("%d command(s) of ended toolbus processes recorded as in doubt", settled)
        except ToolbusError as error:  # the journal is busy: a later start settles them
            log.warning("could not settle the commands of ended toolbus processes: %s", error)
        except Exception:  # never worth stopping the server for
            log.exception("could not settle the commands of ended toolbus processes")

    async with anyio.create_task_group() as starting:
        starting.start_soon(editor.stay_connected)
        # Before the first answer: a client then finds in the journal all that was done before.
        # Quick unless there is something to settle and another writer holds the journal.
        await settle_abandoned()
        await serve_stdio(server, arrivals)
        starting.cancel_scope.cancel()


def run_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.adapters.doctor import diagnose

    report, healthy = diagnose(settings, version())
    print(report)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
