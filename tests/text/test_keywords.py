from __future__ import annotations

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawmem_index.text.keywords import build_match, build_prefix_match, index_text, query_terms


@pytest.fixture(scope="module")
def fts() -> apsw.Connection:
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61 remove_diacritics 2')")
    for text in ("the deploy went out on friday", "我们决定使用 SQLite 作为索引", "日本語のメモを検索する",
                 "commit a828e60 fixed it"):
        conn.execute("INSERT INTO t(text) VALUES(?)", (index_text(text),))
    return conn


@settings(max_examples=400, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=200))
def test_no_user_text_can_break_the_fts5_query(fts: apsw.Connection, query: str) -> None:
    for match in (build_match(query), build_prefix_match(query)):
        if match is not None:
            fts.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank", (match,)).fetchall()


@pytest.mark.parametrize("query", ['"', "AND OR NOT", "NEAR(a b)", "col:value", "a*", "^start", "(((", "-x", "a + b",
                                   "'; DROP TABLE t; --", "\\", "{}", "text:foo", "*"])
def test_fts5_syntax_in_queries_is_taken_literally(fts: apsw.Connection, query: str) -> None:
    match = build_match(query)
    if match is not None:
        fts.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,)).fetchall()


def search(fts: apsw.Connection, query: str) -> list[int]:
    match = build_match(query)
    assert match is not None
    return [r[0] for r in fts.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank", (match,))]


def test_a_question_matching_only_some_words_still_finds_the_note(fts: apsw.Connection) -> None:
    assert search(fts, "What happened with the deploy last Friday?")[:1] == [1]


def test_stop_words_are_dropped_when_other_words_remain() -> None:
    assert query_terms("what is the deploy") == ["deploy"]
    assert query_terms("what is it") == ["what", "is", "it"]


def test_chinese_words_inside_sentences_are_found(fts: apsw.Connection) -> None:
    assert search(fts, "索引") == [2]
    assert search(fts, "使用什么") == [2]


def test_japanese_is_found(fts: apsw.Connection) -> None:
    assert search(fts, "メモ") == [3]


def test_exact_ids_are_found(fts: apsw.Connection) -> None:
    assert search(fts, "a828e60") == [4]


def test_index_text_leaves_latin_text_alone() -> None:
    assert index_text("plain text") == "plain text"
    assert index_text("记忆abc") == " 记 忆 abc"


@pytest.mark.parametrize("query, expected", [
    ("stagng", '"stag"*'),
    ("a828e60 deploy", '"a828e"* OR "depl"*'),
    ("the ab", None),  # "ab" is shorter than a prefix; "the" is a stop-word dropped beside it
    ("the", '"the"*'),
    ("記憶", None),
    ('quo"te', '"quo"*'),
])
def test_prefix_match_keeps_the_start_of_each_word(query: str, expected: str | None) -> None:
    assert build_prefix_match(query) == expected


def test_a_prefix_finds_the_word_a_typo_or_a_partial_id_begins(fts: apsw.Connection) -> None:
    def found(query: str) -> list[int]:
        match = build_prefix_match(query)
        assert match is not None
        return [row[0] for row in fts.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,))]

    assert found("deplyo") == [1]
    assert found("a828e") == [4]
    assert search(fts, "deplyo") == [] and search(fts, "a828e") == []


def test_quoted_words_are_one_phrase_matched_in_order(fts: apsw.Connection) -> None:
    assert query_terms('the "staging server" crashed') == ["staging server", "crashed"]
    assert query_terms("“blue whale” sightings") == ["blue whale", "sightings"]
    assert query_terms('what is "the one"') == ["the one"], "stop-words outside a phrase are dropped, inside kept"
    assert query_terms('"deploy" went') == ["deploy", "went"], "one quoted word is a word"
    assert query_terms('"unterminated phrase') == ["unterminated", "phrase"]
    assert search(fts, '"deploy went"') == [1]
    assert build_match('"went deploy"') is not None and search_or_none(fts, '"went deploy"') == []


def search_or_none(fts: apsw.Connection, query: str) -> list[int]:
    match = build_match(query)
    return [] if match is None else [r[0] for r in fts.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,))]
