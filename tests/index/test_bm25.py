"""A word's BM25 computed from FTS5's statistics must be, bit for bit, what FTS5's `bm25()` gives it.

The reference is FTS5 itself: the rows matching the quoted word and `bm25(chunks_fts)` of each, compared
with == after inserts, deletes, rowids used again, other connections' commits and another file put in place.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawmem_index.index import bm25
from clawmem_index.index.bm25 import TermScorer
from clawmem_index.index.store import Store
from clawmem_index.text.keywords import build_match

WORDS = ["staging", "stage", "stages", "deploy", "deploys", "rollback", "server", "alpha", "the", "café", "CAFE",
         "naïve", "数据"]


def put(store: Store, seq: int, text: str) -> None:
    store.keywords.add(seq, text, id=str(seq), path="memory/a.md", source="memory", model="", start_line=1,
                       end_line=1)


def reference(store: Store, word: str) -> tuple[list[int], list[float]]:
    rows = store.conn.execute("SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ?"
                              " ORDER BY rowid", ('"' + word + '"',)).fetchall()
    return [r[0] for r in rows], [-r[1] for r in rows]


def computed(scorer: TermScorer, word: str) -> tuple[list[int], list[float]]:
    assert scorer.refresh()
    token = scorer.term('"' + word + '"')
    assert token is not None
    seqs, gains = scorer.gains(token)
    return seqs.tolist(), gains.tolist()


def checked_scorer(store: Store, rows: int, word: str) -> TermScorer:
    """`rows` rows of "staging deploy", and a scorer that has scored `word` as FTS5 does."""
    for seq in range(1, rows + 1):
        put(store, seq, "staging deploy")
    scorer = TermScorer(store.conn)
    assert computed(scorer, word) == reference(store, word)
    return scorer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "b.sqlite")
    yield s
    s.close()


texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=40).map(" ".join)


@settings(max_examples=80, deadline=None)
@given(first=st.lists(texts, min_size=1, max_size=40), deleted=st.sets(st.integers(1, 40)),
       again=st.dictionaries(st.integers(1, 45), texts, max_size=10), together=st.booleans())
def test_every_word_scores_exactly_what_fts5_gives_it(first: list[str], deleted: set[int],
                                                      again: dict[int, str], together: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "p.sqlite")
        try:
            scorer = TermScorer(store.conn)
            for seq, text in enumerate(first, start=1):
                put(store, seq, text)
            for word in WORDS:
                assert computed(scorer, word) == reference(store, word)
            with store.transaction() if together else contextlib.nullcontext():  # one origin, or one each
                for seq in deleted:  # then rows removed, and some rowids used again with other text
                    store.keywords.remove(seq)
                for seq, text in again.items():
                    store.keywords.remove(seq)
                    put(store, seq, text)
            for word in WORDS:
                assert computed(scorer, word) == reference(store, word)
        finally:
            store.close()


def test_long_rows_token_counts_take_several_bytes(store: Store) -> None:
    """Counts from 128 (two-byte varints) and 16,384 tokens (three) are decoded as FTS5 wrote them."""
    for seq, words in enumerate((5, 127, 128, 300, 16383, 16384, 20000), start=1):
        put(store, seq, "staging " + "alpha " * (words - 1))
    assert computed(TermScorer(store.conn), "staging") == reference(store, "staging")
    assert len(set(reference(store, "staging")[1])) == 7


def test_counts_read_in_batches_miss_no_row(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bm25, "BATCH", 2)
    for seq in range(1, 8):
        put(store, seq, "staging " + "alpha " * seq)
    scorer = TermScorer(store.conn)
    assert computed(scorer, "staging") == reference(store, "staging")
    for seq in (3, 9, 10):  # a row stored again and new ones, read past the first batch
        store.keywords.remove(seq)
        put(store, seq, "staging deploy " * seq)
    assert computed(scorer, "staging") == reference(store, "staging")


def test_rows_another_connection_commits_are_read(store: Store, tmp_path: Path) -> None:
    scorer = checked_scorer(store, 5, "staging")
    other = Store(tmp_path / "b.sqlite")
    other.keywords.remove(5)
    put(other, 5, "staging staging staging rollback server alpha")
    put(other, 6, "staging")
    other.close()
    assert computed(scorer, "staging") == reference(store, "staging")


def test_a_commit_storing_no_tokens_reads_no_counts(store: Store) -> None:
    """A batch of vectors or a meta write commits without touching FTS5: no scan of every row's count."""
    scorer = checked_scorer(store, 5, "staging")
    statements: list[str] = []
    store.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
    store.meta.set("last_sync", "{}")
    assert computed(scorer, "staging") == reference(store, "staging")
    put(store, 6, "staging")
    assert computed(scorer, "staging") == reference(store, "staging")
    store.conn.exec_trace = None
    assert len([sql for sql in statements if "chunks_fts_docsize" in sql]) == 1  # for the row stored


def test_another_file_put_in_place_is_read_again(store: Store, tmp_path: Path) -> None:
    """A rebuild's swap copies a file whose rows carry the same rowids and origins, with other texts."""
    scorer = checked_scorer(store, 8, "deploy")
    fresh = Store(tmp_path / "fresh.sqlite")
    for seq in range(1, 9):
        put(fresh, seq, "deploy " + "alpha " * seq)
    live = Store(tmp_path / "b.sqlite")  # as SqliteBackend.swap_in copies it in
    with live.conn.backup("main", fresh.conn, "main") as backup:
        while not backup.done:
            backup.step(-1)
    live.close()
    fresh.close()
    assert computed(scorer, "deploy") == reference(store, "deploy")
    assert len(set(reference(store, "deploy")[1])) == 8  # the new lengths matter to the scores


def test_only_one_plain_token_is_scored(store: Store) -> None:
    scorer = TermScorer(store.conn)
    assert scorer.term('"Running"') == "run"
    assert scorer.term('"Café"') == "cafe"
    assert scorer.term('"say ""hi"""') is None  # two tokens: a phrase, FTS5 matches it by position
    assert scorer.term('"stag"*') is None
    assert scorer.term('"..."') is None
    assert scorer.term('"lone \ud800"') is None


def test_rowids_too_sparse_for_an_array_are_left_to_fts5(store: Store) -> None:
    put(store, 1, "staging")
    put(store, 10**12, "staging")
    assert not TermScorer(store.conn).refresh()
    store.keywords.search(build_match("staging") or "", 5)  # still answers


def test_the_scorer_tokenizes_as_the_table_does(store: Store) -> None:
    name, args = bm25.TOKENIZER
    sql = store.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'chunks_fts'").fetchone()[0]
    assert f"tokenize='{' '.join([name, *args])}'" in sql


def test_connections_share_counts_and_never_change_those_another_scores_with(store: Store, tmp_path: Path) -> None:
    """The second connection takes the counts the first read; the first, reading a change, copies them
    first, since the second may still score in a snapshot from before it (a rowid used again)."""
    for seq in range(1, 6):
        put(store, seq, "staging deploy")
    shared = bm25.SharedCounts()
    first, second = Store(tmp_path / "b.sqlite"), Store(tmp_path / "b.sqlite")
    ahead, behind = TermScorer(first.conn, shared), TermScorer(second.conn, shared)
    assert computed(ahead, "staging") == reference(first, "staging")
    statements: list[str] = []
    second.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
    second.conn.execute("BEGIN")  # a snapshot from before the change below
    assert computed(behind, "staging") == reference(second, "staging")
    assert not [sql for sql in statements if "chunks_fts_docsize" in sql]
    store.keywords.remove(3)
    put(store, 3, "staging " + "alpha " * 30)
    assert computed(ahead, "staging") == reference(first, "staging")
    assert computed(behind, "staging") == reference(second, "staging")
    second.conn.execute("COMMIT")
    assert computed(behind, "staging") == reference(second, "staging")
    assert not [sql for sql in statements if "chunks_fts_docsize" in sql]
    second.conn.exec_trace = None
    first.close()
    second.close()
