from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import clawmem_index.index.vector_cells as vector_cells
import clawmem_index.index.vector_index as vector_index
from clawmem_index.index.store import ChunkFilter, Store

CELL_MIN = 1000  # small enough that a test's index passes it; the product's is 131,072
CELLS = "k-means cells of sign bits, exact cosine rescoring"
BITS = "sqlite-vec binary-quantized KNN, exact cosine rescoring"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setattr(vector_cells, "CELL_MIN", CELL_MIN)
    monkeypatch.setattr(vector_cells, "PROBE_MIN_VECTORS", 0)  # read 1/PROBE_SHARE of the cells, as at 1M vectors
    s = Store(tmp_path / "s.sqlite")
    yield s
    s.close()


def clustered(seed: int, clusters: int, size: int, dims: int = 64) -> np.ndarray:
    """Unit vectors around random centres, like real embeddings (uniform random vectors have no near neighbours)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dims))
    points = np.repeat(centres / np.linalg.norm(centres, axis=1, keepdims=True), size, axis=0)
    points += 0.08 * rng.standard_normal(points.shape)
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


def fill(store: Store, vectors: np.ndarray, first: int = 0, paths: list[str] | None = None) -> list[int]:
    store.vectors.ensure(vectors.shape[1])
    seqs = []
    with store.transaction():
        for i, vec in enumerate(vectors, start=first):
            seq = store.insert_chunk(id=f"v{i}", path=paths[i - first] if paths else "memory/a.md", source="memory",
                                     start_line=1, end_line=1, hash=f"v{i}", text=f"text {i}", fts_text=f"text {i}")
            store.embeddings.store_vector(seq, vec.tobytes(), "m")
            seqs.append(seq)
    return seqs


def exact(by_seq: dict[int, np.ndarray], query: np.ndarray, k: int) -> list[int]:
    return sorted(by_seq, key=lambda seq: (1.0 - float(by_seq[seq] @ query), seq))[:k]


def near(vector: np.ndarray, seed: int, noise: float = 0.05) -> np.ndarray:
    noisy = vector + noise * np.random.default_rng(seed).standard_normal(vector.shape)
    return (noisy / np.linalg.norm(noisy)).astype(np.float32)


def ranked_as_stored(store: Store, vectors: np.ndarray, stored: dict[int, np.ndarray],
                     inside: dict[int, np.ndarray]) -> float:
    """Recall@10 of ten queries near `vectors` against exact cosine over the `stored` values, checking
    each answer's distances (those `distances_of` gives too) and order, and that a search under
    "memory/b/" (whose vectors are `inside`) ranks exactly."""
    found = 0
    for i in range(0, len(vectors), len(vectors) // 10):
        query = near(vectors[i], i)
        hits = store.vectors.search(query.tobytes(), 10)
        found += len({h.seq for h in hits} & set(exact(stored, query, 10)))
        for hit in hits:
            assert hit.distance == pytest.approx(1.0 - float(stored[hit.seq] @ query), abs=1e-6)
        assert [h.distance for h in hits] == sorted(h.distance for h in hits)
        assert store.vectors.distances_of(query.tobytes(), [h.seq for h in hits]) == pytest.approx(
            {h.seq: h.distance for h in hits}, abs=1e-9)  # what `search` gave, as the fusion reads them
        prefixed = store.vectors.search(query.tobytes(), 5, ChunkFilter(path_prefix="memory/b/"))
        assert [h.seq for h in prefixed] == exact(inside, query, 5)
    return found / 100


def members(store: Store) -> list[int]:
    return [seq for (blob,) in store.execute("SELECT seqs FROM chunks_vec_cells")
            for seq in np.frombuffer(blob, dtype="<i8").tolist()]


def test_past_cell_min_the_sign_bits_move_into_cells_that_find_the_exact_nearest(store: Store) -> None:
    vectors = clustered(1, 100, 20)
    by_seq = dict(zip(fill(store, vectors), vectors, strict=True))
    assert store.vectors.method() == BITS  # until the embedding pass ends
    store.vectors.build_index()
    assert store.vectors.method() == CELLS
    assert store.execute("SELECT name FROM sqlite_master WHERE name = 'chunks_vec_bits'") == []
    assert store.execute("SELECT count(*) FROM chunks_vec_cells") == [(vector_cells.cell_count(2000),)]
    assert sorted(members(store)) == sorted(by_seq)
    found = 0
    for i in range(0, 2000, 100):
        query = near(vectors[i], i)
        hits = store.vectors.search(query.tobytes(), 10)
        found += len({h.seq for h in hits} & set(exact(by_seq, query, 10)))
        for hit in hits:  # float32 storage: exact up to rounding, not a hamming count
            assert hit.distance == pytest.approx(1.0 - float(by_seq[hit.seq] @ query), abs=1e-5)
        assert [h.distance for h in hits] == sorted(h.distance for h in hits)
    assert found / (20 * 10) >= 0.95


def cell_of(store: Store) -> dict[int, int]:
    return {seq: cell for cell, blob in store.execute("SELECT cell, seqs FROM chunks_vec_cells")
            for seq in np.frombuffer(blob, dtype="<i8").tolist()}


def nearest_cells(store: Store, query: np.ndarray, count: int) -> set[int]:
    rows = store.execute("SELECT cell, centroid FROM chunks_vec_cells")
    return {cell for cell, _ in sorted(rows, key=lambda r: -float(np.frombuffer(r[1], dtype="<f4") @ query))[:count]}


@pytest.mark.parametrize(("probe_min", "probes"), [(0, 128 // 32), (400, 26)], ids=["share", "minimum"])
def test_a_query_reads_only_the_cells_nearest_it(store: Store, monkeypatch: pytest.MonkeyPatch, probe_min: int,
                                                 probes: int) -> None:
    monkeypatch.setattr(vector_cells, "PROBE_MIN_VECTORS", probe_min)
    vectors = clustered(2, 100, 20)
    fill(store, vectors)
    store.vectors.build_index()
    assert vector_cells.cell_count(2000) == 128
    owner = cell_of(store)
    for i in (0, 500, 1500):
        query = near(vectors[i], i)
        candidates = store.vectors._cells.candidates(query.tobytes(), 10_000)
        read = nearest_cells(store, query, probes)
        assert {owner[seq] for seq in candidates} <= read
        assert len(candidates) == sum(1 for cell in owner.values() if cell in read)


def test_below_cell_min_the_index_keeps_its_sign_bits(store: Store) -> None:
    fill(store, clustered(3, 40, 20))
    store.vectors.build_index()
    assert store.vectors.method() == BITS
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(800,)]


def test_vectors_stored_after_the_build_join_the_cell_of_their_nearest_centroid(store: Store) -> None:
    fill(store, clustered(4, 100, 20))
    store.vectors.build_index()
    newcomers = clustered(5, 5, 1)
    added = fill(store, newcomers, first=2000)
    owner = cell_of(store)
    assert len(owner) == 2005
    for seq, vector in zip(added, newcomers, strict=True):
        assert {owner[seq]} == nearest_cells(store, vector, 1)
        assert store.vectors.search(vector.tobytes(), 1)[0].seq == seq


def test_removed_vectors_never_come_back_and_enough_removals_rebuild_the_cells(store: Store) -> None:
    vectors = clustered(6, 100, 20)
    seqs = fill(store, vectors)
    store.vectors.build_index()
    built = store.meta.get("vector_cells_built")
    with store.transaction():
        store.delete_chunks(seqs[:400])  # a fifth: kept in the cells, dead
    assert len(members(store)) == 2000
    for i in range(0, 400, 40):
        hits = store.vectors.search(vectors[i].tobytes(), 30)
        assert hits and not {h.seq for h in hits} & set(seqs[:400])
    store.vectors.build_index()
    assert store.meta.get("vector_cells_built") == built  # 400 dead of 2,000 members: not yet
    with store.transaction():
        store.delete_chunks(seqs[400:600])
    store.vectors.build_index()
    assert store.meta.get("vector_cells_built") != built
    assert sorted(members(store)) == sorted(seqs[600:])
    assert store.meta.get("vector_cells_dead") == "0"


def test_a_reused_seq_is_ranked_once_by_its_new_vector(store: Store) -> None:
    vectors = clustered(7, 100, 20)
    seqs = fill(store, vectors)
    store.vectors.build_index()
    with store.transaction():
        store.delete_chunks([seqs[-1]])
    newcomer = clustered(8, 1, 1)
    (again,) = fill(store, newcomer, first=5000)
    assert again == seqs[-1]  # SQLite gives the freed largest rowid out again
    hits = store.vectors.search(newcomer[0].tobytes(), 3)
    assert hits[0].seq == again and [h.seq for h in hits].count(again) == 1
    assert hits[0].distance == pytest.approx(0.0, abs=1e-5)
    old = store.vectors.search(vectors[-1].tobytes(), 20)
    assert all(h.distance == pytest.approx(1.0 - float(newcomer[0] @ vectors[-1]), abs=1e-5)
               for h in old if h.seq == again)


def test_the_cells_go_when_the_index_shrinks_below_half_cell_min(store: Store) -> None:
    seqs = fill(store, clustered(9, 100, 20))
    store.vectors.build_index()
    with store.transaction():
        store.delete_chunks(seqs[:1600])
    store.vectors.build_index()
    assert store.vectors.method() == BITS
    assert store.execute("SELECT name FROM sqlite_master WHERE name = 'chunks_vec_cells'") == []
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(400,)]
    assert store.vectors.search(store.execute("SELECT embedding FROM chunks_vec WHERE rowid = ?", (seqs[1700],))[0][0],
                               1)[0].seq == seqs[1700]


def test_a_path_prefix_keeps_only_its_chunks_through_the_cells(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector_index, "PREFIX_SCAN_ROWS", 0)  # never ranked exactly: through the cells
    vectors = clustered(10, 100, 20)
    paths = [f"memory/{'ab'[i % 2]}/{i}.md" for i in range(2000)]
    by_seq = dict(zip(fill(store, vectors, paths=paths), vectors, strict=True))
    store.vectors.build_index()
    inside = {seq: vec for (seq, vec), path in zip(by_seq.items(), paths, strict=True) if path.startswith("memory/a/")}
    for i in range(0, 2000, 250):
        query = near(vectors[i], i)
        hits = store.vectors.search(query.tobytes(), 5, ChunkFilter(path_prefix="memory/a/"))
        assert all(h.path.startswith("memory/a/") for h in hits)
        assert [h.seq for h in hits] == exact(inside, query, 5)


def test_cells_are_kept_by_a_writer_without_sqlite_vec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import clawmem_index.index.connection as connection

    monkeypatch.setattr(vector_cells, "CELL_MIN", CELL_MIN)
    path = tmp_path / "s.sqlite"
    with monkeypatch.context() as without:
        without.setattr(connection, "_load_sqlite_vec", lambda conn: (False, "not available"))
        plain = Store(path)
        fill(plain, clustered(11, 100, 20))
        plain.vectors.build_index()
        newcomers = clustered(12, 1, 3)
        added = fill(plain, newcomers, first=2000)
        plain.close()
    loaded = Store(path, create=False)
    assert loaded.vectors.method() == CELLS
    assert loaded.vectors.search(newcomers[0].tobytes(), 1)[0].seq == added[0]
    assert len(members(loaded)) == 2003
    loaded.close()


def test_a_model_switch_drops_the_cells_with_the_vectors(store: Store) -> None:
    fill(store, clustered(13, 100, 20))
    store.vectors.build_index()
    with store.transaction():
        store.vectors.drop_all()
    assert store.execute("SELECT name FROM sqlite_master WHERE name LIKE 'chunks_vec%'") == []
    assert store.meta.get("vector_cells") is None


def test_the_cells_are_trained_again_when_the_index_has_doubled(store: Store) -> None:
    fill(store, clustered(14, 60, 20))
    store.vectors.build_index()
    assert store.meta.get("vector_cells_trained") == "1200"
    fill(store, clustered(15, 50, 20), first=1200)
    store.vectors.build_index()
    assert store.meta.get("vector_cells_trained") == "1200"  # 2,200: not yet twice the size
    fill(store, clustered(18, 10, 20), first=2200)
    store.vectors.build_index()
    assert store.meta.get("vector_cells_trained") == "2400"
    assert sorted(members(store)) == sorted(r[0] for r in store.execute("SELECT rowid FROM chunks_vec"))


def test_vectors_an_older_writer_added_beside_the_cells_are_found_and_the_cells_rebuilt(store: Store) -> None:
    """An older clawmem knows no cells: it makes the sign-bit table again and writes its vectors there."""
    fill(store, clustered(16, 100, 20))
    store.vectors.build_index()
    newcomer = clustered(17, 1, 1)
    with store.transaction():  # what the older writer's ensure_vector_table and put do
        store.vectors._build_bits(64, replace=False)
        seq = store.insert_chunk(id="old", path="memory/old.md", source="memory", start_line=1, end_line=1,
                                 hash="old", text="old", fts_text="old")
        store.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", (seq, newcomer[0].tobytes()))
        store.execute("INSERT INTO chunks_vec_bits(rowid, part, embedding)"
                      " VALUES(?, ?, vec_quantize_binary(vec_f32(?)))",
                      (seq, seq % 32, newcomer[0].tobytes()))
        store.execute("UPDATE chunks SET embedded = 1 WHERE seq = ?", (seq,))
    assert store.vectors.method() == BITS
    assert store.vectors.search(newcomer[0].tobytes(), 1)[0].seq == seq
    store.vectors.build_index()
    assert store.vectors.method() == CELLS
    assert seq in members(store)
    assert store.vectors.search(newcomer[0].tobytes(), 1)[0].seq == seq


def test_chunks_embedded_without_a_usable_vector_build_no_cells(store: Store) -> None:
    """A provider that answered zero vectors: the chunks count as embedded, but no vector is stored."""
    store.vectors.ensure(64)
    with store.transaction():
        for i in range(1200):
            seq = store.insert_chunk(id=f"z{i}", path="memory/z.md", source="memory", start_line=1, end_line=1,
                                     hash=f"z{i}", text=f"zero {i}", fts_text=f"zero {i}")
            store.embeddings.store_vector(seq, bytes(4 * 64), "m")
    fill(store, clustered(19, 10, 20), first=5000)
    store.vectors.build_index()
    assert store.vectors.method() == BITS
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(200,)]


@pytest.mark.parametrize("cells", [False, True], ids=["scan", "through-cells"])
def test_without_sqlite_vec_a_search_ranks_by_exact_cosine_in_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   cells: bool) -> None:
    import clawmem_index.index.connection as connection

    monkeypatch.setattr(vector_cells, "CELL_MIN", CELL_MIN if cells else 10**9)
    monkeypatch.setattr(vector_cells, "PROBE_MIN_VECTORS", 0)
    monkeypatch.setattr(vector_index, "PREFIX_SCAN_ROWS", 0)
    monkeypatch.setattr(connection, "_load_sqlite_vec", lambda conn: (False, "not available"))
    plain = Store(tmp_path / "s.sqlite")
    vectors = clustered(20, 100, 20)
    paths = [f"memory/{'ab'[i % 2]}/{i}.md" for i in range(2000)]
    by_seq = dict(zip(fill(plain, vectors, paths=paths), vectors, strict=True))
    plain.vectors.build_index()
    assert plain.vectors.method() == "in-process cosine (sqlite-vec not loaded)"
    assert (plain.execute("SELECT count(*) FROM sqlite_master WHERE name = 'chunks_vec_cells'") == [(1,)]) == cells
    inside = {seq: vec for (seq, vec), path in zip(by_seq.items(), paths, strict=True) if path.startswith("memory/b/")}
    asked: list[int] = []
    real = plain.vectors._cells.candidates
    monkeypatch.setattr(plain.vectors._cells, "candidates", lambda blob, want: asked.append(want) or real(blob, want))
    assert ranked_as_stored(plain, vectors, by_seq, inside) >= (0.95 if cells else 1.0)
    assert bool(asked) == cells  # with cells, only their candidates are ranked
    plain.close()


def test_a_cells_build_reports_its_progress_to_the_end(store: Store) -> None:
    vectors = clustered(12, 100, 20)
    fill(store, vectors)
    seen: list[tuple[int, int]] = []
    store.vectors.build_index(lambda done, total: seen.append((done, total)))
    sample = min(len(vectors), vector_cells.SAMPLE_PER_CELL * vector_cells.cell_count(len(vectors)))
    total = vector_cells.TRAIN_ROUNDS * sample + len(vectors)
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert len(seen) > vector_cells.TRAIN_ROUNDS + 1  # every round and every batch, not only the ends
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))
    seen.clear()
    store.vectors.build_index(lambda done, total: seen.append((done, total)))
    assert seen == []  # nothing to build: nothing to report


@pytest.mark.parametrize("dims", [384, 1536, 100, 768, 1000])
def test_hamming_distances_of_any_width_and_count_match_a_bit_by_bit_count(dims: int) -> None:
    """Rows compared XOR_ROWS at a time, the rest one by one, and widths of whole words or not."""
    from clawmem_index.index.vector_cells import XOR_ROWS, _hamming_in_place, _sign_bits

    rng = np.random.default_rng(dims)
    query = _sign_bits(rng.standard_normal((1, dims)).astype(np.float32))[0]
    for rows in (0, 1, XOR_ROWS - 1, XOR_ROWS, XOR_ROWS + 1, 3 * XOR_ROWS + 7):
        bits = _sign_bits(rng.standard_normal((rows, dims)).astype(np.float32))
        expected = [int(np.unpackbits(row ^ query).sum()) for row in bits]
        assert _hamming_in_place(bits.copy(), query).tolist() == expected


def test_readers_sharing_cells_read_each_cell_once(store: Store) -> None:
    vectors = clustered(32, 100, 20)
    fill(store, vectors)
    store.vectors.build_index()
    shared = vector_cells.SharedCells()
    first, second = (Store(store.path, create=False, shared_cells=shared) for _ in range(2))
    query = near(vectors[0], 0).tobytes()
    expected = store.vectors._cells.candidates(query, 50)  # the writer's connection shares nothing
    assert first.vectors._cells.candidates(query, 50) == expected
    assert shared.held > 0
    statements: list[str] = []
    second.conn.exec_trace = lambda cursor, sql, bindings: statements.append(sql) or True
    assert second.vectors._cells.candidates(query, 50) == expected
    assert statements and not [sql for sql in statements if "chunks_vec_cells" in sql]  # nor their member counts


def test_shared_cells_follow_appends_and_each_reader_keeps_its_snapshot(store: Store) -> None:
    fill(store, clustered(33, 100, 20))
    store.vectors.build_index()
    shared = vector_cells.SharedCells()
    older, newer = (Store(store.path, create=False, shared_cells=shared) for _ in range(2))
    newcomers = clustered(34, 5, 1)
    for vector in newcomers:  # the cells they will join are held as they are now
        older.vectors._cells.candidates(vector.tobytes(), 10_000)
    older.conn.execute("BEGIN")
    older.execute("SELECT count(*) FROM chunks")  # its snapshot: before the newcomers
    added = fill(store, newcomers, first=2000)
    for seq, vector in zip(added, newcomers, strict=True):
        assert seq in newer.vectors._cells.candidates(vector.tobytes(), 10_000)  # a copy held shorter is read again
        assert seq not in older.vectors._cells.candidates(vector.tobytes(), 10_000)  # a longer one, cut to its snapshot
    older.conn.execute("COMMIT")


def test_shared_cells_stay_within_their_budget(store: Store) -> None:
    vectors = clustered(35, 100, 20)
    fill(store, vectors)
    store.vectors.build_index()
    shared = vector_cells.SharedCells(budget=5_000)  # ~20 of the 128 cells (16 members of 16 bytes each)
    reader = Store(store.path, create=False, shared_cells=shared)
    for i in range(0, 2000, 50):
        query = near(vectors[i], i).tobytes()
        assert reader.vectors._cells.candidates(query, 40) == store.vectors._cells.candidates(query, 40)
        assert 0 < shared.held <= 5_000


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "own"])
def test_a_rebuilt_file_swapped_in_is_searched_by_its_own_cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                shared: bool) -> None:
    """A rebuild's file counts its cell builds from 1 again: the same stamp as the live file's may name other cells."""
    monkeypatch.setattr(vector_cells, "CELL_MIN", CELL_MIN)
    monkeypatch.setattr(vector_cells, "PROBE_MIN_VECTORS", 0)
    live, rebuilt = Store(tmp_path / "live.sqlite"), Store(tmp_path / "rebuilt.sqlite")
    old, new = clustered(36, 100, 20), clustered(37, 100, 20)
    fill(live, old)
    seqs = fill(rebuilt, new)
    for store in (live, rebuilt):
        store.vectors.build_index()
    assert live.meta.get("vector_cells_built") == rebuilt.meta.get("vector_cells_built")
    reader = Store(live.path, create=False, shared_cells=vector_cells.SharedCells() if shared else None)
    for i in range(0, 2000, 200):
        reader.vectors.search(near(old[i], i).tobytes(), 1)
    with live.conn.backup("main", rebuilt.conn, "main") as backup:  # what SqliteBackend.swap_in does
        while not backup.done:
            backup.step(-1)
    for i in range(0, 2000, 200):
        assert reader.vectors.search(near(new[i], i).tobytes(), 1)[0].seq == seqs[i]


def test_threads_sharing_cells_pick_what_their_own_snapshot_holds_while_a_writer_appends_and_rebuilds(
        store: Store) -> None:
    """Each reader compares, inside one read transaction, the shared path with reading the cells itself."""
    import threading

    vectors = clustered(38, 100, 20)
    seqs = fill(store, vectors)
    store.vectors.build_index()
    shared = vector_cells.SharedCells(budget=20_000)  # small: cells dropped and read again while others read
    readers = [Store(store.path, create=False, shared_cells=shared) for _ in range(4)]
    queries = [near(vectors[i], i).tobytes() for i in range(0, 2000, 97)]
    wrong: list[int] = []

    def ask(reader: Store, start: threading.Barrier) -> None:
        own = vector_cells.VectorCells(reader.conn, reader.meta, lambda: ("chunks_vec", "<f4"))  # nothing shared
        start.wait()
        for i, query in enumerate(queries):
            reader.conn.execute("BEGIN")
            reader.execute("SELECT count(*) FROM chunks")
            if reader.vectors._cells.candidates(query, 60) != own.candidates(query, 60):
                wrong.append(i)
            reader.conn.execute("COMMIT")

    for round_ in range(4):
        start = threading.Barrier(len(readers) + 1)
        threads = [threading.Thread(target=ask, args=(reader, start)) for reader in readers]
        for thread in threads:
            thread.start()
        start.wait()
        fill(store, clustered(40 + round_, 20, 3), first=3000 + 100 * round_)  # appended to the cells
        if round_ == 2:
            with store.transaction():
                store.delete_chunks(seqs[:700])  # past a quarter dead: the next pass trains new cells
            built = store.meta.get("vector_cells_built")
            store.vectors.build_index()
            assert store.meta.get("vector_cells_built") != built
        for thread in threads:
            thread.join()
    assert wrong == []
    assert shared.held <= 20_000
    for reader in readers:
        reader.close()
