"""The one time grammar: how a time given to toolbus (a memory tool's date, an audit window) is
read, and how the journal writes its timestamps."""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, date, datetime, timedelta
from typing import NamedTuple

ISO_FORMS = "an ISO date (2025-01-31) or date-time (2025-01-31T09:30:00Z)"
AGO_FORMS = "a time ago (30m, 2h, 7d)"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY_MS = 86_400_000
# The date forms date.fromisoformat takes: 2025-01-31, 20250131, 2025-W05(-5), 2025W05(5).
_DATE = re.compile(r"\d{4}(?:-\d{2}-\d{2}|\d{4}|-W\d{2}(?:-\d)?|W\d{2}\d?)", re.ASCII)

_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*(s|min|m|h|d|w)")
_UNIT_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


class Moment(NamedTuple):
    """A time as given: `at` (zone-aware), and whether the text named a whole day."""

    at: datetime
    whole_day: bool


def parse_iso(text: str) -> Moment:
    """An ISO date or date-time, UTC unless it says otherwise. ValueError if it is neither."""
    text = text.strip()
    if _DATE.fullmatch(text):  # date.fromisoformat reads `2026112499` as 2026-11-24, ignoring `99`
        return Moment(datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC), whole_day=True)
    moment = datetime.fromisoformat(text)
    return Moment(moment if moment.tzinfo else moment.replace(tzinfo=UTC), whole_day=False)


def parse_ago(text: str, now: datetime) -> datetime | None:
    """`30m`, `2h`, `7d` (also s, min, w) before `now`; None if `text` is not of that form."""
    if not (match := _AGO.fullmatch(text.strip())):
        return None
    return now - timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])


def epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch, exactly (float timestamps round)."""
    return (moment - EPOCH) // timedelta(milliseconds=1)


def epoch_ns(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1) * 1000


def iso_time(ns: int) -> str:
    """The journal's timestamp: UTC ISO 8601 with microseconds and a `Z`, which sorts
    correctly as text."""
    seconds, nanoseconds = divmod(ns, 1_000_000_000)
    return f"{_iso_seconds(seconds)}.{nanoseconds // 1000:06d}Z"


@functools.lru_cache(maxsize=256)
def _iso_seconds(seconds: int) -> str:
    # Calls within one second share this part: formatting it is most of iso_time's cost. The
    # year always in four digits (strftime's %Y gives 999), so that texts sort as times.
    at = time.gmtime(seconds)
    return f"{at.tm_year:04d}-{at.tm_mon:02d}-{at.tm_mday:02d}T{at.tm_hour:02d}:{at.tm_min:02d}:{at.tm_sec:02d}"
