"""Memory queries and their answers: what the memory store is asked and what it returns.

Plain data shared by the handlers that ask and the store (in `journal/`) that answers.
"""

from __future__ import annotations

from typing import Any

import msgspec

from toolbus.bus.commands import OrderBy


class SearchQuery(msgspec.Struct, frozen=True, kw_only=True):
    """A search with its arguments interpreted: what the memory store runs."""

    text: str | None = None  # words and "phrases" as the user typed them; None: filters only
    limit: int = 20
    offset: int = 0
    project: str | None = None
    types: tuple[str, ...] = ()  # any of these; empty: every type
    start_ms: int | None = None  # created_at_epoch >= start_ms
    end_ms: int | None = None  # created_at_epoch <= end_ms
    order_by: OrderBy = "relevance"  # relevance without text means date_desc


class TimelineQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The observations around an anchor: an id, or the best hit of `text`."""

    anchor: int | None = None
    text: str | None = None
    depth_before: int = 3
    depth_after: int = 3
    project: str | None = None


class IndexRow(msgspec.Struct, frozen=True):
    """An observation as search and timeline list it: enough to choose, not the full text."""

    id: int
    title: str
    type: str
    project: str
    created_at_epoch: int
    agent: str
    visibility: str


class SearchPage(msgspec.Struct, frozen=True, kw_only=True):
    results: list[IndexRow]
    total: int  # every visible match, not just this page
    limit: int
    offset: int


class TimelinePage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    anchor: int | None  # None when no visible observation fits the anchor or query
    results: list[IndexRow]  # in time order, the anchor among them
    message: str | None = None


class Observations(msgspec.Struct, frozen=True, kw_only=True):
    observations: list[dict[str, Any]]  # full records, in the order asked
    missing: list[int]  # ids that do not exist or that the caller may not see
