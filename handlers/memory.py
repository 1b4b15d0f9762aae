"""Memory command handlers: `save` emits an event; the queries read the memory store."""

from __future__ import annotations

import secrets
import time
from typing import Any

import msgspec

from bus import (
    GetObservations,
    HandlerContext,
    ObservationSaved,
    SaveObservation,
    SearchObservations,
    Timeline,
)
from handlers.ports import MemoryStore


class Saved(msgspec.Struct, frozen=True):
    success: bool
    id: int
    memory_session_id: str
    created_at_epoch: int


def memory_of(context: HandlerContext[Any]) -> MemoryStore:
    store: MemoryStore = context.services.memory
    return store


async def save(command: SaveObservation, context: HandlerContext[Any]) -> Saved:
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
    [position] = await context.commit(event)
    return Saved(success=True, id=position, memory_session_id=session_id, created_at_epoch=now_ms)


async def search(command: SearchObservations, context: HandlerContext[Any]) -> dict[str, Any]:
    return await memory_of(context).search(command, context.caller)


async def timeline(command: Timeline, context: HandlerContext[Any]) -> dict[str, Any]:
    return await memory_of(context).timeline(command, context.caller)


async def get_observations(command: GetObservations, context: HandlerContext[Any]) -> dict[str, Any]:
    return await memory_of(context).get_observations(command.ids, context.caller)
