"""The memory store on PostgreSQL: a projection of `ObservationSaved` events, written in the
transaction that appends the event, searched through a GIN index over a weighted tsvector."""

from __future__ import annotations

# Created by `journal.postgres.schema`, in the `toolbus` schema (connections set search_path).
MEMORY_TABLES: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS observations (
        id bigint PRIMARY KEY REFERENCES events (position),  -- its ObservationSaved event
        title text NOT NULL,
        text text NOT NULL,
        type text NOT NULL,
        project text NOT NULL,
        memory_session_id text NOT NULL,
        facts text NOT NULL,  -- JSON array of strings
        concepts text NOT NULL,  -- JSON array of strings
        agent text NOT NULL,
        department text NOT NULL,
        visibility text NOT NULL,  -- private | department | project | public
        created_at_epoch bigint NOT NULL,  -- milliseconds
        extra text NOT NULL,  -- JSON object: the fields the save schema does not name
        document tsvector NOT NULL  -- title weight A, facts and concepts B, text D
    )""",
    "CREATE INDEX IF NOT EXISTS observations_document ON observations USING gin (document)",
    "CREATE INDEX IF NOT EXISTS observations_by_time ON observations (created_at_epoch, id)",
    "CREATE INDEX IF NOT EXISTS observations_by_project ON observations (project, created_at_epoch, id)",
)
