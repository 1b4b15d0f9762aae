"""`toolbus journal`: what a team's admin does to a team journal on PostgreSQL.

toolbus journal init URL                         the schema, its policies and grants (again: brought up to date)
toolbus journal agent URL ROLE --department D    make a login role an agent of a department
toolbus journal agent URL ROLE --remove          ... and an agent no more
toolbus journal copy SQLITE_FILE URL             bring a local journal's memory and history (once)
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolbus.adapters.config import Settings
from toolbus.bus import JournalNotFound, JournalUnavailable, typed_path
from toolbus.journal.location import is_postgres_url, not_a_file, postgres_url, shown

if TYPE_CHECKING:  # psycopg loads only for the commands that use it
    import psycopg


def add_journal_commands(commands: argparse._SubParsersAction[Any]) -> None:
    parser = commands.add_parser(
        "journal",
        help="set up a team journal on PostgreSQL: init, agent, copy",
        description="Set up a team journal on PostgreSQL. The URL's password may come from the URL, "
        "$PGPASSWORD or ~/.pgpass; it is never shown.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser("init", help="create the schema, its row-level security and grants (idempotent)")
    init.add_argument("url", metavar="URL", help="postgresql://ADMIN@HOST/DATABASE")
    init.set_defaults(run=run_init)
    agent = actions.add_parser("agent", help="register a login role as an agent of a department, or remove it")
    agent.add_argument("url", metavar="URL", help="postgresql://ADMIN@HOST/DATABASE")
    agent.add_argument("role", metavar="ROLE", help="the agent's login role (create it first: CREATE ROLE ... LOGIN)")
    which = agent.add_mutually_exclusive_group(required=True)
    which.add_argument("--department", help="the department whose notes it may see")
    which.add_argument("--remove", action="store_true", help="an agent no more (its login and what it did stay)")
    agent.set_defaults(run=run_agent)
    copy = actions.add_parser("copy", help="copy a local journal's memory and file history into a team journal")
    copy.add_argument("source", metavar="SQLITE_FILE", help="the local journal")
    copy.add_argument("url", metavar="URL", help="postgresql://USER@HOST/DATABASE (an agent copies in its own name)")
    copy.set_defaults(run=run_copy)


def _team_url(text: str) -> str:
    if not is_postgres_url(text):
        got = not_a_file(text) or repr(text)  # repr only of text in no way a URL: it holds no password
        raise ValueError(f"URL: expected a postgresql://USER@HOST/DATABASE URL, got {got}")
    return postgres_url(text)


@contextlib.contextmanager
def _as_admin(url: str) -> Iterator[psycopg.Connection[Any]]:
    """The admin's connection, given up on if the server stops answering anyone; PostgreSQL's
    refusal said in one line, with what to do."""
    import psycopg

    from toolbus.journal.postgres import connect
    from toolbus.journal.postgres.store import ANSWER_TIMEOUT, answered_within, server_answers

    with connect(url) as conn:
        try:
            with answered_within(conn, ANSWER_TIMEOUT, shown(url), server_answers(conn, url, shown(url))):
                yield conn
        except (psycopg.errors.InsufficientPrivilege, PermissionError) as error:
            # PermissionError: the journal is there, and this login may not even read it
            refusal = error.diag.message_primary if isinstance(error, psycopg.Error) else error
            raise ValueError(
                f"{refusal}: run this as the team's admin (the role that ran "
                "`toolbus journal init`, allowed to create roles)"
            ) from None
        except psycopg.Error as error:
            reason = error.diag.message_primary or error
            raise ValueError(f"the team journal at {shown(url)} refused: {reason}") from None


def run_init(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.postgres import init_schema

    url = _team_url(args.url)
    with _as_admin(url) as conn:
        init_schema(conn)
    print(f"the team journal at {shown(url)} is ready; register agents with `toolbus journal agent`")
    return 0


def run_agent(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.postgres import register_agent, unregister_agent

    url = _team_url(args.url)
    with _as_admin(url) as conn:
        try:
            if args.remove:
                department = unregister_agent(conn, args.role)
            else:
                register_agent(conn, args.role, args.department)
        except LookupError as error:
            raise ValueError(str(error)) from None
    if args.remove:
        print(f"{args.role} is no longer an agent (of {department}) in the team journal at {shown(url)}")
    else:
        print(f"{args.role} is an agent of {args.department} in the team journal at {shown(url)}")
    return 0


def run_copy(args: argparse.Namespace, settings: Settings) -> int:
    from toolbus.journal.postgres import PostgresJournal
    from toolbus.journal.postgres.copy import copy_journal
    from toolbus.journal.sqlite import SqliteReader
    from toolbus.journal.sqlite.readonly import require_journal
    from toolbus.journal.sqlite.store import explain_sqlite

    if why := not_a_file(args.source):
        raise ValueError(f"SQLITE_FILE: expected the local journal's file, got {why} (the team's URL comes second)")
    source_path = Path(typed_path(args.source))
    try:
        require_journal(source_path)
    except JournalNotFound:  # its usual words name --journal, which copy has not
        raise JournalNotFound(f"no journal at {source_path}: SQLITE_FILE names the local journal to copy") from None
    url = _team_url(args.url)
    source, target = SqliteReader(source_path), PostgresJournal(url)
    try:
        copied = copy_journal(source, target)
    except sqlite3.DatabaseError as error:  # the source, damaged: `_run` would name --journal's file
        raise JournalUnavailable(f"{explain_sqlite(source_path, error)}; batches before it were copied") from None
    finally:
        source.close()
        target.close()
    since = f", {copied.updated} of them brought up to date (events or an outcome recorded since)"
    print(
        f"copied {copied.commands} commands ({copied.events} events, {copied.observations} observations) "
        f"from {source_path} to {shown(url)}; {copied.already} were there already{since if copied.updated else ''}"
    )
    if copied.stale:
        print(
            f"{copied.stale} command(s) an earlier copy recorded as finished in doubt have an outcome here since: "
            "the team journal keeps them as they were (a finished command is never rewritten), their events added"
        )
    if copied.made_private:
        print(
            f"{copied.made_private} observation(s) for another department alone were copied as private: "
            "in your name, your department would have seen them"
        )
    return 0
