"""One cron validator for both schedulers: Vertex AI Pipelines and KFP.

Both take the standard 5 fields, minute hour day-of-month month day-of-week, checked here before any request:
a bad cron must never reach a server (KFP even accepts 5 fields and reads them as seconds-first). The callers
differ only in what they allow on top: Vertex AI takes a `TZ=Area/City ` (or `CRON_TZ=`) prefix and 7 for
Sunday; KFP runs in the server's time zone and its cron library has no 7. KFP's 6-field seconds-first form is
made in pipelines/hosts/publish.py. A schedule whose days never come (`0 0 31 2 *`: no February has a 31st) is refused
too: both schedulers would take it and never run it.
"""

from __future__ import annotations

import dataclasses
import re

MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()  # allowed in place of numbers, counted from `low`


FIELDS = (Field("minute", 0, 59), Field("hour", 0, 23), Field("day of month", 1, 31), Field("month", 1, 12, MONTHS),
          Field("day of week", 0, 7, DAYS))
_ZONE_RE = re.compile(r"^(?:CRON_TZ|TZ)=(?P<zone>\S+)\s+(?P<rest>.*)$")
_PART_RE = re.compile(r"(\*|[0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?(?:/([0-9]+))?")


@dataclasses.dataclass(frozen=True)
class Cron:
    """A checked cron: as given (whitespace normalised), its time zone (None: the scheduler's), its 5 fields."""

    text: str
    zone: str | None
    fields: tuple[str, ...]


def parse_cron(cron: str, *, allow_zone: bool = True, sunday_is_7: bool = True) -> Cron:
    """Checks a standard 5-field cron; raises ValueError naming the field and what is wrong with it."""
    text = " ".join((cron or "").split())
    zone, body = None, text
    m = _ZONE_RE.match(text)
    if m:
        if not allow_zone:
            raise ValueError(f"Invalid cron {cron!r}: no time zone prefix here; this scheduler reads crons in its "
                             f"own time zone (UTC unless configured otherwise).")
        import zoneinfo

        zone, body = m.group("zone"), m.group("rest")
        try:
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"Unknown time zone {zone!r} in cron {cron!r}; use an IANA name such as "
                             f"TZ=America/New_York or TZ=Europe/Berlin.") from None
    fields = tuple(body.split())
    if len(fields) != 5:
        hint = " (6-field crons with seconds, and @daily-style macros, are not accepted)" if fields else ""
        raise ValueError(f"Invalid cron {cron!r}: give the 5 standard fields, minute hour day-of-month month "
                         f"day-of-week, e.g. '0 3 * * *' for daily at 03:00{hint}.")
    for value, field in zip(fields, FIELDS):
        high = field.high if sunday_is_7 or field.names is not DAYS else 6
        for part in value.split(","):
            problem = _part_problem(part, field, high)
            if problem:
                raise ValueError(f"Invalid cron {cron!r}: {field.name} field {value!r}: {problem}.")
    day_of_month, month, day_of_week = fields[2], fields[3], fields[4]
    # Where the day-of-week field is restricted too, the schedule runs on those weekdays as well (Vixie cron and
    # robfig/cron, which KFP uses, OR the two day fields), and every month has each weekday: it comes.
    if day_of_week == "*" and not _day_comes(_values(day_of_month, FIELDS[2]), _values(month, FIELDS[3])):
        raise ValueError(f"Invalid cron {cron!r}: day of month {day_of_month!r} never comes in month {month!r} "
                         f"(April, June, September and November have 30 days, February 29 at most), so the "
                         f"schedule would never run.")
    return Cron(text, zone, fields)


# The most days each month can have (February in a leap year).
MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _day_comes(days: set[int], months: set[int]) -> bool:
    return any(day <= MONTH_DAYS[month - 1] for day in days for month in months)


def _values(value: str, field: Field) -> set[int]:
    """The numbers a checked field matches."""
    found: set[int] = set()
    for part in value.split(","):
        m = _PART_RE.fullmatch(part)
        step = int(m[3] or 1)
        if m[1] == "*":
            low, high = field.low, field.high
        else:
            low, high = (field.names.index(t.upper()) + field.low if t.upper() in field.names else int(t)
                         for t in (m[1], m[2] or m[1]))
            if m[3] is not None and m[2] is None:  # N/step: from N to the field's end
                high = field.high
        found.update(range(low, high + 1, step))
    return found


def _part_problem(part: str, field: Field, high: int) -> str | None:
    m = _PART_RE.fullmatch(part)
    if not m:
        return f"cannot parse {part!r}"
    if m[3] is not None and int(m[3]) < 1:
        return "a step must be at least 1"
    if m[1] == "*":
        return f"'*' takes no range in {part!r}" if m[2] else None
    bounds = []
    for token in (m[1], m[2] or m[1]):
        if token.upper() in field.names:
            bounds.append(field.names.index(token.upper()) + field.low)
        elif token.isdigit():
            bounds.append(int(token))
        else:
            return f"{token!r} is not a number" + (f" or a name like {field.names[0]}" if field.names else "")
    if not field.low <= min(bounds) <= max(bounds) <= high:
        hint = " (use 0 for Sunday)" if field.names is DAYS and 7 in bounds and high == 6 else ""
        return f"{part!r} is outside {field.low}-{high}{hint}"
    if bounds[0] > bounds[1]:
        return f"the range {part!r} runs backwards"
    return None
