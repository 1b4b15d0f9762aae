"""The team journal's schema on PostgreSQL, its row-level security and its grants.

Everything lives in the `toolbus` schema. The role that runs `toolbus journal init` owns the
tables (it is the team's admin: it sees everything); agents are login roles the admin
registers (`register_agent`), members of the database's group role (`agent_group`:
`toolbus_agent_DATABASE`) that holds their privileges. Row-level security makes the database
itself enforce what an agent may see and write, whatever client it uses:

- an agent reads its own commands, events and blobs, and the observations (and the events
  that saved them) that their visibility shows it: public and project ones, its department's,
  its own; every other event is its agent's alone;
- it writes only in its own name and department (an observation's event says so in its data
  too, and its projection must be of that event), and never updates or deletes an event, a
  blob or an observation; it may finish its own command under way (status, error and timing),
  not rewrite a finished one;
- a blob's hash is checked against its content.

One gapless order of events across machines: a trigger gives each new event the next
position under a lock on the one row of `append_lock`, held until commit, so positions commit
in order and a reader following the log never skips one (a rollback leaves no hole, unlike
a sequence). Only the owner's functions lock that row, inside the transaction that appends
(an advisory lock, which any role may take and hold for a whole idle session, let one agent
stop everyone's saves). An agent's own transaction that appends holds it until it ends: one
kept open on purpose (its idle timeout turned off, or a long statement after the append) still
blocks the others' saves, each with a lock-timeout error, until the admin ends that session.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql

from toolbus.bus import JournalUnavailable
from toolbus.journal.postgres.memory import MEMORY_TABLES

SCHEMA = "toolbus"
# The group role schemas before 4 gave the agents of every team journal on a server alike.
SHARED_AGENT_GROUP = "toolbus_agent"
# What each schema version brought, in a user's words: missing until the admin runs `journal
# init` again.
SCHEMA_ADDITIONS = {
    2: "the events of a call whose process died (commands.pending)",
    3: "notes timed in the order of their ids, whatever the servers' clocks (latest_observation_time())",
    4: "a group role of its own for its agents: an agent of another team journal on the server sees none of it;"
    " a command finished in doubt its agent can no longer rewrite; an append lock no idle session can hold;"
    " (from schema 1) each text checked against its hash",
}
SCHEMA_VERSION = max(SCHEMA_ADDITIONS)
IDLE_IN_TRANSACTION_TIMEOUT = 30  # seconds an agent's session may hold a transaction open, idle

_TABLES = (
    """CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS agents (
        role text PRIMARY KEY,  -- a login role
        department text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS commands (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        request_key uuid UNIQUE,  -- chosen by the writer: a retried insert finds its row
        tool text NOT NULL,
        arguments text NOT NULL,  -- JSON, as the client sent it
        agent text NOT NULL,
        department text,
        client_name text,
        client_version text,
        session_id text,
        host text,  -- the machine that ran the command
        pid integer,
        received_at text NOT NULL,  -- ISO 8601, UTC, microseconds: sorts as text
        finished_at text,
        duration_ms double precision,
        status text NOT NULL,
        error text
    )""",
    # What a command under way may do, as events (`journal.abandoned`); NULL once it finished.
    # Added to a journal of schema 1 by running `journal init` again.
    "ALTER TABLE commands ADD COLUMN IF NOT EXISTS pending text",
    "CREATE INDEX IF NOT EXISTS commands_pending ON commands (host) WHERE pending IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS commands_by_time ON commands (received_at, id)",
    "CREATE INDEX IF NOT EXISTS commands_by_tool ON commands (tool, received_at)",
    "CREATE INDEX IF NOT EXISTS commands_by_agent ON commands (agent, received_at)",
    # The rare calls whose status is not ok: `--status failed`, and a file's calls that failed
    # before any event (`toolbus audit --path`). Added to an older journal by `journal init`.
    "CREATE INDEX IF NOT EXISTS commands_not_ok ON commands (status, received_at) WHERE status <> 'ok'",
    """CREATE TABLE IF NOT EXISTS events (
        position bigint PRIMARY KEY,  -- given by next_position(): gapless, in commit order
        event_id text NOT NULL UNIQUE,
        command_id bigint REFERENCES commands (id),
        type text NOT NULL,
        version integer NOT NULL,
        stream text NOT NULL,
        recorded_at text NOT NULL,
        data text NOT NULL,  -- JSON
        agent text NOT NULL,
        department text NOT NULL,
        visibility text NOT NULL  -- an observation's; 'private' for every other event
    )""",
    "CREATE INDEX IF NOT EXISTS events_by_stream ON events (stream, position)",
    "CREATE INDEX IF NOT EXISTS events_by_command ON events (command_id)",
    "CREATE INDEX IF NOT EXISTS events_by_type ON events (type, position)",
    """CREATE TABLE IF NOT EXISTS blobs (
        hash text NOT NULL,  -- SHA-256 of the content
        agent text NOT NULL,  -- each agent keeps its own copy: a text is only its keeper's to read
        size integer NOT NULL,
        content bytea NOT NULL CHECK (hash = encode(sha256(content), 'hex')),
        PRIMARY KEY (hash, agent)
    )""",
    # A journal of schema 1 made `blobs` without the hash check (CREATE TABLE IF NOT EXISTS above
    # adds none to a table there already): new rows get it; old ones toolbus wrote itself.
    f"""DO $$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_constraint WHERE conrelid = '{SCHEMA}.blobs'::regclass AND contype = 'c') THEN
            ALTER TABLE blobs ADD CONSTRAINT blobs_content_check
                CHECK (hash = encode(sha256(content), 'hex')) NOT VALID;
        END IF;
    END $$""",
    # The append lock: its one row, locked (FOR UPDATE) by the owner's functions only.
    "CREATE TABLE IF NOT EXISTS append_lock (one boolean PRIMARY KEY DEFAULT true CHECK (one))",
    "INSERT INTO append_lock VALUES (true) ON CONFLICT DO NOTHING",
)

# Whether role `r` is one row-level security does not bind on the table `c`: a superuser, a role
# that bypasses it, or the owner, or a role with the owner's privileges (PostgreSQL's test).
_UNBOUND = "(r.rolsuper OR r.rolbypassrls OR pg_has_role(r.oid, c.relowner, 'USAGE'))"
# Whether the session's login is one the journal's policies do not bind: its admin.
LOGIN_ADMINISTERS = (
    f"(SELECT {_UNBOUND} FROM pg_roles AS r, pg_class AS c"
    f" WHERE r.rolname = session_user AND c.oid = '{SCHEMA}.commands'::regclass)"
)

# Who may see an observation, judged inside a SECURITY DEFINER function (where current_user is
# the owner) for the login: as the policies would, and everything for those they do not bind.
_LOGIN_SEES = (
    "(visibility IN ('public', 'project') OR agent = session_user"
    " OR (visibility = 'department'"
    " AND department = (SELECT a.department FROM agents AS a WHERE a.role = session_user))"
    f" OR (SELECT {_UNBOUND} FROM pg_roles AS r, pg_class AS c"
    f" WHERE r.rolname = session_user AND c.oid = '{SCHEMA}.observations'::regclass))"
)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Row-level security keeps PostgreSQL from using an index for a condition whose operator is not
# leakproof, and text search's `@@` is not: under the policies every search would read the
# whole table. This function runs as the owner, so the word index serves, and returns only the
# observations the login (session_user) may see, as the policies would judge it: the columns a
# search filters on, and whether `ranked` is in the title, facts or concepts, so the rows are
# read once. Its query is planned at each call for the words it is given (EXECUTE): a plan made
# once for any words would walk a common word's index as it walks a rare one's.
_MATCHING = (
    "SELECT id, type, project, created_at_epoch, agent, department, visibility,"
    f" ts_filter(document, '{{a,b}}') @@ $2 FROM {SCHEMA}.observations WHERE document @@ $1 AND {_LOGIN_SEES}"
)
SEARCH_FUNCTIONS: tuple[str, ...] = (
    f"""CREATE OR REPLACE FUNCTION matching_observations(query tsquery, ranked tsquery) RETURNS TABLE (
            id bigint, type text, project text, created_at_epoch bigint, agent text, department text,
            visibility text, titled boolean
        ) LANGUAGE plpgsql STABLE ROWS 100 SECURITY DEFINER SET search_path = {SCHEMA}, pg_temp AS $$
        BEGIN RETURN QUERY EXECUTE {_literal(_MATCHING)} USING query, ranked; END $$""",
)

_FUNCTIONS = (
    # Runs as the owner (SECURITY DEFINER): it must see every position, which an agent cannot.
    f"""CREATE OR REPLACE FUNCTION next_position() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = {SCHEMA}, pg_temp AS $$
    BEGIN
        PERFORM 1 FROM {SCHEMA}.append_lock FOR UPDATE;
        NEW.position := (SELECT coalesce(max(position), 0) + 1 FROM {SCHEMA}.events);
        RETURN NEW;
    END $$""",
    "DROP TRIGGER IF EXISTS events_next_position ON events",
    "CREATE TRIGGER events_next_position BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION next_position()",
    f"""CREATE OR REPLACE FUNCTION my_department() RETURNS text LANGUAGE sql STABLE
        SET search_path = {SCHEMA}, pg_temp AS $$ SELECT department FROM agents WHERE role = current_user $$""",
    # The time a new observation must come after (`JournalWriter.finish`): the latest of all,
    # those the login may not see too (a note an agent sees must not be followed by one timed
    # before it), so it runs as the owner. Under the append lock, as the position trigger:
    # nothing commits between this read and the observation's insert.
    f"""CREATE OR REPLACE FUNCTION latest_observation_time() RETURNS bigint
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = {SCHEMA}, pg_temp AS $$
    BEGIN
        PERFORM 1 FROM {SCHEMA}.append_lock FOR UPDATE;
        RETURN (SELECT max(created_at_epoch) FROM {SCHEMA}.observations);
    END $$""",
    *SEARCH_FUNCTIONS,
)

# Who sees an observation (and its event). `(SELECT ...)`: evaluated once per query, not per row.
_SEES = (
    "(visibility IN ('public', 'project') OR agent = current_user"
    " OR (visibility = 'department' AND department = (SELECT my_department())))"
)
_IN_OWN_NAME = "agent = current_user AND department = (SELECT my_department())"
# An observation's event says in its data whose it is and who sees it: the same as its columns,
# which the policies check (a rebuild of the memory reads the data). Any other event is private.
_EVENT_OWNED_AS_SAID = (
    "(type <> 'ObservationSaved' AND visibility = 'private')"
    " OR (type = 'ObservationSaved' AND data::jsonb ->> 'agent' = agent"
    " AND data::jsonb ->> 'department' = department AND data::jsonb ->> 'visibility' = visibility)"
)
_POLICIES = {
    "commands": {
        "SELECT": "USING (agent = current_user)",
        "INSERT": f"WITH CHECK ({_IN_OWN_NAME})",
        # Finishing its own command under way (or settling one whose process died): a finished
        # one is history, not to be rewritten.
        "UPDATE": "USING (agent = current_user AND status = 'in_doubt' AND finished_at IS NULL)"
        " WITH CHECK (agent = current_user)",
    },
    "events": {
        # Another agent's event only if it saved an observation this agent may see.
        "SELECT": f"USING (agent = current_user OR (type = 'ObservationSaved' AND {_SEES}))",
        # An event joins only a command of its own agent (the subquery sees no other). Correlated,
        # so it is one lookup by primary key, not a read of every command the agent has.
        "INSERT": f"WITH CHECK ({_IN_OWN_NAME} AND ({_EVENT_OWNED_AS_SAID}) AND (command_id IS NULL"
        " OR EXISTS (SELECT 1 FROM commands AS c WHERE c.id = command_id)))",
    },
    "blobs": {"SELECT": "USING (agent = current_user)", "INSERT": "WITH CHECK (agent = current_user)"},
    "observations": {
        "SELECT": f"USING {_SEES}",
        # Only the projection of its own ObservationSaved event, as the same agent, department
        # and visibility (checked before the keys, so a probe learns nothing of others' ids).
        "INSERT": f"WITH CHECK ({_IN_OWN_NAME} AND EXISTS (SELECT 1 FROM events AS e WHERE e.position = id"
        " AND e.type = 'ObservationSaved' AND e.agent = observations.agent"
        " AND e.department = observations.department AND e.visibility = observations.visibility))",
    },
}
# `{group}`: the database's agent group, quoted.
_GRANTS = (
    # The functions run as the owner: only agents may call them (PostgreSQL lets anyone by default).
    "REVOKE EXECUTE ON FUNCTION next_position(), my_department(), latest_observation_time(),"
    " matching_observations(tsquery, tsquery) FROM PUBLIC",
    f"GRANT USAGE ON SCHEMA {SCHEMA} TO {{group}}",
    "GRANT SELECT ON meta, agents TO {group}",
    "GRANT SELECT, INSERT ON commands, events, blobs, observations TO {group}",
    "GRANT UPDATE (status, error, finished_at, duration_ms, pending) ON commands TO {group}",
    "GRANT EXECUTE ON FUNCTION my_department(), latest_observation_time(), matching_observations(tsquery, tsquery)"
    " TO {group}",
)
# What the shared group of older schemas held here: nothing, once this database has its own.
_SHARED_GROUP_REVOKED = (
    f"REVOKE ALL ON SCHEMA {SCHEMA} FROM {SHARED_AGENT_GROUP}",
    f"REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM {SHARED_AGENT_GROUP}",
    f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {SCHEMA} FROM {SHARED_AGENT_GROUP}",
)


def agent_group(conn: psycopg.Connection[Any]) -> str:
    """The group role of this database's agents. Roles belong to the whole server: a group
    shared by every team journal on it would let an agent of one read another's."""
    [(database,)] = conn.execute("SELECT current_database()").fetchall()
    name = f"toolbus_agent_{database}"
    if len(name.encode()) > 63:  # PostgreSQL's longest name
        name = "toolbus_agent_" + hashlib.sha256(database.encode()).hexdigest()[:32]
    return name


def init_schema(conn: psycopg.Connection[Any]) -> None:
    """Create (or complete) the schema, its policies and grants, in one transaction: running
    it again changes nothing. `conn` is the admin's, in autocommit mode."""
    with conn.transaction():
        if (version := schema_version(conn)) is not None and version > SCHEMA_VERSION:
            raise JournalUnavailable(newer_schema(f"database {conn.info.dbname!r}", version))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        conn.execute(f"SET LOCAL search_path = {SCHEMA}")
        name = agent_group(conn)
        _create_group(conn, name)
        group = sql.Identifier(name).as_string(conn)
        for statement in (*_TABLES, *MEMORY_TABLES, *_FUNCTIONS):
            conn.execute(statement)
        for table, policies in _POLICIES.items():
            conn.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
            for action, rule in policies.items():
                name = f"{table}_{action.lower()}"
                conn.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
                conn.execute(f"CREATE POLICY {name} ON {table} FOR {action} TO {group} {rule}")
        for statement in _GRANTS:
            conn.execute(statement.format(group=group))
        _leave_shared_group(conn, group)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )


def _create_group(conn: psycopg.Connection[Any], name: str) -> None:
    """The group role agents join; it may exist already (`journal init` again)."""
    if not _role_exists(conn, name):
        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(name)))


def _role_exists(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None


def _leave_shared_group(conn: psycopg.Connection[Any], group: str) -> None:
    """A journal of an older schema: its agents join its own group, and the group every team
    journal shared loses what it held here (its members' other journals keep theirs)."""
    if _role_exists(conn, SHARED_AGENT_GROUP):
        for statement in _SHARED_GROUP_REVOKED:
            conn.execute(statement)
    agents = conn.execute(f"SELECT a.role FROM {SCHEMA}.agents AS a JOIN pg_roles AS r ON r.rolname = a.role")
    for (role,) in agents.fetchall():
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.SQL(group), sql.Identifier(role)))


def register_agent(conn: psycopg.Connection[Any], role: str, department: str) -> None:
    """Make the login role `role` an agent of `department` (or move it to another department).
    Its sessions may not sit idle inside a transaction for long: one that did would hold the
    team's append lock (toolbus's own writes give up after `lock_timeout` meanwhile)."""
    if not department.strip():
        raise ValueError("--department: expected a department's name, got an empty one")
    with conn.transaction():
        found = conn.execute(
            f"SELECT {_UNBOUND} FROM pg_roles AS r, pg_class AS c WHERE r.rolname = %s AND c.oid = %s::regclass",
            (role, f"{SCHEMA}.commands"),
        ).fetchone()
        if found is None:
            raise LookupError(
                f"there is no role {role!r} on this server: create it first "
                f"(CREATE ROLE \"{role}\" LOGIN PASSWORD '...')"
            )
        if found[0]:
            raise ValueError(
                f"{role!r} owns the team journal or bypasses row-level security: as an agent it would "
                "write in any agent's name and read every note; give each agent a login role of its own"
            )
        conn.execute(
            f"INSERT INTO {SCHEMA}.agents (role, department) VALUES (%s, %s)"
            " ON CONFLICT (role) DO UPDATE SET department = excluded.department",
            (role, department),
        )
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(_own_group(conn)), sql.Identifier(role)))
        conn.execute(  # in this database only: the role may be an agent of other team journals
            sql.SQL("ALTER ROLE {} IN DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
                sql.Identifier(role), _this_database(conn), sql.Literal(f"{IDLE_IN_TRANSACTION_TIMEOUT}s")
            )
        )


def unregister_agent(conn: psycopg.Connection[Any], role: str) -> str:
    """Make `role` an agent no more: it keeps its login, and the journal keeps what it did, but it
    may not use the journal. Returns the department it was of; LookupError if it was none's."""
    with conn.transaction():
        removed = conn.execute(f"DELETE FROM {SCHEMA}.agents WHERE role = %s RETURNING department", (role,)).fetchone()
        if removed is None:
            raise LookupError(f"{role!r} is not an agent of this team journal")
        conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(_own_group(conn)), sql.Identifier(role)))
        conn.execute(
            sql.SQL("ALTER ROLE {} IN DATABASE {} RESET idle_in_transaction_session_timeout").format(
                sql.Identifier(role), _this_database(conn)
            )
        )
    return str(removed[0])


def _this_database(conn: psycopg.Connection[Any]) -> sql.Identifier:
    return sql.Identifier(conn.info.dbname)


def _own_group(conn: psycopg.Connection[Any]) -> str:
    """This database's agent group, which `journal init` of schema 4 made."""
    group = agent_group(conn)
    if not _role_exists(conn, group):
        raise LookupError(
            f"the team journal in database {conn.info.dbname!r} has no agent group of its own yet:"
            " run `toolbus journal init` on it again first"
        )
    return group


def keeps_pending(conn: psycopg.Connection[Any]) -> bool:
    """Whether the team journal has `commands.pending` (schema 2): until its admin runs
    `journal init` again, a journal of schema 1 works as before, without it."""
    row = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'pending' AND NOT attisdropped",
        (f"{SCHEMA}.commands",),
    ).fetchone()
    return row is not None


def newer_schema(location: str, version: int) -> str:
    """Why a journal a newer toolbus made is not used: its tables, functions and policies may
    differ in ways this one would get wrong, or (`journal init`) undo."""
    return (
        f"the team journal at {location} has schema version {version}, newer than this toolbus "
        f"understands ({SCHEMA_VERSION}): upgrade toolbus"
    )


def times_observations(conn: psycopg.Connection[Any]) -> bool:
    """Whether the team journal has `latest_observation_time()` (schema 3): until its admin runs
    `journal init` again, a journal of an older schema saves observations at their servers'
    clocks, as before."""
    row = conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (f"{SCHEMA}.latest_observation_time()",)).fetchone()
    return bool(row and row[0])


def schema_version(conn: psycopg.Connection[Any]) -> int | None:
    """The journal's schema version; None when the database holds no toolbus journal.
    PermissionError when it does but this login may not use it (not a registered agent)."""
    [(exists, usable)] = conn.execute(
        "SELECT to_regnamespace(%s) IS NOT NULL,"
        " CASE WHEN to_regnamespace(%s) IS NULL THEN false ELSE has_schema_privilege(%s, 'USAGE') END",
        (SCHEMA, SCHEMA, SCHEMA),
    ).fetchall()
    if not exists:
        return None
    if not usable:
        raise PermissionError("this login may not use the team journal")
    row = conn.execute(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None
