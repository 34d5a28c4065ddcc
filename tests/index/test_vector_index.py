"""The vector index: half-precision vectors (`embedding.precision = "float16"`) stored in half the bytes and
ranked exactly; how many sign-bit candidates a search ranks for its width."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from test_vector_cells import clustered, exact, fill, near, ranked_as_stored

import clawmem_index.index.connection as connection
import clawmem_index.index.vector_cells as vector_cells
import clawmem_index.index.vector_index as vector_index
from clawmem_index.config import Settings
from clawmem_index.embeddings.fake import FakeProvider
from clawmem_index.engine.core import MemoryIndex
from clawmem_index.index.store import Store
from clawmem_index.search.ranking import SearchRequest


def halved(vectors: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    return {seq: vec.astype(np.float16).astype(np.float32) for seq, vec in vectors.items()}


@pytest.mark.parametrize(("cells", "loaded"), [(False, True), (True, True), (False, False), (True, False)])
def test_half_precision_stores_two_bytes_a_dimension_and_ranks_them_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cells: bool, loaded: bool) -> None:
    monkeypatch.setattr(vector_cells, "CELL_MIN", 1000 if cells else 10**9)
    monkeypatch.setattr(vector_cells, "PROBE_MIN_VECTORS", 0)
    monkeypatch.setattr(vector_index, "PREFIX_SCAN_ROWS", 0)  # a prefix goes through the candidates too
    if not loaded:
        monkeypatch.setattr(connection, "_load_sqlite_vec", lambda conn: (False, "not available"))
    store = Store(tmp_path / "s.sqlite")
    store.vectors.ensure(64, "float16")
    vectors = clustered(30, 100, 20)
    paths = [f"memory/{'ab'[i % 2]}/{i}.md" for i in range(2000)]
    stored = halved(dict(zip(fill(store, vectors, paths=paths), vectors, strict=True)))
    store.vectors.build_index()
    assert ("float16" in store.vectors.method()) == loaded
    assert ("cells" in store.vectors.method()) == (cells and loaded)
    assert store.execute("SELECT DISTINCT length(embedding) FROM chunks_vec_half") == [(2 * 64,)]
    inside = {seq: vec for (seq, vec), path in zip(stored.items(), paths, strict=True) if path.startswith("memory/b/")}
    assert ranked_as_stored(store, vectors, stored, inside) >= 0.95
    store.close()


def test_a_half_precision_table_gives_its_vectors_out_as_float32(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.vectors.ensure(64, "float16")
    vectors = clustered(31, 2, 3)
    seqs = fill(store, vectors)
    with store.transaction():
        store.cache.set_vector_owner("fake", "m", "k")
    hashes = [f"v{i}" for i in range(len(seqs))]
    given = store.cache.cached_embeddings("fake", "m", "k", hashes)
    for i, h in enumerate(hashes):
        assert np.frombuffer(given[h], dtype="<f4").tolist() == \
            vectors[i].astype(np.float16).astype(np.float32).tolist()
    with store.transaction():
        store.embeddings.reset_vectors()  # a model switch moves the chunks' vectors into the cache
    cached = store.execute("SELECT hash, embedding, dims FROM embedding_cache ORDER BY hash")
    assert {(h, len(blob), dims) for h, blob, dims in cached} == {(h, 4 * 64, 64) for h in hashes}
    assert store.execute("SELECT name FROM sqlite_master WHERE name LIKE 'chunks_vec%'") == []  # the next one chooses
    store.close()


def test_an_existing_table_keeps_its_precision_until_its_vectors_go(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    store.vectors.ensure(8, "float32")
    store.vectors.ensure(8, "float16")
    fill(store, clustered(32, 1, 2, dims=8))
    assert store.execute("SELECT DISTINCT length(embedding) FROM chunks_vec") == [(32,)]
    with pytest.raises(ValueError, match="precision"):
        Store(tmp_path / "t.sqlite").vectors.ensure(8, "int4")
    store.close()


def with_precision(settings: Settings, precision: str) -> Settings:
    return dataclasses.replace(settings, embedding=dataclasses.replace(settings.embedding, precision=precision))


def test_changing_the_precision_re_stores_every_vector_from_the_cache_without_the_provider(
        settings: Settings, write) -> None:
    for i in range(30):
        write(f"memory/n{i}.md", f"# Note {i}\nthe greenhouse log entry {i}, sensor {i * 7}\n")
    write("memory/orchids.md", "# Orchids\nthe orchids bloomed in the north bed\n")
    provider = FakeProvider()
    MemoryIndex(settings, provider=provider).sync()
    made = provider.document_calls
    query = SearchRequest("the orchids bloomed in the north bed", mode="vector", max_results=3, min_score=0.0)

    def stored_bytes(index: MemoryIndex) -> set[int]:
        table = "chunks_vec_half" if index.settings.embedding.precision == "float16" else "chunks_vec"
        return {int(n) for (n,) in index.reader().execute(f"SELECT DISTINCT length(embedding) FROM {table}")}

    for precision, width in (("float16", 2), ("float32", 4)):
        index = MemoryIndex(with_precision(settings, precision), provider=provider)
        index.sync()
        assert provider.document_calls == made  # every vector came from the index itself
        assert stored_bytes(index) == {width * 64}
        assert index.reader().pending_embeddings() == 0
        assert [r["path"] for r in index.search(query)["results"]][0] == "memory/orchids.md"  # type: ignore[index]
        assert ("float16" in str(index.status()["vector_search"])) == (precision == "float16")
        index.close()
    half = MemoryIndex(with_precision(settings, "float16"), provider=provider)
    half.sync()
    half.reindex()  # a rebuild copies a half-precision index's vectors as float32 into the new file's cache
    assert provider.document_calls == made and stored_bytes(half) == {2 * 64}
    half.close()


def test_an_older_clawmem_sees_no_float16_vectors_and_what_it_leaves_is_read_right(tmp_path: Path) -> None:
    """float16 vectors live in their own table: a version that knows only float32 finds no vectors
    there (it embeds again) rather than reading two bytes as four; the float32 table it then makes
    is the live one, and the half table it left beside it goes at the next write."""
    store = Store(tmp_path / "s.sqlite")
    store.vectors.ensure(8, "float16")
    vectors = clustered(33, 2, 3, dims=8)
    seqs = fill(store, vectors)
    assert store.execute("SELECT name FROM sqlite_master WHERE name = 'chunks_vec'") == []  # what older versions read
    with store.transaction():  # an older version's switch: its own float32 table, the half one left alone
        store.execute("CREATE TABLE chunks_vec(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")
        for seq, vec in zip(seqs, vectors, strict=True):
            store.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", (seq, vec.tobytes()))
    assert store.vectors.search(vectors[0].tobytes(), 1)[0].distance == pytest.approx(0.0, abs=1e-6)  # read as float32
    with store.transaction():
        store.vectors.ensure(8, "float16")
    assert store.execute("SELECT name FROM sqlite_master WHERE name IN ('chunks_vec', 'chunks_vec_half')") == [
        ("chunks_vec",)]
    store.close()


def test_wider_vectors_rank_fewer_sign_bit_candidates() -> None:
    """One bit a dimension: the estimate's error falls as 1/sqrt(bits), and so does the share needed."""
    share = vector_index.OVERSAMPLE
    assert vector_index.candidate_count(32, 384) == 32 * share
    assert vector_index.candidate_count(32, 1536) == 32 * share // 2
    assert vector_index.candidate_count(1, 1536) == vector_index.MIN_CANDIDATES // 2
    assert vector_index.candidate_count(32, 64) == 32 * share  # never more than at 384-d


@pytest.mark.parametrize("cells", [False, True])
def test_a_search_of_wide_vectors_ranks_its_share_of_candidates_and_finds_the_nearest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cells: bool) -> None:
    monkeypatch.setattr(vector_cells, "CELL_MIN", 1000 if cells else 10**9)
    monkeypatch.setattr(vector_cells, "PROBE_MIN_VECTORS", 0)
    store = Store(tmp_path / "s.sqlite")
    rng = np.random.default_rng(31)
    centres = np.repeat(rng.standard_normal((60, 1536)), 40, axis=0)  # noise of the norm clustered() gives at 64-d
    vectors = centres / np.linalg.norm(centres, axis=1, keepdims=True) + 0.08 * 8 / np.sqrt(1536) * \
        rng.standard_normal(centres.shape)
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    stored = dict(zip(fill(store, vectors), vectors, strict=True))
    store.vectors.build_index()
    assert ("cells" in store.vectors.method()) == cells
    asked: list[int] = []
    real = vector_index.VectorIndex._candidates

    def counted(self: vector_index.VectorIndex, query_blob: bytes, want: int, partitions: int) -> list[int] | None:
        asked.append(want)
        return real(self, query_blob, want, partitions)

    monkeypatch.setattr(vector_index.VectorIndex, "_candidates", counted)
    found = 0
    for i in range(0, len(vectors), len(vectors) // 10):
        query = near(vectors[i], i, noise=0.05 * 8 / np.sqrt(1536))
        found += len({h.seq for h in store.vectors.search(query.tobytes(), 10)} & set(exact(stored, query, 10)))
    assert set(asked) == {vector_index.candidate_count(10, 1536)} == {vector_index.MIN_CANDIDATES // 2}
    assert found >= 95
    store.close()


@pytest.mark.parametrize(("precision", "dims"), [("float32", 24), ("float16", 24), ("float32", 13)])
def test_a_batch_of_vectors_is_stored_by_a_few_statements_not_one_a_vector(tmp_path: Path, precision: str,
                                                                           dims: int) -> None:
    """Each statement gives up the GIL and takes it back: behind a busy thread, one a vector stalls a backfill."""
    store = Store(tmp_path / "s.sqlite")
    store.vectors.ensure(dims, precision)
    vectors = np.random.default_rng(dims).standard_normal((200, dims)).astype(np.float32)
    with store.transaction():
        items = [(store.insert_chunk(id=f"v{i}", path="memory/a.md", source="memory", start_line=1, end_line=1,
                                     hash=f"v{i}", text=f"text {i}", fts_text=f"text {i}"), f"v{i}", vec.tobytes())
                 for i, vec in enumerate(vectors)]
    statements: list[str] = []

    def traced(cursor: object, sql: str, bindings: object) -> bool:
        statements.append(sql)
        return True

    store.conn.exec_trace = traced
    with store.transaction():
        assert len(store.embeddings.store_vectors(items, "m")) == 200
    store.conn.exec_trace = None
    assert len(statements) <= 12, statements
    stored = {seq: np.frombuffer(store.vectors.float32(bytes(blob)), dtype="<f4") for seq, blob in store.execute(
        f"SELECT rowid, embedding FROM {store.vectors.table()}")}
    expected = vectors.astype(np.float16).astype(np.float32) if precision == "float16" else vectors
    assert [stored[seq].tolist() for seq, _, _ in items] == expected.tolist()
    assert store.execute("SELECT count(*) FROM chunks WHERE embedded = 1 AND model = 'm'")[0][0] == 200
    query = vectors[7] / np.linalg.norm(vectors[7])
    assert store.vectors.search(query.astype(np.float32).tobytes(), 1)[0].seq == items[7][0]  # sign bits stored too


@pytest.mark.parametrize("dims", [13, 16])
def test_sign_bits_built_in_one_pass_are_those_stored_with_each_batch(tmp_path: Path, dims: int) -> None:
    """`_build_bits` (a table made again, or a writer without sqlite-vec caught up) pads as `put` does."""
    store = Store(tmp_path / "s.sqlite")
    rng = np.random.default_rng(dims)
    store.vectors.ensure(dims)
    with store.transaction():
        for i, vector in enumerate(rng.standard_normal((40, dims)).astype(np.float32)):
            seq = store.insert_chunk(id=f"v{i}", path="memory/a.md", source="memory", start_line=1, end_line=1,
                                     hash=f"h{i}", text=f"text {i}", fts_text=f"text {i}")
            store.embeddings.store_vector(seq, (vector / np.linalg.norm(vector)).tobytes(), "m")
    stored = store.execute("SELECT rowid, part, embedding FROM chunks_vec_bits ORDER BY rowid")
    with store.transaction():
        store.vectors._build_bits(dims, replace=True)
    assert store.execute("SELECT rowid, part, embedding FROM chunks_vec_bits ORDER BY rowid") == stored
    assert len(stored) == 40
    store.close()


def bits_chunk(store: Store) -> int:
    (sql,) = store.execute("SELECT sql FROM sqlite_master WHERE name = 'chunks_vec_bits'")[0]
    return vector_index._chunk_size(sql)


def test_a_small_index_gets_small_sign_bit_chunks_until_it_outgrows_them(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """256-slot chunks while small (a third of the bytes, a faster prefilter); rebuilt with 1,024 past the line."""
    monkeypatch.setattr(vector_cells, "CELL_MIN", 10**9)
    monkeypatch.setattr(vector_index, "BITS_LARGE_OUTGROWN", 300)  # the production lines, scaled down
    monkeypatch.setattr(vector_index, "BITS_SMALL_MAX", 450)
    monkeypatch.setattr(vector_index, "BITS_SMALL_OUTGROWN", 500)
    store = Store(tmp_path / "s.sqlite")
    vectors = clustered(5, 30, 20)
    stored = dict(zip(fill(store, vectors[:400]), vectors[:400], strict=True))
    store.vectors.build_index()
    assert bits_chunk(store) == vector_index.BITS_CHUNK_SMALL
    stored.update(zip(fill(store, vectors[400:], first=400), vectors[400:], strict=True))
    assert bits_chunk(store) == vector_index.BITS_CHUNK_SMALL  # rebuilt after a pass, not inside it
    store.vectors.build_index()
    assert bits_chunk(store) == vector_index.BITS_CHUNK
    store.vectors.build_index()
    assert bits_chunk(store) == vector_index.BITS_CHUNK  # and stays so
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(600,)]
    found = 0
    for i in range(0, 600, 30):  # the rebuilt bits hold every vector, those of the second pass too
        query = near(vectors[i], i)
        found += len({h.seq for h in store.vectors.search(query.tobytes(), 10)} & set(exact(stored, query, 10)))
    assert found >= 0.95 * 20 * 10
    store.close()


def test_sign_bits_made_for_a_large_index_get_large_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector_index, "BITS_SMALL_MAX", 100)
    store = Store(tmp_path / "s.sqlite")
    fill(store, clustered(6, 10, 20))
    with store.transaction():
        store.vectors._build_bits(64, replace=True)  # as a first pass over 200 chunks makes them
    assert bits_chunk(store) == vector_index.BITS_CHUNK
    store.close()


def test_a_small_index_with_large_sign_bit_chunks_gets_small_ones_after_its_next_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As an index an older clawmem made (vec0's default 1,024), or one that has shrunk, is rebuilt."""
    store = Store(tmp_path / "s.sqlite")
    vectors = clustered(7, 10, 20)
    monkeypatch.setattr(vector_index, "BITS_SMALL_MAX", -1)
    stored = dict(zip(fill(store, vectors), vectors, strict=True))
    assert bits_chunk(store) == vector_index.BITS_CHUNK
    monkeypatch.setattr(vector_index, "BITS_SMALL_MAX", 16_384)
    store.vectors.build_index()
    assert bits_chunk(store) == vector_index.BITS_CHUNK_SMALL
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(200,)]
    query = near(vectors[3], 3)
    assert {h.seq for h in store.vectors.search(query.tobytes(), 5)} == set(exact(stored, query, 5))
    store.vectors.build_index()  # nothing crosses a line again: the table stays
    assert bits_chunk(store) == vector_index.BITS_CHUNK_SMALL
    store.close()


@pytest.mark.parametrize(("chunk_size", "vectors", "again"), [
    (256, 24_576, False), (256, 24_577, True), (1024, 8_193, False), (1024, 8_192, True), (1024, 100_000, False),
])
def test_a_sign_bit_table_is_made_again_only_past_a_margin(chunk_size: int, vectors: int, again: bool) -> None:
    assert vector_index._rechunk(chunk_size, vectors) is again


def test_a_sign_bit_table_of_an_older_clawmem_has_sqlite_vecs_default_chunks() -> None:
    assert vector_index._chunk_size("CREATE VIRTUAL TABLE chunks_vec_bits USING vec0("
                                    "part INTEGER PARTITION KEY, embedding bit[384])") == 1024
