from __future__ import annotations

from pathlib import Path

import pytest

from clawmem.embeddings.base import normalize, pack
from clawmem.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "s.sqlite")
    yield s
    s.close()


def add(store: Store, id: str, text: str, path: str = "memory/a.md") -> int:
    return store.insert_chunk(id=id, path=path, source="memory", start_line=1, end_line=1, hash=id, text=text,
                              fts_text=text)


def test_schema_has_the_reference_tables(store: Store) -> None:
    names = {r[0] for r in store.execute("SELECT name FROM sqlite_master")}
    assert {"meta", "files", "chunks", "embedding_cache", "chunks_fts", "migrations"} <= names
    assert store.get_meta("schema_version") == "1"
    assert store.execute("PRAGMA journal_mode") == [("wal",)]


def test_migrations_run_once(tmp_path: Path) -> None:
    Store(tmp_path / "m.sqlite").close()
    again = Store(tmp_path / "m.sqlite")
    assert again.execute("SELECT count(*) FROM migrations") == [(1,)]
    again.close()


def test_a_failed_transaction_leaves_nothing_behind(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction():
        add(store, "x", "rolled back words")
        raise RuntimeError("boom")
    assert store.counts() == (0, 0)
    assert store.text_search('"rolled"', 5) == []


def test_nested_transactions_are_savepoints(store: Store) -> None:
    with store.transaction():
        add(store, "outer", "outer")
        with pytest.raises(ValueError), store.transaction():
            add(store, "inner", "inner")
            raise ValueError
    assert [r[0] for r in store.execute("SELECT id FROM chunks")] == ["outer"]


def test_deleting_chunks_removes_their_keyword_rows(store: Store) -> None:
    seq = add(store, "a", "ephemeral words")
    assert store.text_search('"ephemeral"', 5)
    store.delete_chunks([seq])
    assert store.text_search('"ephemeral"', 5) == []


def test_vectors_are_float32_blobs_searched_by_knn(store: Store) -> None:
    store.ensure_vector_table(3)
    for i, vec in enumerate(([1, 0, 0], [0, 1, 0], [0.7, 0.7, 0])):
        seq = add(store, f"v{i}", f"text {i}")
        store.store_vector(seq, pack(normalize(vec) or []), "m")
    hits = store.vector_search(pack(normalize([1, 0.1, 0]) or []), 2)
    assert [h.text for h in hits] == ["text 0", "text 2"]
    assert hits[0].distance < hits[1].distance
    assert store.execute("SELECT typeof(embedding) FROM chunks_vec LIMIT 1") == [("blob",)]


def test_without_sqlite_vec_vector_search_falls_back_to_a_scan(tmp_path: Path, monkeypatch) -> None:
    import clawmem.store as store_module

    monkeypatch.setattr(store_module, "_load_sqlite_vec", lambda conn: (False, "not available"))
    s = Store(tmp_path / "novec.sqlite")
    assert not s.vec_loaded
    s.ensure_vector_table(2)
    for i, vec in enumerate(([1, 0], [0, 1])):
        s.store_vector(add(s, f"v{i}", f"t{i}"), pack(normalize(vec) or []), "m")
    assert [h.text for h in s.vector_search(pack([0.0, 1.0]), 1)] == ["t1"]
    s.close()


def test_cache_is_pruned_oldest_used_first(store: Store) -> None:
    for i in range(10):
        store.cache_embedding("p", "m", "k", f"h{i}", pack([1.0]), 1)
    store.cached_embeddings("p", "m", "k", ["h0"])  # h0 used: now the newest
    assert store.prune_cache(4) == 6
    left = {r[0] for r in store.execute("SELECT hash FROM embedding_cache")}
    assert "h0" in left and len(left) == 4
