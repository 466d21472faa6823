"""Go's time.Format, for the UTC times of path postfix templates (see `path_postfix.py`).

A Go layout is text in which parts of the reference time, Mon Jan 2 15:04:05 MST 2006, stand
for the same parts of the formatted time: "2006-01-02" formats as "2019-11-19". Which runs of
characters are layout elements follows Go's own rules, some of them surprising: "Jan" is a
month unless a lower-case letter follows ("Janet" is literal), "_2006" is a literal "_" then a
year, ".000" is milliseconds but the zeros of ".0001" are literal (a digit follows them, so
only "01", the month, is an element). Every element is supported; times are
UTC, so zone elements print "UTC", "Z" or a zero offset.

Pure functions, no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

GO_ZERO_TIME: Final = datetime(1, 1, 1, tzinfo=UTC)  # Go's zero time.Time.
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class Std(enum.Enum):
    """Elements of a Go time layout (the reference time is Mon Jan 2 15:04:05 MST 2006)."""

    LONG_MONTH = "January"
    MONTH = "Jan"
    NUM_MONTH = "1"
    ZERO_MONTH = "01"
    LONG_WEEKDAY = "Monday"
    WEEKDAY = "Mon"
    DAY = "2"
    UNDER_DAY = "_2"
    ZERO_DAY = "02"
    UNDER_YEARDAY = "__2"
    ZERO_YEARDAY = "002"
    HOUR = "15"
    HOUR12 = "3"
    ZERO_HOUR12 = "03"
    MINUTE = "4"
    ZERO_MINUTE = "04"
    SECOND = "5"
    ZERO_SECOND = "05"
    LONG_YEAR = "2006"
    YEAR = "06"
    PM = "PM"
    LOWER_PM = "pm"
    TZ = "MST"
    ISO_TZ = "Z07:00"  # Any of Z070000 Z07:00:00 Z0700 Z07:00 Z07.
    NUM_TZ = "-07:00"  # Any of -070000 -07:00:00 -0700 -07:00 -07.


@dataclass(frozen=True, slots=True)
class Element:
    """One layout element: `std` as written (`text`), or fractional seconds (`std` None)
    with `digits` digits after `text`'s separator, zeros trimmed if `trim`."""

    std: Std | None
    text: str
    digits: int = 0
    trim: bool = False


LayoutChunk = str | Element

# Longest first, as Go matches them.
_TZ_FORMS: Final = ("070000", "07:00:00", "0700", "07:00", "07")
_ZERO_PREFIXED: Final = {
    "1": Std.ZERO_MONTH,
    "2": Std.ZERO_DAY,
    "3": Std.ZERO_HOUR12,
    "4": Std.ZERO_MINUTE,
    "5": Std.ZERO_SECOND,
    "6": Std.YEAR,
}


def _element_at(layout: str, i: int) -> Element | None:
    """The layout element starting at `i`, if any, by Go's rules (e.g. "Jan" is a month
    unless a lower-case letter follows, so "Janet" is literal; "_2006" is "_" then a year)."""
    rest = layout[i:]
    c = rest[0]
    lower_next = len(rest) > 3 and rest[3].islower() and rest[3].isascii()
    if c == "J" and rest.startswith("Jan"):
        if rest.startswith("January"):
            return Element(Std.LONG_MONTH, "January")
        return None if lower_next else Element(Std.MONTH, "Jan")
    if c == "M":
        if rest.startswith("Monday"):
            return Element(Std.LONG_WEEKDAY, "Monday")
        if rest.startswith("Mon") and not lower_next:
            return Element(Std.WEEKDAY, "Mon")
        return Element(Std.TZ, "MST") if rest.startswith("MST") else None
    if c == "0":
        if len(rest) >= 2 and rest[1] in _ZERO_PREFIXED:
            return Element(_ZERO_PREFIXED[rest[1]], rest[:2])
        return Element(Std.ZERO_YEARDAY, "002") if rest.startswith("002") else None
    if c == "1":
        return Element(Std.HOUR, "15") if rest.startswith("15") else Element(Std.NUM_MONTH, "1")
    if c == "2":
        return Element(Std.LONG_YEAR, "2006") if rest.startswith("2006") else Element(Std.DAY, "2")
    if c == "_":
        if rest.startswith("_2") and not rest.startswith("_2006"):
            return Element(Std.UNDER_DAY, "_2")
        return Element(Std.UNDER_YEARDAY, "__2") if rest.startswith("__2") else None
    simple = {"3": Std.HOUR12, "4": Std.MINUTE, "5": Std.SECOND}
    if c in simple:
        return Element(simple[c], c)
    if rest.startswith("PM"):
        return Element(Std.PM, "PM")
    if rest.startswith("pm"):
        return Element(Std.LOWER_PM, "pm")
    if c in "-Z":
        for form in _TZ_FORMS:
            if rest[1:].startswith(form):
                return Element(Std.NUM_TZ if c == "-" else Std.ISO_TZ, c + form)
        return None
    if c in ".," and len(rest) >= 2 and rest[1] in "09":
        run = len(rest) - 1 - len(rest[1:].lstrip(rest[1]))
        after = rest[1 + run : 2 + run]
        if not after.isdigit():  # A run of digits followed by more digits is literal.
            return Element(None, c, digits=run, trim=rest[1] == "9")
    return None


def parse_layout(layout: str) -> tuple[LayoutChunk, ...]:
    """A Go time layout as literal text and elements."""
    chunks: list[LayoutChunk] = []
    literal_start = i = 0
    while i < len(layout):
        element = _element_at(layout, i)
        if element is None:
            i += 1
            continue
        if literal_start < i:
            chunks.append(layout[literal_start:i])
        chunks.append(element)
        i += len(element.text) + element.digits
        literal_start = i
    if literal_start < len(layout):
        chunks.append(layout[literal_start:])
    return tuple(chunks)


def _format_element(t: datetime, e: Element) -> str:
    if e.std is None:
        nine = "%09d" % (t.microsecond * 1000)  # noqa: UP031 -- zero-padded nanoseconds.
        digits = nine[: min(e.digits, 9)]
        if e.trim:
            digits = digits.rstrip("0")
            if not digits:
                return ""
        return e.text + digits
    s = e.std
    hour12 = t.hour % 12 or 12
    yday = t.timetuple().tm_yday
    values: dict[Std, str] = {
        Std.LONG_MONTH: _MONTHS[t.month - 1],
        Std.MONTH: _MONTHS[t.month - 1][:3],
        Std.NUM_MONTH: str(t.month),
        Std.ZERO_MONTH: f"{t.month:02d}",
        Std.LONG_WEEKDAY: _WEEKDAYS[t.weekday()],
        Std.WEEKDAY: _WEEKDAYS[t.weekday()][:3],
        Std.DAY: str(t.day),
        Std.UNDER_DAY: f"{t.day:2d}",
        Std.ZERO_DAY: f"{t.day:02d}",
        Std.UNDER_YEARDAY: f"{yday:3d}",
        Std.ZERO_YEARDAY: f"{yday:03d}",
        Std.HOUR: f"{t.hour:02d}",
        Std.HOUR12: str(hour12),
        Std.ZERO_HOUR12: f"{hour12:02d}",
        Std.MINUTE: str(t.minute),
        Std.ZERO_MINUTE: f"{t.minute:02d}",
        Std.SECOND: str(t.second),
        Std.ZERO_SECOND: f"{t.second:02d}",
        Std.LONG_YEAR: f"{t.year:04d}",
        Std.YEAR: f"{t.year % 100:02d}",
        Std.PM: "PM" if t.hour >= 12 else "AM",
        Std.LOWER_PM: "pm" if t.hour >= 12 else "am",
        Std.TZ: "UTC",
        # Times are UTC: the ISO forms print "Z", the numeric ones a zero offset in their shape.
        Std.ISO_TZ: "Z",
        Std.NUM_TZ: "+" + "".join("0" if ch.isdigit() else ch for ch in e.text[1:]),
    }
    return values[s]


_MONTHS: Final = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_WEEKDAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def format_time(t: datetime, layout: tuple[LayoutChunk, ...] | str) -> str:
    """`t` (UTC) formatted as Go's time.Format(layout) formats it."""
    chunks = parse_layout(layout) if isinstance(layout, str) else layout
    return "".join(c if isinstance(c, str) else _format_element(t, c) for c in chunks)


def time_method(t: datetime, method: str, layout: tuple[LayoutChunk, ...]) -> str:
    if method == "Format":
        return format_time(t, layout)
    if method == "Unix":
        return str((t - _EPOCH) // timedelta(seconds=1))
    if method == "Month":
        return _MONTHS[t.month - 1]
    if method == "Weekday":
        return _WEEKDAYS[t.weekday()]
    numbers = {
        "Year": t.year,
        "YearDay": t.timetuple().tm_yday,
        "Day": t.day,
        "Hour": t.hour,
        "Minute": t.minute,
        "Second": t.second,
        "Nanosecond": t.microsecond * 1000,
    }
    return str(numbers[method])
