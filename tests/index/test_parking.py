"""Parked vectors (clawmem_index.index.parking): a switch of model renames the vectors it leaves behind aside, a
switch back takes them whole."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from clawmem_index.config import Settings, load_settings
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.index.store import Store
from clawmem_index.search.ranking import SearchRequest


def notes(write, n: int = 5) -> None:
    for i in range(n):
        write(f"memory/n{i}.md", f"# Note {i}\nfact number {i} about the greenhouse\n")


def with_precision(settings: Settings, precision: str) -> Settings:
    return dataclasses.replace(settings, embedding=dataclasses.replace(settings.embedding, precision=precision))


def switch_to(settings: Settings, provider: FakeProvider) -> MemoryIndex:
    index = MemoryIndex(settings, provider=provider)
    index.sync()
    return index


def vectors_by_hash(store: Store) -> dict[str, bytes]:
    return {str(h): bytes(blob) for h, blob in store.execute(
        "SELECT c.hash, v.embedding FROM chunks AS c JOIN chunks_vec AS v ON v.rowid = c.seq")}


def cached(store: Store, model: str) -> dict[str, bytes]:
    return {str(h): bytes(blob) for h, blob in store.execute(
        "SELECT hash, embedding FROM embedding_cache WHERE model = ?", (model,))}


def test_a_switch_back_takes_the_parked_table_back_without_copying_a_vector(settings: Settings, write) -> None:
    notes(write)
    first = switch_to(settings, FakeProvider(model="fake-a"))
    store = first.reader()
    mine = vectors_by_hash(store)
    hits = first.search(SearchRequest("greenhouse fact 3", mode="vector", min_score=0.0))["results"]
    first.close()
    other = switch_to(settings, FakeProvider(model="fake-b"))
    store = other.reader()
    assert store.execute("SELECT count(*) FROM parked_vectors") == [(5,)]  # renamed aside, not copied
    assert cached(store, "fake-a") == {} and store.pending_embeddings() == 0
    other.close()
    again = FakeProvider(model="fake-a")
    late = Store(settings.index_path, create=False)  # a batch job of fake-a's lands while it is parked
    with late.transaction():
        some = next(iter(mine))
        late.cache.cache_embeddings(again.info.provider, again.info.model, again.info.provider_key,
                                    [(some, mine[some])])
    late.close()
    back = switch_to(settings, again)
    store = back.reader()
    assert again.documents_embedded == 0
    assert vectors_by_hash(store) == mine and cached(store, "fake-a") == {}  # stored once: in the chunk
    assert store.execute("SELECT count(*) FROM parked_vectors") == [(5,)]  # fake-b's now
    assert store.meta.get("vector_owner") and "fake-a" in (store.meta.get("vector_owner") or "")
    assert back.search(SearchRequest("greenhouse fact 3", mode="vector", min_score=0.0))["results"] == hits
    assert back.status()["pending_embeddings"] == 0
    back.close()


def test_notes_edited_while_parked_get_new_vectors_and_their_old_ones_wait_in_the_cache(settings: Settings, write,
                                                                                         workspace: Path) -> None:
    notes(write)
    switch_to(settings, FakeProvider(model="fake-a")).close()
    old = vectors_by_hash(Store(settings.index_path, create=False))
    switch_to(settings, FakeProvider(model="fake-b")).close()
    write("memory/n3.md", "# Note 3\nthe greenhouse roof was replaced\n")
    (workspace / "memory" / "n4.md").unlink()
    write("memory/n5.md", "# Note 5\na new pump for the greenhouse\n")
    switch_to(settings, FakeProvider(model="fake-b")).close()  # the edits, under fake-b
    again = FakeProvider(model="fake-a")
    back = switch_to(settings, again)
    store = back.reader()
    assert again.documents_embedded == 2  # the edited and the new note; the other three taken back
    live = vectors_by_hash(store)
    assert len(live) == 5 and store.pending_embeddings() == 0
    kept = {h for h in old if h in live}
    assert len(kept) == 3 and all(live[h] == old[h] for h in kept)
    assert cached(store, "fake-a") == {h: v for h, v in old.items() if h not in live}  # n3's old text, n4's
    assert not set(cached(store, "fake-a")) & set(live)  # each vector stored once
    back.close()


def test_a_third_model_sends_the_parked_one_to_the_cache(settings: Settings, write) -> None:
    notes(write)
    switch_to(settings, FakeProvider(model="fake-a")).close()
    old = vectors_by_hash(Store(settings.index_path, create=False))
    switch_to(settings, FakeProvider(model="fake-b")).close()
    before = time.time()
    third = switch_to(settings, FakeProvider(model="fake-c"))
    store = third.reader()
    assert cached(store, "fake-a") == old and len(cached(store, "fake-b")) == 0
    ages = store.execute("SELECT max(updated_at) FROM embedding_cache WHERE model = 'fake-a'")[0][0]
    assert ages < before  # dated when they left the chunks (what pruning, oldest first, goes by)
    assert store.meta.get("parked_owner") and "fake-b" in (store.meta.get("parked_owner") or "")
    third.close()
    again = FakeProvider(model="fake-a")
    back = switch_to(settings, again)
    assert again.documents_embedded == 0 and vectors_by_hash(back.reader()) == old
    back.close()


def test_a_rebuild_carries_the_parked_vectors(settings: Settings, write) -> None:
    notes(write)
    switch_to(settings, FakeProvider(model="fake-a")).close()
    other = switch_to(settings, FakeProvider(model="fake-b"))
    other.reindex()
    assert cached(other.reader(), "fake-a") and other.reader().meta.get("parked_owner") is None
    other.close()
    again = FakeProvider(model="fake-a")
    switch_to(settings, again).close()
    assert again.documents_embedded == 0


def test_parked_vectors_count_against_the_cache_bound(workspace: Path, write, tmp_path: Path) -> None:
    notes(write, 8)
    settings = load_settings(workspace=workspace, overrides={"index": str(tmp_path / "i.sqlite"),
                                                             "embedding.provider": "none",
                                                             "embedding.cache_max_entries": 3})
    switch_to(settings, FakeProvider(model="fake-a")).close()
    other = switch_to(settings, FakeProvider(model="fake-b"))
    other.sync()  # an embedding pass prunes to the bound: 8 parked vectors are over it
    store = other.reader()
    assert store.meta.get("parked_owner") is None
    assert store.execute("SELECT count(*) FROM embedding_cache") == [(3,)]
    other.close()


@pytest.mark.parametrize(("first", "back"), [("float16", "float16"), ("float32", "float16"), ("float16", "float32")])
def test_a_parked_model_comes_back_at_the_precision_asked_for(settings: Settings, write, first: str,
                                                              back: str) -> None:
    """Its parked table is taken back when it was stored at that precision, else its vectors come
    through the cache; either way without the provider."""
    for i in range(6):
        write(f"memory/n{i}.md", f"# Note {i}\nthe greenhouse log entry {i}\n")
    a = FakeProvider(model="fake-a")
    MemoryIndex(with_precision(settings, first), provider=a).sync()
    MemoryIndex(with_precision(settings, first), provider=FakeProvider(model="fake-b")).sync()
    made = a.document_calls
    index = MemoryIndex(with_precision(settings, back), provider=a)
    report = index.sync()
    assert a.document_calls == made and report.from_cache == 6
    table = "chunks_vec_half" if back == "float16" else "chunks_vec"
    store = index.reader()
    assert {int(n) for (n,) in store.execute(f"SELECT DISTINCT length(embedding) FROM {table}")} == \
        {(2 if back == "float16" else 4) * 64}
    assert store.pending_embeddings() == 0 and store.execute("SELECT count(*) FROM embedding_cache") == [(0,)]
    found = index.search(SearchRequest("greenhouse log entry 4", mode="vector", max_results=1, min_score=0.0))
    assert [r["path"] for r in found["results"]] == ["memory/n4.md"]  # type: ignore[index]
    index.close()


def test_a_parked_index_past_cell_min_comes_back_in_cells_without_building_sign_bits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    import clawmem_index.index.vector_cells as vector_cells
    from clawmem_index.index.vector_index import VectorIndex

    monkeypatch.setattr(vector_cells, "CELL_MIN", 1000)
    store = Store(tmp_path / "s.sqlite")
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((1200, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.vectors.ensure(32)
    store.cache.set_vector_owner("p", "a", "k")
    with store.transaction():
        for i, vector in enumerate(vectors):
            seq = store.insert_chunk(id=f"v{i}", path="memory/a.md", source="memory", start_line=1, end_line=1,
                                     hash=f"h{i}", text=f"text {i}", fts_text=f"text {i}")
            store.embeddings.store_vector(seq, vector.tobytes(), "a")
    store.vectors.build_index()
    cells = store.vectors.method()
    with store.transaction():
        store.embeddings.reset_vectors(("p", "b", "k"))
    built: list[int] = []
    real = VectorIndex._build_bits
    monkeypatch.setattr(VectorIndex, "_build_bits", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    with store.transaction():
        store.embeddings.reset_vectors(("p", "a", "k"))
    assert store.vectors.method() == cells and "cells" in cells and built == []
    assert store.pending_embeddings() == 0
    assert store.vectors.search(vectors[17].tobytes(), 1)[0].seq == 18
    store.close()
