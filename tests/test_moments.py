"""One time grammar: an audit window and a memory tool's dates read the same text the same way."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from toolbus.adapters.cli_journal import parse_time
from toolbus.bus import InvalidArguments
from toolbus.bus.moments import epoch_ms
from toolbus.handlers.memory import date_ms

FORMS = [
    "2025-01-31",
    "20250131",  # ISO's basic form: a date, not epoch ms
    "2025-W05-5",
    "2025-01-31T09:30:00Z",
    "2025-01-31T09:30",
    "2025-01-31T11:30:00.250+02:00",
]


@pytest.mark.parametrize("text", FORMS)
def test_the_cli_and_the_memory_tools_read_a_time_alike(text: str) -> None:
    journal_time = datetime.fromisoformat(parse_time("--since", text).replace("Z", "+00:00"))
    assert epoch_ms(journal_time) == date_ms("search", "dateStart", text, end_of_day=False)


@pytest.mark.parametrize(
    "text", ["yesterday", "2025-13-01", "01/02/2025", "", "20261124ab", "2026W48299", "２０２６-11-24"]
)
def test_neither_accepts_what_the_other_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="expected an ISO time"):
        parse_time("--since", text)
    with pytest.raises(InvalidArguments, match="expected an ISO date"):
        date_ms("search", "dateStart", text, end_of_day=False)


def test_eight_digits_are_a_whole_day_as_a_bound() -> None:
    """ "20990101" was read as 20,990,101 ms after the epoch: a note of 1970 was after it."""
    for end_of_day in (False, True):
        assert date_ms("search", "dateEnd", "20990101", end_of_day=end_of_day) == date_ms(
            "search", "dateEnd", "2099-01-01", end_of_day=end_of_day
        )
    assert date_ms("search", "dateStart", "209901011", end_of_day=False) == 209_901_011  # nine: epoch ms


def test_a_time_ago_is_only_for_people_at_the_command_line() -> None:
    now = datetime(2026, 5, 1, 12, tzinfo=UTC)
    assert parse_time("--since", "90min", now) == "2026-05-01T10:30:00.000000Z"
    with pytest.raises(InvalidArguments):
        date_ms("search", "dateStart", "90min", end_of_day=False)


def test_a_year_before_1000_is_written_in_four_digits_so_times_sort_as_text() -> None:
    """`--until 0999-12-31` compared as text with 2026's journal times: `999-…` sorted after."""
    from toolbus.bus.moments import epoch_ns, iso_time

    early = iso_time(epoch_ns(datetime(999, 12, 31, tzinfo=UTC)))
    assert early == "0999-12-31T00:00:00.000000Z"
    assert early < iso_time(epoch_ns(datetime(2026, 11, 24, tzinfo=UTC)))


def test_a_compact_date_is_eight_digits_at_the_command_line() -> None:
    """(Digits alone are epoch milliseconds to the memory tools.) `2026112499` was read as the
    24th, the `99` ignored."""
    assert parse_time("--since", "20261124") == "2026-11-24T00:00:00.000000Z"
    with pytest.raises(ValueError, match="expected an ISO time"):
        parse_time("--since", "2026112499")
