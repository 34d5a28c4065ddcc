"""Dates in a query: "yesterday", "a fortnight ago", "last Monday", "March 3", "on the 10th", "2026-03-02",
"the week of May 4", "in May 2023".

Each date found becomes a `DateMention`: the words that said it and the days it means (a day, or a
range such as a week or a month), resolved against `today` (the day the query is asked, or a `now`
the request carries). Search uses them as a prior toward notes dated near those days, and keyword
matching drops the words (a note dated March 3 rarely says "march" or "3").

The words of a language are a `Lexicon`; the patterns are built from it, so another language is a
table of its month and weekday names, number words and relative expressions (`LEXICONS`).
English first. A word that is also a month ("may", "march", "august") counts as a month only next to
a day or a year, or after "in", "during", "since", "until", "early", "late", "mid", "last" or "this".
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from functools import cached_property

from clawmem_index.text.keywords import STOPWORDS

__all__ = ["ENGLISH", "LEXICONS", "DateMention", "Lexicon", "find_dates", "may_name_a_date"]

NEXT_WITHIN_DAYS = 31  # a day named without its year is the coming one when at most this far ahead, else the last
# Dates read from one query at most: a search pulls toward a few ranges of days (query_plan.MAX_DATES), and a
# query of thousands of "yesterday"s must cost a scan of its text, not a date each (the rest stay words).
MAX_MENTIONS = 32


@dataclass(frozen=True)
class DateMention:
    """Words of a query that name a day or a range of days (`first` to `last`, both included)."""

    text: str
    first: dt.date
    last: dt.date
    span: tuple[int, int]  # where `text` is in the query

    def as_dict(self) -> dict[str, str]:
        return {"text": self.text, "from": self.first.isoformat(), "to": self.last.isoformat()}


@dataclass(frozen=True)
class Lexicon:
    """One language's words for dates (all lower case)."""

    months: dict[str, int]  # name or abbreviation -> 1..12
    weekdays: dict[str, int]  # name -> 0 (Monday) .. 6
    numbers: dict[str, int]  # number words, "a"/"an" -> 1
    units: dict[str, str]  # "days" -> "day", "weeks" -> "week", ...
    days: dict[str, int]  # single words meaning a day relative to today: "today" 0, "yesterday" -1
    day_before_yesterday: str  # a phrase meaning -2
    ago: str  # "three days ago"
    last: tuple[str, ...]  # "last week", "last Monday"
    this: tuple[str, ...]
    next: tuple[str, ...]
    past: tuple[str, ...]  # "the past 3 days", "the last 3 days"
    weekend: str
    month_words: tuple[str, ...]  # words before a month name that make it one ("in May")
    of: str  # "3rd of March"
    ordinal: str  # the suffixes of a day number ("3rd"): a regex
    parts: dict[str, tuple[int, int]] = field(default_factory=dict)  # "early" May: days 1 to 10 of it
    ordinals: dict[str, int] = field(default_factory=dict)  # "the second week of May": 2 ("last": -1)
    week: str = ""  # the word for a week, in "the first week of May", "the week before May 3"
    before: str = ""  # "the week before May 3"
    the: str = ""  # the article of "on the 10th" (a day of this month, or of the last when it has not come yet)
    # Words that may follow "the 10th" when it is a date ("on the 10th we met"), not an ordinal ("the 4th floor")
    function_words: frozenset[str] = field(default_factory=frozenset)

    @cached_property
    def words(self) -> frozenset[str]:
        """Every word this language writes a date with ("in" of "in May" too; not the words that may follow one)."""
        found: set[str] = set()
        for column in fields(self):
            if column.name not in ("ordinal", "function_words"):
                value = getattr(self, column.name)
                for item in value if isinstance(value, (dict, tuple)) else (value,):
                    found.update(str(item).split())
        return frozenset(found)


_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]
ENGLISH = Lexicon(
    months={**{m: i for i, m in enumerate(_MONTHS, start=1)},
            **{m[:3]: i for i, m in enumerate(_MONTHS, start=1) if m != "may"}, "sept": 9},
    weekdays={d: i for i, d in enumerate(["monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
                                          "sunday"])},
    numbers={"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
             "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a few": 3},
    units={"day": "day", "days": "day", "week": "week", "weeks": "week", "fortnight": "fortnight",
           "fortnights": "fortnight", "month": "month", "months": "month", "year": "year", "years": "year"},
    days={"today": 0, "tonight": 0, "yesterday": -1, "tomorrow": 1},
    day_before_yesterday="the day before yesterday",
    ago="ago",
    last=("last", "previous"),
    this=("this", "current"),
    next=("next", "coming"),
    past=("past", "last"),
    weekend="weekend",
    month_words=("in", "during", "since", "until", "early", "late", "mid", "last", "this", "of"),
    of="of",
    ordinal=r"(?:st|nd|rd|th)",
    parts={"early": (1, 10), "the beginning of": (1, 10), "the start of": (1, 10), "beginning of": (1, 10),
           "mid": (11, 20), "the middle of": (11, 20), "middle of": (11, 20), "late": (21, 31), "the end of": (21, 31),
           "end of": (21, 31)},
    ordinals={"first": 1, "second": 2, "third": 3, "fourth": 4, "last": -1},
    week="week",
    before="before",
    the="the",
    function_words=STOPWORDS,
)
LEXICONS = {"en": ENGLISH}


def may_name_a_date(word: str, lexicon: Lexicon = ENGLISH) -> bool:
    """Whether `word` (lower case) may be part of a date: one of the language's date words, or digits ("13", "3rd").
    A word that is neither cannot make a date of the words around it."""
    return word in lexicon.words or word[:1].isdigit()


def find_dates(query: str, today: dt.date, lexicon: Lexicon = ENGLISH,
               limit: int = MAX_MENTIONS) -> list[DateMention]:
    """The dates `query` names, in the order they appear (overlapping readings: the longest wins), at most
    `limit` of them: each reader scans the text once, and reading stops at the limit."""
    found: list[DateMention] = []
    starts: list[int] = []  # the spans taken so far, disjoint, in order: an overlap is one bisect away
    ends: list[int] = []
    for reader in _readers(lexicon):
        if len(found) >= limit:
            break
        for match in reader.pattern.finditer(query):
            span = match.span()
            at = bisect.bisect_left(starts, span[1])  # taken spans that start before this one ends: [:at]
            if at and ends[at - 1] > span[0]:
                continue
            try:
                days = reader.read(match, today)
            except (KeyError, OverflowError, ValueError):
                # KeyError: a letter the pattern matched without case that lower() does not map to the
                # lexicon's ("Frıday", "ſunday"); the others: a day out of the calendar's range
                continue
            if days is None:
                continue
            starts.insert(at, span[0])
            ends.insert(at, span[1])
            found.append(DateMention(match.group().strip(), days[0], days[1], span))
            if len(found) >= limit:
                break
    return sorted(found, key=lambda m: m.span)


def without_dates(query: str, mentions: list[DateMention]) -> str:
    """The query with the words of its dates taken out (they are matched as dates, not as keywords)."""
    out, at = [], 0
    for mention in sorted(mentions, key=lambda m: m.span):
        out.append(query[at:mention.span[0]])
        at = mention.span[1]
    out.append(query[at:])
    return " ".join(" ".join(out).split())


# -- the readers ------------------------------------------------------------------------------


Days = tuple[dt.date, dt.date]


@dataclass(frozen=True)
class _Reader:
    pattern: re.Pattern[str]
    read: Callable[[re.Match[str], dt.date], Days | None]


def _alternatives(words: Iterable[str]) -> str:
    """A regex alternation of `words`, longest first (a space matches any run of spaces)."""
    return "|".join(sorted((re.escape(w).replace(r"\ ", r"\s+") for w in words), key=len, reverse=True))


_READERS: dict[int, list[_Reader]] = {}


def _readers(lx: Lexicon) -> list[_Reader]:  # noqa: C901
    """The patterns of a lexicon, longest forms first (made once per lexicon)."""
    if id(lx) in _READERS:
        return _READERS[id(lx)]
    months, weekdays, numbers, units = (_alternatives(lx.months), _alternatives(lx.weekdays),
                                        _alternatives(lx.numbers), _alternatives(lx.units))
    day = rf"(?P<day>[0-3]?\d){lx.ordinal}?"
    year = r"(?P<year>(?:19|20)\d\d)"
    flags = re.IGNORECASE

    def month_of(m: re.Match[str]) -> int:
        return lx.months[m.group("month").lower()]

    def iso(m: re.Match[str], today: dt.date) -> Days | None:
        return _day(int(m.group("y")), int(m.group("m")), int(m.group("d")))

    def month_day(m: re.Match[str], today: dt.date) -> Days | None:
        d = int(m.group("day"))
        if m.group("year"):
            return _day(int(m.group("year")), month_of(m), d)
        return _nearest(today, month_of(m), d)

    def month_only(m: re.Match[str], today: dt.date) -> Days | None:
        name = m.group("month").lower()
        if not m.group("year") and not m.group("lead"):
            return None  # "may" alone is a verb
        month = lx.months[name]
        y = int(m.group("year")) if m.group("year") else (today.year if month <= today.month else today.year - 1)
        if m.group("lead") and m.group("lead").lower() in lx.last and not m.group("year"):
            y = today.year - 1 if month >= today.month else today.year
        return dt.date(y, month, 1), dt.date(y, month, calendar.monthrange(y, month)[1])

    def month_part(m: re.Match[str], today: dt.date) -> Days | None:
        """"early May", "mid-August 2023", "the end of October": a third of the month."""
        y, month = _month_year(lx.months[m.group("month").lower()], m.group("year"), today)
        low, high = lx.parts[" ".join(m.group("part").lower().split())]
        end = calendar.monthrange(y, month)[1]
        return dt.date(y, month, low), dt.date(y, month, min(high, end))

    def week_of(m: re.Match[str], today: dt.date) -> Days | None:
        """"the second week of May", "the last weekend of August 2023"."""
        y, month = _month_year(lx.months[m.group("month").lower()], m.group("year"), today)
        nth, end = lx.ordinals[m.group("nth").lower()], calendar.monthrange(y, month)[1]
        if m.group("unit").lower() == lx.weekend:
            saturdays = [d for d in range(1, end + 1) if dt.date(y, month, d).weekday() == 5]
            if nth > len(saturdays):
                return None
            saturday = dt.date(y, month, saturdays[nth - 1 if nth > 0 else -1])
            return saturday, saturday + dt.timedelta(days=1)
        if nth > 4:
            return None
        first = 1 + 7 * (nth - 1) if nth > 0 else end - 6
        return dt.date(y, month, first), dt.date(y, month, min(first + 6, end))

    def last_of(m: re.Match[str], today: dt.date) -> Days | None:
        """"the last two weeks of August 2023", "the last 3 days of May"."""
        y, month = _month_year(lx.months[m.group("month").lower()], m.group("year"), today)
        n, end = _count(m.group("n"), lx), calendar.monthrange(y, month)[1]
        if n is None:
            return None
        span = n * (7 if lx.units[m.group("unit").lower()] == "week" else 1)
        if lx.units[m.group("unit").lower()] not in ("week", "day") or span > end:
            return None
        return dt.date(y, month, end - span + 1), dt.date(y, month, end)

    def week_around(m: re.Match[str], today: dt.date) -> Days | None:
        """"the week before August 3, 2023": the seven days before that day; "the week of September 7": the
        week that day begins (a Monday, or a Sunday where weeks begin on Sundays) or falls in."""
        days = month_day(m, today)
        if days is None:
            return None
        if m.group("rel").lower() == lx.before:
            return days[0] - dt.timedelta(days=7), days[0] - dt.timedelta(days=1)
        start = days[0] - dt.timedelta(days=days[0].weekday() if days[0].weekday() < 6 else 0)
        return start, start + dt.timedelta(days=6)

    def day_of_month(m: re.Match[str], today: dt.date) -> Days | None:
        """"on the 10th": this month's, or the last month's that has one when this month's has not come yet."""
        d, (y, month) = int(m.group("day")), (today.year, today.month)
        if d > today.day:
            y, month = _shift_month(y, month, -1)
            if d > calendar.monthrange(y, month)[1]:  # "the 31st" on December 5: October's
                y, month = _shift_month(y, month, -1)
        return _day(y, month, d)

    def in_year(m: re.Match[str], today: dt.date) -> Days:
        y = int(m.group("year"))
        return dt.date(y, 1, 1), dt.date(y, 12, 31)

    def relative_day(m: re.Match[str], today: dt.date) -> Days:
        word = " ".join(m.group().lower().split())
        shift = -2 if word == lx.day_before_yesterday else lx.days[word]
        d = today + dt.timedelta(days=shift)
        return d, d

    def ago(m: re.Match[str], today: dt.date) -> Days | None:
        n = _count(m.group("n"), lx)
        unit = lx.units[m.group("unit").lower()]
        if n is None or n > 400:
            return None
        if unit == "fortnight":
            n, unit = 2 * n, "week"
        if unit == "day":
            d = today - dt.timedelta(days=n)
            return d, d
        if unit == "week":
            d = today - dt.timedelta(weeks=n)
            return d - dt.timedelta(days=3), d + dt.timedelta(days=3)
        if unit == "month":
            y, mo = _shift_month(today.year, today.month, -n)
            return dt.date(y, mo, 1), dt.date(y, mo, calendar.monthrange(y, mo)[1])
        return dt.date(today.year - n, 1, 1), dt.date(today.year - n, 12, 31)

    def past(m: re.Match[str], today: dt.date) -> Days | None:
        n = _count(m.group("n"), lx)
        unit = lx.units[m.group("unit").lower()]
        if n is None or n > 400:
            return None
        span = {"day": n, "week": 7 * n, "fortnight": 14 * n, "month": 30 * n, "year": 365 * n}[unit]
        return today - dt.timedelta(days=span), today

    def period(m: re.Match[str], today: dt.date) -> Days:
        which, unit = m.group("which").lower(), m.group("unit").lower()
        step = -1 if which in lx.last else (1 if which in lx.next else 0)
        monday = today - dt.timedelta(days=today.weekday()) + dt.timedelta(weeks=step)
        if unit == lx.weekend:
            return monday + dt.timedelta(days=5), monday + dt.timedelta(days=6)
        unit = lx.units[unit]
        if unit == "week":
            return monday, monday + dt.timedelta(days=6)
        if unit == "fortnight":  # the fourteen days before today, the seven either side, the fourteen after
            start = today + dt.timedelta(days=-14 if step < 0 else (-7 if step == 0 else 1))
            return start, start + dt.timedelta(days=13)
        if unit == "month":
            y, mo = _shift_month(today.year, today.month, step)
            return dt.date(y, mo, 1), dt.date(y, mo, calendar.monthrange(y, mo)[1])
        if unit == "year":
            return dt.date(today.year + step, 1, 1), dt.date(today.year + step, 12, 31)
        d = today + dt.timedelta(days=step)
        return d, d

    def weekday(m: re.Match[str], today: dt.date) -> Days:
        """"next Monday": the coming one; "this Monday": this week's; "last Monday": the latest before
        today; "Monday", "on Monday": the latest on or before today."""
        wanted = lx.weekdays[m.group("weekday").lower()]
        which = (m.group("which") or "").lower()
        if which in lx.next:
            d = today + dt.timedelta(days=(wanted - today.weekday()) % 7 or 7)
        elif which in lx.this:
            d = today - dt.timedelta(days=today.weekday()) + dt.timedelta(days=wanted)
        else:
            back = (today.weekday() - wanted) % 7
            d = today - dt.timedelta(days=back or (7 if which in lx.last else 0))
        return d, d

    numbers_or_digits = rf"(?P<n>\d{{1,3}}|{numbers})"
    lead = rf"(?:(?P<lead>{_alternatives(lx.month_words)})\s+)?"
    readers = []
    if lx.week and lx.before:  # longest forms first: they hold a date the readers below would take alone
        rel = rf"(?P<rel>{lx.before}|{lx.of})"
        readers.append(_Reader(re.compile(rf"\b(?:the\s+)?{lx.week}\s+{rel}\s+(?P<month>{months})\.?\s+{day}\b"
                                          rf"(?:,?\s+{year}\b)?", flags), week_around))
        readers.append(_Reader(re.compile(rf"\b(?:the\s+)?{lx.week}\s+{rel}\s+(?:the\s+)?{day}\s+(?:{lx.of}\s+)?"
                                          rf"(?P<month>{months})\b\.?(?:,?\s+{year}\b)?", flags), week_around))
    if lx.ordinals and lx.week:
        readers.append(_Reader(re.compile(rf"\b(?:the\s+)?(?:{_alternatives(lx.last)})\s+(?P<n>\d{{1,2}}|{numbers})\s+"
                                          rf"(?P<unit>{units})\s+{lx.of}\s+(?P<month>{months})\b(?:,?\s+{year}\b)?",
                                          flags), last_of))
        readers.append(_Reader(re.compile(rf"\b(?:the\s+)?(?P<nth>{_alternatives(lx.ordinals)})\s+"
                                          rf"(?P<unit>{lx.week}|{lx.weekend})\s+{lx.of}\s+(?P<month>{months})\b"
                                          rf"(?:,?\s+{year}\b)?", flags), week_of))
    if lx.parts:
        readers.append(_Reader(re.compile(rf"\b(?P<part>{_alternatives(lx.parts)})[\s-]+(?P<month>{months})\b"
                                          rf"(?:,?\s+{year}\b)?", flags), month_part))
    readers += [
        _Reader(re.compile(r"\b(?P<y>(?:19|20)\d\d)[-/.](?P<m>[01]?\d)[-/.](?P<d>[0-3]?\d)\b"), iso),
        _Reader(re.compile(rf"\b(?P<month>{months})\.?\s+{day}\b(?:,?\s+{year}\b)?", flags), month_day),
        _Reader(re.compile(rf"\b{day}\s+(?:{lx.of}\s+)?(?P<month>{months})\b\.?(?:,?\s+{year}\b)?", flags), month_day),
        *([_Reader(re.compile(rf"\b(?:on\s+)?{lx.the}\s+(?P<day>[0-3]?\d){lx.ordinal}\b(?!\s+{lx.of}\b)"
                              rf"(?=\s*(?:$|[^\w\s]|(?:{_alternatives(lx.function_words)})\b))", flags),
                   day_of_month)] if lx.the else []),
        _Reader(re.compile(rf"\b{_alternatives([lx.day_before_yesterday, *lx.days])}\b", flags), relative_day),
        _Reader(re.compile(rf"\b{numbers_or_digits}\s+(?P<unit>{units})\s+{lx.ago}\b", flags), ago),
        _Reader(re.compile(rf"\b(?:the\s+)?(?:{_alternatives(lx.past)})\s+{numbers_or_digits}\s+(?P<unit>{units})\b",
                           flags), past),
        _Reader(re.compile(rf"\b(?P<which>{_alternatives(lx.last + lx.this + lx.next)})\s+"
                           rf"(?P<unit>{units}|{lx.weekend})\b", flags), period),
        _Reader(re.compile(rf"\b(?:(?P<which>{_alternatives(lx.last + lx.this + lx.next)})\s+|on\s+)?"
                           rf"(?P<weekday>{weekdays})\b", flags), weekday),
        _Reader(re.compile(rf"\b{lead}(?P<month>{months})\b(?:,?\s+{year}\b)?", flags), month_only),
        _Reader(re.compile(rf"\b(?:in|during|of|since)\s+{year}\b", flags), in_year),
    ]
    _READERS[id(lx)] = readers
    return readers


def _day(y: int, m: int, d: int) -> Days | None:
    try:
        day = dt.date(y, m, d)
    except ValueError:
        return None
    return day, day


def _nearest(today: dt.date, month: int, d: int) -> Days | None:
    """A day named without its year: the coming one if at most NEXT_WITHIN_DAYS ahead, else the last one."""
    options = [day for y in range(today.year - 4, today.year + 2) if (day := _safe(y, month, d))]  # Feb 29: 4 back
    if not options:
        return None
    ahead = [o for o in options if today < o <= today + dt.timedelta(days=NEXT_WITHIN_DAYS)]
    past = [o for o in options if o <= today]
    chosen = ahead[0] if ahead else (past[-1] if past else options[0])
    return chosen, chosen


def _safe(y: int, m: int, d: int) -> dt.date | None:
    try:
        return dt.date(y, m, d)
    except ValueError:
        return None


def _month_year(month: int, year: str | None, today: dt.date) -> tuple[int, int]:
    """A month named with its year, or without: the last one (this year's when it has begun)."""
    if year:
        return int(year), month
    return (today.year if month <= today.month else today.year - 1), month


def _shift_month(y: int, m: int, step: int) -> tuple[int, int]:
    index = y * 12 + (m - 1) + step
    return index // 12, index % 12 + 1


def _count(word: str, lx: Lexicon) -> int | None:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else lx.numbers.get(word)
