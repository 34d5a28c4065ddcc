from __future__ import annotations

import datetime as dt

import pytest

from clawmem_index.config import Settings, with_overrides
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.errors import QueryError
from clawmem_index.search.date_prior import DatePrior
from clawmem_index.search.ranking import SearchRequest
from clawmem_index.text.dates import find_dates

NOW = "2026-11-25"  # a Wednesday


@pytest.fixture
def daily(settings: Settings, write) -> MemoryIndex:
    """Two weeks of daily notes that only their dates tell apart, and a MEMORY.md."""
    for day in range(10, 26):
        write(f"memory/2026-11-{day}.md", "# Standup\n\nWe talked about the deploy and the budget.\n")
    write("MEMORY.md", "# Memory\n\nThe budget owner is Dana.\n")
    index = MemoryIndex(settings, provider=FakeProvider(dims=64))
    index.sync()
    return index


@pytest.mark.parametrize(("query", "day"), [
    ("what did we say about the deploy yesterday", "2026-11-24"),
    ("the deploy three days ago", "2026-11-22"),
    ("budget last Monday", "2026-11-23"),  # the latest Monday before today
    ("the deploy on November 12", "2026-11-12"),
    ("deploy 2026-11-19", "2026-11-19"),
    ("yesterday", "2026-11-24"),
])
@pytest.mark.parametrize("mode", ["hybrid", "bm25", "vector"])
def test_the_note_of_the_day_a_query_names_comes_first(daily: MemoryIndex, query: str, day: str, mode: str) -> None:
    answer = daily.search(SearchRequest(query, mode=mode, now=NOW))
    assert answer["results"][0]["path"] == f"memory/{day}.md"
    assert [d["from"] for d in answer["query"]["dates"]] == [day]


def test_without_the_prior_the_same_notes_tie_and_the_date_is_words(daily: MemoryIndex, settings: Settings) -> None:
    off = MemoryIndex(with_overrides(settings, search={"date_weight": 0.0}), provider=FakeProvider(dims=64))
    answer = off.search(SearchRequest("the deploy on November 12", mode="bm25", now=NOW))
    assert answer["results"][0]["path"] != "memory/2026-11-12.md" and "query" not in answer
    off.close()


def test_a_strong_match_outside_the_days_still_wins(daily: MemoryIndex, write) -> None:
    answer = daily.search(SearchRequest("Dana the budget owner yesterday", mode="bm25", now=NOW))
    paths = [r["path"] for r in answer["results"]]
    assert paths[:2] == ["MEMORY.md", "memory/2026-11-24.md"], "a prior, not a filter"


def test_explain_gives_each_results_closeness_and_the_answer_says_what_was_read(daily: MemoryIndex) -> None:
    answer = daily.search(SearchRequest("deploy yesterday", mode="bm25", now=NOW, explain=True))
    assert answer["query"]["dates"] == [{"text": "yesterday", "from": "2026-11-24", "to": "2026-11-24"}]
    closeness = [r["explain"]["date_closeness"] for r in answer["results"]]
    assert closeness[0] == 1.0 and closeness[1] == pytest.approx(0.5 ** 0.5)
    assert closeness == sorted(closeness, reverse=True)


def test_relative_dates_count_from_today_without_now(daily: MemoryIndex, write) -> None:
    # A date is read only with a note near it (else it stays words): today's note, whatever today is.
    today = dt.date.today().isoformat()
    write(f"memory/{today}.md", "# Standup\n\nWe talked about the deploy.\n")
    daily.sync()
    answer = daily.search(SearchRequest("deploy today", mode="bm25"))
    assert answer["query"]["dates"][0]["from"] == today


def test_a_bad_now_is_a_query_error(daily: MemoryIndex) -> None:
    with pytest.raises(QueryError, match="'now' must be an ISO date"):
        daily.search(SearchRequest("deploy yesterday", now="next tuesday"))
    for edge in ("0001-01-01", "9999-12-31"):
        with pytest.raises(QueryError, match="'now' must be a date between 1900 and 2100"):
            daily.search(SearchRequest("deploy yesterday", now=edge))


def test_a_date_filter_and_a_named_day_combine(daily: MemoryIndex) -> None:
    answer = daily.search(SearchRequest("deploy yesterday", mode="bm25", now=NOW, since="2026-11-20",
                                        before="2026-11-24"))
    paths = [r["path"] for r in answer["results"]]
    assert paths[0] == "memory/2026-11-23.md" and all("2026-11-2" in p for p in paths)


def test_closeness_halves_every_half_life_and_stops_at_the_window() -> None:
    prior = DatePrior(tuple(find_dates("last week", dt.date(2026, 11, 25))), 0.3, 2.0, 7)
    assert prior.closeness("2026-11-18") == 1.0  # inside last week (the 16th to the 22nd)
    assert prior.closeness("2026-11-24") == pytest.approx(0.5)  # two days after it
    assert prior.closeness("2026-11-30") == 0.0 and prior.closeness(None) == 0.0 and prior.closeness("x") == 0.0


def test_the_window_of_days_is_read_as_a_list_nearest_first(daily: MemoryIndex) -> None:
    store = daily.reader()
    prior = DatePrior(tuple(find_dates("yesterday", dt.date(2026, 11, 25))), 0.3, 2.0, 2)
    (window, first, last), = prior.windows(store_filter())
    listed = [h.date for h in store.facts.dated_chunks(window, first, last, 10)]
    assert listed[0] == "2026-11-24" and set(listed) == {f"2026-11-{d}" for d in range(22, 26)}
    assert len(store.facts.dated_chunks(window, first, last, 2)) == 2
    assert all(h.text == "" for h in store.facts.dated_chunks(window, first, last, 10)), \
        "their text is read for answers"


def store_filter():  # type: ignore[no-untyped-def]
    from clawmem_index.index.filters import ChunkFilter

    return ChunkFilter()


def test_a_date_the_notes_have_nothing_near_stays_words(daily: MemoryIndex, write) -> None:
    write("memory/notes.md", "# Notes\n\nWe moved the office 4 years ago.\n")
    daily.sync()
    answer = daily.search(SearchRequest("moved 4 years ago", mode="bm25", now=NOW))
    assert "query" not in answer, "no note is dated near 2022: the words are matched as words"
    assert answer["results"][0]["path"] == "memory/notes.md"
    near = daily.search(SearchRequest("deploy 4 days ago", mode="bm25", now=NOW))
    assert near["query"]["dates"][0]["from"] == "2026-11-21"


def test_any_text_as_now_is_an_answer_or_a_query_error(daily: MemoryIndex) -> None:
    from tests.hostile import FIXED_TEXTS

    for text in FIXED_TEXTS.values():
        try:
            answer = daily.search(SearchRequest("deploy yesterday", mode="bm25", now=text))
        except QueryError as exc:
            assert "'now' must be" in str(exc) and "\n" not in str(exc).strip()
        else:
            assert answer["results"]


def test_a_long_bad_date_is_named_in_a_short_line(daily: MemoryIndex) -> None:
    for name in ("now", "since", "before"):
        with pytest.raises(QueryError) as caught:
            daily.search(SearchRequest("deploy", **{name: "x" * 100_000}))
        assert len(str(caught.value)) < 120 and str(caught.value).startswith(f"'{name}' must be an ISO date")


@pytest.mark.parametrize("cap", [4, 1024])
def test_the_first_k_do_not_depend_on_n_when_the_days_named_hold_more_than_a_read(settings: Settings, write,
                                                                                    cap: int) -> None:
    """A weekend (an even number of days) read nearest first: Sunday's note, written last, is inside the range and
    must come before Friday's, however few are read at once (a review found the middle day's distance ranking
    Friday's notes first, and the first result changed with max_results)."""
    for c in "abc":
        write(f"memory/2026-03-13-{c}.md", f"# fri {c}\nwork\n")
    write("memory/2026-03-14.md", "# sat\nhiking\n")
    write("memory/topics/t1.md", "deploy deploy\n")
    write("memory/topics/t2.md", "deploy w0 w1\n")
    index = MemoryIndex(with_overrides(settings, search={"candidate_cap": cap, "candidate_pool": 1}))
    index.sync()
    write("memory/2026-03-15.md", "deploy x0 x1\n")  # Sunday's note, written last
    index.sync()

    def first(n: int) -> list[tuple[str, float]]:
        found = index.search(SearchRequest("deploy this weekend", now="2026-03-15", max_results=n, mode="bm25"))
        return [(r["path"], r["score"]) for r in found["results"]]

    assert first(1) == first(3)[:1] == first(6)[:1]
    assert first(1)[0][0] == "memory/2026-03-15.md"
    index.close()


def test_a_query_is_read_as_its_first_pages_and_the_answer_says_so(daily: MemoryIndex) -> None:
    """A client may send a query of a megabyte: its beginning is read (dates, words, typos) and embedded, no more."""
    from clawmem_index.search.ranking import MAX_QUERY_CHARS

    filler = "the deploy " * (MAX_QUERY_CHARS // 11 + 10)
    long_answer = daily.search(SearchRequest(filler + "yesterday budget owner Dana", mode="bm25", now=NOW))
    assert long_answer["query"] == {"read_chars": MAX_QUERY_CHARS}  # the date past the cut is not read
    assert "MEMORY.md" not in [r["path"] for r in long_answer["results"]]  # nor the words
    short = daily.search(SearchRequest("the deploy yesterday", mode="bm25", now=NOW))
    assert "read_chars" not in short["query"]
