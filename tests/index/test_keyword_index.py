"""Keyword search sums per-phrase scores kept between queries: it must answer exactly what FTS5 answers.

The reference is the plain FTS5 query, `ORDER BY bm25 LIMIT k` over the whole OR expression: the
same rows, the same bm25 values (compared with ==, not approximately) and the same order.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from clawmem_index.index import keyword_index
from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.store import Store
from clawmem_index.text.keywords import build_match, build_prefix_match, index_text
from tests.hostile import FIXED_TEXTS, hostile_text

WORDS = ["staging", "stage", "deploy", "deploys", "rollback", "server", "alpha", "beta", "gamma", "the", "café",
         "cafe", "数据", "库"]
PATHS = ["memory/a.md", "memory/b/c.md", "MEMORY.md", "sessions/x.jsonl"]
DATES = [None, "2024-01-01", "2024-06-15", "2025-02-28"]


def add(store: Store, seq: int | None, text: str, path: str = "memory/a.md", source: str = "memory",
        date: str | None = None) -> int:
    """A chunk with its FTS row (`seq` None: the next one; else that seq, to make sparse rowids)."""
    ident = f"c{store.counts()[1]}-{seq}"
    if seq is None:
        return store.insert_chunk(id=ident, path=path, source=source, start_line=1, end_line=1, hash=ident,
                                  text=text, fts_text=index_text(text), date=date)
    store.conn.execute("INSERT INTO chunks(seq, id, path, source, start_line, end_line, hash, text, date, updated_at)"
                       " VALUES(?, ?, ?, ?, 1, 1, ?, ?, ?, 0)", (seq, ident, path, source, ident, text, date))
    store.keywords.add(seq, index_text(text), id=ident, path=path, source=source, model="", start_line=1, end_line=1)
    return seq


def reference(store: Store, match: str, k: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
    """What FTS5 ranks on its own: (seq, bm25) best first."""
    join, condition, args = "", "1", {"match": match, "k": k}
    if where:
        join = " JOIN chunks AS w ON w.seq = chunks_fts.rowid"
        condition, extra = where.sql("w")
        args.update(extra)
    sql = (f"SELECT chunks_fts.rowid, bm25(chunks_fts) AS score FROM chunks_fts{join}"
           f" WHERE chunks_fts MATCH :match AND {condition} ORDER BY score LIMIT :k")
    return [(int(seq), float(score)) for seq, score in store.conn.execute(sql, args)]


def ranked(store: Store, match: str, k: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
    """What the store ranks, asked both ways (with the chunks' rows, and without: what a search reads)."""
    hits = [(hit.seq, hit.bm25) for hit in store.keywords.search(match, k, where)]
    assert store.keywords.ranking(match, k, where) == hits
    return hits


@contextmanager
def summing(cache: int = keyword_index.CACHE_POSTINGS,
            filter_depth: int = keyword_index.FILTER_DEPTH) -> Iterator[None]:
    """Every query takes the summing path, however few chunks it matches (small corpora would not)."""
    with mock.patch.object(keyword_index, "PLAIN_MAX", 0), \
            mock.patch.object(keyword_index, "CACHE_POSTINGS", cache), \
            mock.patch.object(keyword_index, "FILTER_DEPTH", filter_depth):
        yield


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "k.sqlite")
    yield s
    s.close()


docs = st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12), st.sampled_from(PATHS),
                          st.sampled_from(DATES)), min_size=1, max_size=60)
queries = st.lists(st.sampled_from(WORDS) | st.text(max_size=8), min_size=1, max_size=5).map(" ".join)
filters = st.none() | st.builds(ChunkFilter, st.sampled_from([None, "memory/", "memory/b", "M"]),
                                st.sampled_from([None, "memory", "sessions"]), st.sampled_from([None, "2024-03-01"]),
                                st.sampled_from([None, "2025-01-01"]))


@settings(max_examples=120, deadline=None)
@given(corpus=docs, query=queries, prefix=st.booleans(), k=st.integers(1, 40), where=filters, sparse=st.booleans(),
       cache=st.sampled_from([1, 8, 1 << 20]), filter_depth=st.sampled_from([1, 1 << 16]))
def test_search_and_scores_are_exactly_what_fts5_ranks(corpus: list[tuple[list[str], str, str | None]], query: str,
                                                      prefix: bool, k: int, where: ChunkFilter | None, sparse: bool,
                                                      cache: int, filter_depth: int) -> None:
    match = (build_prefix_match if prefix else build_match)(query)
    assume(match is not None)
    assert match is not None
    with tempfile.TemporaryDirectory() as tmp, summing(cache, filter_depth):
        store = Store(Path(tmp) / "p.sqlite")
        try:
            with store.transaction():
                for i, (words, path, date) in enumerate(corpus):
                    seq = (10**9 + 7 * i) if sparse and i % 2 else None  # seqs too far apart for a dense array
                    add(store, seq, " ".join(words), path, "sessions" if path.startswith("sessions") else "memory",
                        date)
            for depth in (k, 2 * k):  # a caller reads deeper with the same expression
                assert ranked(store, match, depth, where) == reference(store, match, depth, where)
            everything = dict(reference(store, match, len(corpus)))
            asked = [seq for seq, in store.conn.execute("SELECT seq FROM chunks")] + [-1, 5 * 10**9]
            assert store.keywords.scores_of(match, asked) == everything
            assert store.keywords._sums_exact  # the sums were used, not handed back to FTS5
        finally:
            store.close()


def test_kept_scores_answer_later_queries_without_fts5(store: Store) -> None:
    for i in range(40):
        add(store, None, ["staging deploy", "deploy rollback", "staging", "rollback server staging"][i % 4])
    statements: list[str] = []
    with summing():
        expected = reference(store, build_match("staging rollback deploy") or "", 10)
        store.keywords.search(build_match("staging deploy rollback") or "", 10)
        store.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
        assert ranked(store, build_match("staging rollback deploy") or "", 10) == expected
        store.conn.exec_trace = None
    assert not [sql for sql in statements if "chunks_fts" in sql]


def test_single_words_are_scored_from_fts5_statistics_not_row_by_row(store: Store) -> None:
    """bm25() costs ~0.8 µs a row read; clawmem_index.index.bm25 computes the same scores from bulk reads."""
    for i in range(40):
        add(store, None, ["staging deploy", "deploy rollback", "staging", "rollback server staging"][i % 4])
    statements: list[str] = []
    match = build_match("staging deploy rollback") or ""
    expected = reference(store, match, 10)
    with summing():
        store.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
        assert ranked(store, match, 10) == expected
        store.conn.exec_trace = None
    reads = [sql for sql in statements if "bm25(" in sql and "rowid = ?" not in sql]
    assert len([sql for sql in statements if "clawmem_fts_instances WHERE term" in sql]) == 3 and reads == []


@settings(max_examples=60, deadline=None)
@given(query=hostile_text() | st.sampled_from(sorted(FIXED_TEXTS.values())), prefix=st.booleans())
def test_hostile_queries_rank_as_fts5_does_when_scores_are_computed(query: str, prefix: bool) -> None:
    """Every word goes through FTS5's tokenizer in clawmem_index.index.bm25; the texts are indexed too."""
    match = (build_prefix_match if prefix else build_match)(query)
    assume(match is not None)
    assert match is not None
    with tempfile.TemporaryDirectory() as tmp, summing():
        store = Store(Path(tmp) / "h.sqlite")
        try:
            for text in [*FIXED_TEXTS.values(), query, query + " " + query]:
                add(store, None, text.encode("utf-8", "replace").decode("utf-8"))
            assert ranked(store, match, 10) == reference(store, match, 10)
        finally:
            store.close()


def test_match_counts_kept_between_writes_stay_bounded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyword_index, "COUNTS_KEPT", 4)
    add(store, None, "staging deploy")
    for i in range(20):
        store.keywords.search(build_match(f"word{i} other{i}") or "", 5)
        assert len(store.keywords._counts) <= 4


def test_each_change_of_the_keyword_index_is_confirmed_against_fts5_again(store: Store, tmp_path: Path) -> None:
    """FTS5 confirms the first answer after a change of its rows, not after a commit that left them alone."""
    for _ in range(5):
        add(store, None, "staging deploy")
    match = build_match("staging deploy") or ""
    checks: list[str] = []

    def trace(cursor, sql, bindings):  # type: ignore[no-untyped-def]
        if "rowid = ?" in sql and "bm25(" in sql:
            checks.append(sql)
        return True

    with summing():
        store.conn.exec_trace = trace
        ranked(store, match, 3)
        ranked(store, match, 3)
        assert len(checks) == keyword_index.CHECKED  # once, not at every query
        other = Store(tmp_path / "k.sqlite")
        other.meta.set("last_sync", "{}")  # a commit that leaves the keyword index as it was
        ranked(store, match, 3)
        assert len(checks) == keyword_index.CHECKED
        add(other, None, "staging staging")
        other.close()
        assert ranked(store, match, 3) == reference(store, match, 3)
        assert len(checks) == 2 * keyword_index.CHECKED
        store.conn.exec_trace = None


def test_a_commit_from_another_connection_is_seen(store: Store, tmp_path: Path) -> None:
    for _ in range(5):
        add(store, None, "staging deploy")
    match = build_match("staging deploy") or ""
    with summing():
        assert len(ranked(store, match, 10)) == 5
        other = Store(tmp_path / "k.sqlite")
        seq = add(other, None, "staging staging deploy deploy")
        other.close()
        top = ranked(store, match, 10)
    assert top == reference(store, match, 10) and top[0][0] == seq and len(top) == 6


def test_own_writes_and_rollbacks_are_seen(store: Store) -> None:
    for _ in range(5):
        add(store, None, "staging deploy")
    match = build_match("staging deploy") or ""
    with summing():
        before = ranked(store, match, 10)
        with pytest.raises(RuntimeError), store.transaction():
            seq = add(store, None, "staging staging deploy")
            inside = ranked(store, match, 10)
            assert inside[0][0] == seq and inside == reference(store, match, 10)
            raise RuntimeError("roll back")
        assert ranked(store, match, 10) == before == reference(store, match, 10)
        store.delete_chunks([before[0][0]])
        after = ranked(store, match, 10)
        assert after == reference(store, match, 10) and [seq for seq, _ in after] == [seq for seq, _ in before[1:]]


def test_ties_come_in_seq_order(store: Store) -> None:
    seqs = [add(store, None, "same words here") for _ in range(30)]
    with summing():
        assert [seq for seq, _ in ranked(store, build_match("same here") or "", 12)] == seqs[:12]


def test_expressions_other_than_an_or_of_phrases_go_to_fts5(store: Store) -> None:
    for text in ("staging deploy", "staging", "deploy rollback"):
        add(store, None, text)
    with summing():
        for match in ('"staging" AND "deploy"', "staging NOT deploy", '"staging" OR deploy',
                      'NEAR("staging" "deploy")'):
            assert ranked(store, match, 5) == reference(store, match, 5)


def test_a_sum_fts5_does_not_confirm_hands_ranking_back_to_fts5(store: Store) -> None:
    for i in range(20):
        add(store, None, ["staging deploy", "deploy", "staging rollback"][i % 3])
    match = build_match("staging deploy") or ""
    real = keyword_index.KeywordIndex._ranking

    def off_by_an_ulp(self: keyword_index.KeywordIndex, match: str, phrases: list[str]):  # type: ignore[no-untyped-def]
        seqs, gains = real(self, match, phrases)
        return seqs, gains * (1 + 2**-52)

    with summing(), mock.patch.object(keyword_index.KeywordIndex, "_ranking", off_by_an_ulp):
        assert ranked(store, match, 5) == reference(store, match, 5)
        assert store.keywords._phrases(match) is None  # FTS5 ranks every later query


def test_a_one_shot_index_lets_fts5_rank_and_the_daemons_keeps_scores(workspace: Path, tmp_path: Path) -> None:
    """A CLI command would read every match of each phrase and never reuse them: it asks FTS5 instead."""
    from clawmem_index.config import load_settings
    from clawmem_index.engine.core import MemoryIndex

    (workspace / "memory" / "a.md").write_text("# A\nstaging deploy rollback\n")
    chosen = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                           "embedding.provider": "none"}, environ={})
    MemoryIndex(chosen).sync()
    one_shot, daemon = MemoryIndex(chosen), MemoryIndex(chosen, long_lived=True)
    match = build_match("staging deploy") or ""
    with summing():
        for index, kept in ((one_shot, False), (daemon, True)):
            store = index.reader()
            assert store.keywords.ranking(match, 5) == reference(store, match, 5)
            assert (store.keywords._postings.held > 0) is kept
            index.close()


def reads_of_lists(store: Store) -> list[str]:
    """Trace the statements that read a phrase's matches (what kept scores spare); returns the list filled."""
    statements: list[str] = []

    def trace(cursor, sql, bindings):  # type: ignore[no-untyped-def]
        if "clawmem_fts_instances WHERE term" in sql or ("bm25(" in sql and "ORDER BY rowid" in sql):
            statements.append(sql)
        return True

    store.conn.exec_trace = trace
    return statements


def test_connections_sharing_kept_scores_read_each_list_once(tmp_path: Path) -> None:
    shared = keyword_index.PostingsCache()
    first, second = (Store(tmp_path / "k.sqlite", keyword_postings=shared) for _ in range(2))
    for i in range(30):
        add(first, None, ["staging deploy", "deploy rollback", "staging", "rollback server"][i % 4])
    match = build_match("staging rollback") or ""
    with summing():
        assert ranked(first, match, 10) == reference(first, match, 10)
        reads = reads_of_lists(second)
        assert ranked(second, match, 10) == reference(second, match, 10)
        assert reads == []
        add(first, None, "rollback rollback staging")  # another state: nothing kept for it yet
        assert ranked(second, match, 10) == reference(second, match, 10)
        assert len(reads) == 2
        add(first, None, "server staging")
        assert ranked(first, match, 10) == reference(first, match, 10)
        counts: list[str] = []
        second.conn.exec_trace = lambda cursor, sql, bindings: counts.append(sql) or True
        assert ranked(second, build_match("server") or "", 10) == reference(second, build_match("server") or "", 10)
        assert not [sql for sql in counts if "chunks_fts_docsize" in sql]  # the rows' token counts: shared too
    first.close()
    second.close()


def test_words_with_one_stem_share_their_kept_scores(store: Store) -> None:
    for i in range(20):
        add(store, None, ["the cells divide", "a cell wall", "walls"][i % 3])
    with summing():
        assert ranked(store, build_match("cells") or "", 10) == reference(store, build_match("cells") or "", 10)
        reads = reads_of_lists(store)
        assert ranked(store, build_match("cell walls") or "", 10) == \
            reference(store, build_match("cell walls") or "", 10)
        assert len(reads) == 1  # "walls" only: "cell" is the token "cells" was read as


def test_a_commit_leaving_the_keyword_index_as_it_was_keeps_the_scores(store: Store, tmp_path: Path) -> None:
    for i in range(20):
        add(store, None, ["staging deploy", "deploy"][i % 2])
    match = build_match("staging deploy") or ""
    with summing():
        ranked(store, match, 5)
        other = Store(tmp_path / "k.sqlite")
        other.meta.set("last_sync", "{}")  # as a batch of vectors does: the version changes, FTS5's rows do not
        other.close()
        reads = reads_of_lists(store)
        assert ranked(store, match, 5) == reference(store, match, 5)
        assert reads == []


def test_kept_scores_stay_within_their_budget(store: Store) -> None:
    shared = keyword_index.PostingsCache(budget=25)
    for i in range(20):
        add(store, None, f"common word{i % 5} other{i % 3}")
    reader = Store(store.path, keyword_postings=shared)
    with summing():
        for query in ("common", "word1", "other2", "word3 other1", "common other0"):
            assert ranked(reader, build_match(query) or "", 10) == reference(reader, build_match(query) or "", 10)
            assert shared.held <= 25 or len(shared._entries) == 1
    reader.close()


def test_a_list_asked_for_once_does_not_push_out_lists_asked_for_more_often(store: Store) -> None:
    """A round of queries whose lists outgrow the budget keeps some of them, instead of each pushing out the next."""
    shared = keyword_index.PostingsCache(budget=45)  # two lists of 20 fit, three do not
    for _ in range(20):
        add(store, None, "alpha beta gamma")
    reader = Store(store.path, keyword_postings=shared)
    alpha, beta, gamma = (build_match(word) or "" for word in ("alpha", "beta", "gamma"))
    with summing():
        for _ in range(3):
            for match in (alpha, beta):
                assert ranked(reader, match, 5) == reference(reader, match, 5)
        reads = reads_of_lists(reader)
        assert ranked(reader, gamma, 5) == reference(reader, gamma, 5)
        # what a hybrid search asks next: the list just read, not read again although not kept
        assert reader.keywords.scores_of(gamma, [1, 2]) == dict(reference(reader, gamma, 2))
        for match in (alpha, beta):
            assert ranked(reader, match, 5) == reference(reader, match, 5)
        assert len(reads) == 1  # gamma's alone: alpha and beta, asked for more often, were kept
        for _ in range(6):
            ranked(reader, gamma, 5)
        reads.clear()
        assert ranked(reader, gamma, 5) == reference(reader, gamma, 5)
        assert reads == []  # asked for most now: kept in place of the least recently used
        assert shared.held <= 45
    reader.close()


def test_the_counts_of_lists_asked_for_age_and_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyword_index, "ASKED_WINDOW", 8)
    cache = keyword_index.PostingsCache()
    for word in range(100):  # a long-lived daemon sees words without end
        cache.get(None, f"once{word}")
    assert len(cache._asked) <= 8


def test_threads_sharing_kept_scores_answer_as_fts5_does_after_each_write(tmp_path: Path) -> None:
    """Readers on threads of their own query the same words at once, between rounds of writes (rowids used again)."""
    import random
    import threading

    writer = Store(tmp_path / "k.sqlite")
    shared = keyword_index.PostingsCache(budget=64)  # small: lists are dropped and read again while others read
    readers = [Store(tmp_path / "k.sqlite", keyword_postings=shared) for _ in range(4)]
    rng = random.Random(5)
    matches = [build_match(" ".join(rng.sample(WORDS, 3))) or "" for _ in range(12)]
    wrong: list[str] = []

    def ask(store: Store, start: threading.Barrier) -> None:
        start.wait()
        for match in matches:
            if ranked(store, match, 8) != reference(store, match, 8):
                wrong.append(match)

    with summing():
        for _ in range(5):
            with writer.transaction():
                for seq in range(1, 40):
                    there = writer.conn.execute("SELECT 1 FROM chunks WHERE seq = ?", (seq,)).fetchone()
                    if there and rng.random() < 0.4:
                        writer.delete_chunks([seq])
                        there = None
                    if not there and rng.random() < 0.7:
                        add(writer, seq, " ".join(rng.choices(WORDS, k=rng.randint(1, 12))))
            start = threading.Barrier(len(readers))
            threads = [threading.Thread(target=ask, args=(store, start)) for store in readers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    assert wrong == []
    assert shared.held <= 64 or len(shared._entries) == 1
    for store in [writer, *readers]:
        store.close()
