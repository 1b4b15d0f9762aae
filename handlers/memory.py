"""Memory command handlers: `save` emits an event; the queries interpret their arguments and
ask the memory store, which shows each caller only what it may see."""

from __future__ import annotations

import re
import secrets
import time
import typing
from typing import Any

import msgspec

from toolbus.bus import (
    Caller,
    GetObservations,
    HandlerContext,
    InvalidArguments,
    ObservationSaved,
    SaveObservation,
    SearchObservations,
    Timeline,
)
from toolbus.bus.commands import SQLITE_INT_MAX, SQLITE_INT_MIN, ObservationType, blank
from toolbus.bus.moments import DAY_MS, ISO_FORMS, epoch_ms, parse_iso
from toolbus.bus.queries import Observations, SearchPage, SearchQuery, TimelinePage, TimelineQuery
from toolbus.handlers.ports import MemoryStore

OBSERVATION_TYPES: tuple[str, ...] = typing.get_args(ObservationType)
_EPOCH_MS = re.compile(r"-?\d+", re.ASCII)  # never "１７００" (fullwidth) or other scripts' digits
# Eight digits are a date in ISO's basic form (20260101), not a moment in 1970's first hours.
_BASIC_DATE = re.compile(r"\d{8}", re.ASCII)
_DATE_FORMS = f"{ISO_FORMS} or epoch milliseconds"


class Saved(msgspec.Struct, frozen=True):
    success: bool
    id: int
    memory_session_id: str
    created_at_epoch: int


def memory_of(context: HandlerContext[Any]) -> MemoryStore:
    store: MemoryStore = context.services.memory
    return store


async def save(command: SaveObservation, context: HandlerContext[Any]) -> Saved:
    # The schema asks for non-empty strings; text that shows nothing is just as empty (a blank
    # agent or project would file the note where no caller looks).
    for field in ("title", "text", "project", "memory_session_id", "agent", "department"):
        value = getattr(command, field)
        if value is not None and blank(value):
            raise InvalidArguments(command.tool, f"{field}: expected a non-empty string, got only whitespace")
    _check_in_own_name(command, context.caller)
    # The journal may time it later, never earlier: after the latest observation it holds.
    now_ms = time.time_ns() // 1_000_000
    session_id = command.memory_session_id or f"mcp-{now_ms}-{secrets.token_hex(4)}"
    event = ObservationSaved(
        title=command.title,
        text=command.text,
        type=command.type,
        project=command.project,
        memory_session_id=session_id,
        facts=command.facts,
        concepts=command.concepts,
        agent=command.agent or context.caller.agent,
        department=command.department or context.caller.department,
        visibility=command.visibility,
        created_at_epoch=now_ms,
        extra=command.extra,
    )
    [(position, saved)] = await context.commit(event)
    return Saved(success=True, id=position, memory_session_id=session_id, created_at_epoch=saved.created_at_epoch)


def _check_in_own_name(command: SaveObservation, caller: Caller) -> None:
    """On a team journal a note is its login's: the database would refuse any other name."""
    if not caller.from_login:
        return
    chosen = (("agent", command.agent, caller.agent), ("department", command.department, caller.department))
    for field, given, own in chosen:
        if given is not None and given != own:
            raise InvalidArguments(
                command.tool, f"{field}: on a team journal notes are saved as the login's, {own!r}; got {given!r}"
            )


async def search(command: SearchObservations, context: HandlerContext[Any]) -> SearchPage:
    text = _words(command.query)
    query = SearchQuery(
        text=text,
        limit=command.limit,
        offset=command.offset,
        project=command.project,
        types=observation_types(command.tool, command.type),
        start_ms=date_ms(command.tool, "dateStart", command.dateStart, end_of_day=False),
        end_ms=date_ms(command.tool, "dateEnd", command.dateEnd, end_of_day=True),
        order_by=command.orderBy or ("relevance" if text else "date_desc"),
    )
    return await memory_of(context).search(query, context.caller)


async def timeline(command: Timeline, context: HandlerContext[Any]) -> TimelinePage:
    query = TimelineQuery(
        anchor=command.anchor,
        text=_words(command.query),
        depth_before=command.depth_before,
        depth_after=command.depth_after,
        project=command.project,
    )
    return await memory_of(context).timeline(query, context.caller)


async def get_observations(command: GetObservations, context: HandlerContext[Any]) -> Observations:
    return await memory_of(context).get_observations(command.ids, context.caller)


# --- interpreting query arguments ----------------------------------------------------


def _words(query: str | None) -> str | None:
    """A query as typed, or None when it shows nothing (then only the filters apply)."""
    return None if query is None or blank(query) else query


def observation_types(tool: str, value: str | None) -> tuple[str, ...]:
    """`"bugfix"` or `"bugfix, feature"` as a tuple of known types; empty means every type."""
    if value is None:
        return ()
    types = tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
    unknown = [name for name in types if name not in OBSERVATION_TYPES]
    if unknown:
        raise InvalidArguments(
            tool,
            f"type: expected one or a comma list of {', '.join(OBSERVATION_TYPES)}, got {value!r}",
        )
    return types


def date_ms(tool: str, field: str, value: str | int | None, *, end_of_day: bool) -> int | None:
    """An ISO date or date-time (UTC unless it says otherwise), or epoch milliseconds, as epoch ms.

    A bare date used as an end bound means the whole of that day.
    """
    if value is None or isinstance(value, int):
        return value
    text = value.strip()
    if _EPOCH_MS.fullmatch(text) and not _BASIC_DATE.fullmatch(text):
        return _epoch_ms_in_range(tool, field, int(text))
    try:
        moment = parse_iso(text)
    except ValueError:
        raise InvalidArguments(tool, f"{field}: expected {_DATE_FORMS}, got {value!r}") from None
    # In ms, not as a datetime: the day after 9999-12-31 is past what datetime holds.
    return epoch_ms(moment.at) + (DAY_MS - 1 if end_of_day and moment.whole_day else 0)


def _epoch_ms_in_range(tool: str, field: str, value: int) -> int:
    """Epoch ms as text gets the bound the integer form gets from its schema: SQLite's."""
    if not SQLITE_INT_MIN <= value <= SQLITE_INT_MAX:
        raise InvalidArguments(
            tool, f"{field}: expected epoch milliseconds from {SQLITE_INT_MIN} to {SQLITE_INT_MAX}, got {value}"
        )
    return value
