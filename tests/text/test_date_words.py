from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import settings as hsettings

from clawmem_index.text.dates import ENGLISH, Lexicon, find_dates, without_dates
from tests.hostile import hostile_text

TODAY = dt.date(2026, 11, 28)  # a Saturday


def days(query: str, today: dt.date = TODAY) -> list[tuple[str, str, str]]:
    return [(m.text, m.first.isoformat(), m.last.isoformat()) for m in find_dates(query, today)]


@pytest.mark.parametrize(("query", "expected"), [
    ("what did we decide yesterday", [("yesterday", "2026-11-27", "2026-11-27")]),
    ("the day before yesterday", [("the day before yesterday", "2026-11-26", "2026-11-26")]),
    ("notes from today", [("today", "2026-11-28", "2026-11-28")]),
    ("the standup three days ago", [("three days ago", "2026-11-25", "2026-11-25")]),
    ("the standup 3 days ago", [("3 days ago", "2026-11-25", "2026-11-25")]),
    ("two weeks ago", [("two weeks ago", "2026-11-11", "2026-11-17")]),
    ("a month ago", [("a month ago", "2026-10-01", "2026-10-31")]),
    ("what did I do last Monday", [("last Monday", "2026-11-23", "2026-11-23")]),
    ("the call on Friday", [("on Friday", "2026-11-27", "2026-11-27")]),
    ("what is due next Tuesday", [("next Tuesday", "2026-12-01", "2026-12-01")]),
    ("last week's deploys", [("last week", "2026-11-16", "2026-11-22")]),
    ("this month", [("this month", "2026-11-01", "2026-11-30")]),
    ("last month", [("last month", "2026-10-01", "2026-10-31")]),
    ("last weekend", [("last weekend", "2026-11-21", "2026-11-22")]),
    ("the past 3 days", [("the past 3 days", "2026-11-25", "2026-11-28")]),
    ("what happened on March 3", [("March 3", "2026-03-03", "2026-03-03")]),
    ("what happened on March 3rd, 2025", [("March 3rd, 2025", "2025-03-03", "2025-03-03")]),
    ("3 March 2026 meeting", [("3 March 2026", "2026-03-03", "2026-03-03")]),
    ("the 2nd of January", [("2nd of January", "2026-01-02", "2026-01-02")]),
    ("Dec 5th", [("Dec 5th", "2026-12-05", "2026-12-05")]),  # the coming one: within a month
    ("notes from 2026-03-02", [("2026-03-02", "2026-03-02", "2026-03-02")]),
    ("in March 2023", [("in March 2023", "2023-03-01", "2023-03-31")]),
    ("camping in June", [("in June", "2026-06-01", "2026-06-30")]),
    ("travel in 2010", [("in 2010", "2010-01-01", "2010-12-31")]),
    ("classes in mid-August 2023", [("mid-August 2023", "2023-08-11", "2023-08-20")]),
    ("at the beginning of November", [("the beginning of November", "2026-11-01", "2026-11-10")]),
    ("the end of February 2024", [("the end of February 2024", "2024-02-21", "2024-02-29")]),
    ("early May", [("early May", "2026-05-01", "2026-05-10")]),
    ("the second week of November", [("the second week of November", "2026-11-08", "2026-11-14")]),
    ("the last week of August 2023", [("the last week of August 2023", "2023-08-25", "2023-08-31")]),
    ("the first weekend of August 2023", [("the first weekend of August 2023", "2023-08-05", "2023-08-06")]),
    ("the last weekend of October 2026", [("the last weekend of October 2026", "2026-10-31", "2026-11-01")]),
    ("the last two weeks of August 2023", [("the last two weeks of August 2023", "2023-08-18", "2023-08-31")]),
    ("the week before August 3, 2023", [("the week before August 3, 2023", "2023-07-27", "2023-08-02")]),
    ("the week before 16 November 2023", [("the week before 16 November 2023", "2023-11-09", "2023-11-15")]),
    ("a fortnight ago", [("a fortnight ago", "2026-11-11", "2026-11-17")]),  # as "two weeks ago"
    ("the budget over the last fortnight", [("last fortnight", "2026-11-14", "2026-11-27")]),
    ("what did we say on the 10th?", [("on the 10th", "2026-11-10", "2026-11-10")]),  # this month's
    ("the 3rd, when we met", [("the 3rd", "2026-11-03", "2026-11-03")]),
    ("on the 30th", [("on the 30th", "2026-10-30", "2026-10-30")]),  # November's has not come: October's
    ("the week of September 7", [("the week of September 7", "2026-09-07", "2026-09-13")]),  # a Monday: its week
    ("the week of September 9", [("the week of September 9", "2026-09-07", "2026-09-13")]),  # a Wednesday: in it
    ("the week of Sept 6, 2026", [("the week of Sept 6, 2026", "2026-09-06", "2026-09-12")]),  # a Sunday begins it
    ("week of 7 September", [("week of 7 September", "2026-09-07", "2026-09-13")]),
])
def test_dates_people_type_are_read_as_days(query: str, expected: list[tuple[str, str, str]]) -> None:
    assert days(query) == expected


@pytest.mark.parametrize("query", ["What may happen next", "March on", "try Cyberpunk 2077 game", "5K charity run",
                                   "a828e60 fixed it", "2026-13-45 is no day",
                                   "deploy 12 servers", "the 4th floor", "for the 3rd time", "the 2nd of them"])
def test_words_that_are_not_dates_stay_words(query: str) -> None:
    assert days(query) == []


def test_a_day_of_the_month_not_come_yet_is_the_last_month_that_has_it() -> None:
    assert days("on the 31st", dt.date(2026, 12, 5)) == [("on the 31st", "2026-10-31", "2026-10-31")]
    assert days("on the 5th", dt.date(2026, 12, 5)) == [("on the 5th", "2026-12-05", "2026-12-05")]


def test_a_day_that_does_not_exist_is_read_as_its_month() -> None:
    assert days("the 31st of February") == [("of February", "2026-02-01", "2026-02-28")]


def test_a_day_without_its_year_is_the_last_one_unless_it_comes_within_a_month() -> None:
    assert days("March 3", dt.date(2026, 3, 2)) == [("March 3", "2026-03-03", "2026-03-03")]
    assert days("December 20", dt.date(2026, 1, 5)) == [("December 20", "2025-12-20", "2025-12-20")]
    assert days("February 29", dt.date(2026, 3, 1)) == [("February 29", "2024-02-29", "2024-02-29")]


def test_the_date_words_are_taken_out_of_the_keywords() -> None:
    query = "what did Dana decide about staging yesterday"
    assert without_dates(query, find_dates(query, TODAY)) == "what did Dana decide about staging"
    assert without_dates("yesterday", find_dates("yesterday", TODAY)) == ""


def test_another_language_is_a_table_of_its_words() -> None:
    german = Lexicon(
        months={"märz": 3, "mai": 5}, weekdays={"montag": 0}, numbers={"drei": 3, "einem": 1},
        units={"tagen": "day", "tag": "day", "wochen": "week"}, days={"gestern": -1, "heute": 0},
        day_before_yesterday="vorgestern", ago="her", last=("letzten",), this=("diesen",), next=("nächsten",),
        past=("vergangenen",), weekend="wochenende", month_words=("im",), of="im", ordinal=r"\.",
    )
    assert [(m.text, m.first.isoformat()) for m in find_dates("was war gestern", TODAY, german)] == \
        [("gestern", "2026-11-27")]
    assert [(m.text, m.first.isoformat()) for m in find_dates("am 3. März", TODAY, german)] == \
        [("3. März", "2026-03-03")]
    assert find_dates("what happened yesterday", TODAY, german) == []  # its own words only
    assert find_dates("was war gestern", TODAY, ENGLISH) == []


@hsettings(max_examples=200, deadline=None)
@given(text=hostile_text())
def test_any_text_is_read_without_error_and_its_dates_lie_in_it(text: str) -> None:
    for mention in find_dates(text, TODAY):
        assert text[mention.span[0]:mention.span[1]].strip() == mention.text
        assert mention.first <= mention.last


def test_letters_that_only_match_without_case_and_days_out_of_range_are_no_dates() -> None:
    assert find_dates("notes from Frıday, ſunday, FRİDAY, tonıght", TODAY) == []
    assert [m.text for m in find_dates("yesterday and next week", dt.date(1, 1, 1))] == ["next week"]
    assert find_dates("tomorrow", dt.date(9999, 12, 31)) == []


def test_a_query_of_many_dates_reads_at_most_a_few_dozen_and_the_rest_stay_words() -> None:
    """Each reader scans the text once and reading stops at MAX_MENTIONS: a query of thousands of dates costs a
    scan of its text, not a check of each against every one already read."""
    from clawmem_index.text.dates import MAX_MENTIONS

    many = find_dates("yesterday and March 3, " * 2000, TODAY)
    assert len(many) == MAX_MENTIONS
    assert [m.span for m in many] == sorted(m.span for m in many)
    assert len(find_dates("yesterday " * 10, TODAY, limit=3)) == 3


def test_readings_that_overlap_one_already_taken_are_skipped_wherever_they_fall() -> None:
    """The overlap check (a bisect over the spans taken): a shorter reading inside, across or beside a longer one."""
    query = "the week before May 3 and on May 3 and 3 May 2025 and 2025-05-03 and in May and last Monday"
    assert days(query) == [("the week before May 3", "2026-04-26", "2026-05-02"), ("May 3", "2026-05-03", "2026-05-03"),
                           ("3 May 2025", "2025-05-03", "2025-05-03"), ("2025-05-03", "2025-05-03", "2025-05-03"),
                           ("in May", "2026-05-01", "2026-05-31"), ("last Monday", "2026-11-23", "2026-11-23")]
