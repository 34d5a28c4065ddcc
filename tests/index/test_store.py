from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from clawmem_index.embeddings.base import normalize, pack
from clawmem_index.index.store import SCHEMA_VERSION, ChunkFilter, Store


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
    assert store.meta.get("schema_version") == str(SCHEMA_VERSION)
    assert store.execute("PRAGMA journal_mode") == [("wal",)]


def test_migrations_run_once(tmp_path: Path) -> None:
    from clawmem_index.index.store import MIGRATIONS

    Store(tmp_path / "m.sqlite").close()
    again = Store(tmp_path / "m.sqlite")
    assert again.execute("SELECT name FROM migrations ORDER BY name") == [(name,) for name, _ in MIGRATIONS]
    again.close()


def test_two_connections_migrating_a_new_index_at_once_both_open_it(tmp_path: Path) -> None:
    """A daemon's reader may open the file while its writer migrates the new index: each migration is
    looked for again under the write lock, so the second to get there skips it instead of failing."""
    import threading

    import apsw

    for attempt in range(120):  # a race: each attempt may or may not interleave
        path = tmp_path / f"index-{attempt}.sqlite"
        made = apsw.Connection(str(path))  # the writer's first moment: the file made, in WAL mode, empty
        made.execute("PRAGMA journal_mode=WAL")
        made.close()
        start, errors, opened = threading.Barrier(2), [], []

        def open_it() -> None:  # run and joined within this attempt
            start.wait()  # noqa: B023
            try:
                opened.append(Store(path, create=False))  # noqa: B023
            except Exception as exc:  # noqa: BLE001 - the failure this test looks for
                errors.append(exc)  # noqa: B023

        threads = [threading.Thread(target=open_it) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for store in opened:
            store.close()
        assert errors == [], errors


def test_an_index_from_before_a_migration_gets_it(tmp_path: Path) -> None:
    """An existing index keeps its rows and gains the tables added since (here: batch jobs)."""
    from clawmem_index.index.store import MIGRATIONS

    old = Store(tmp_path / "m.sqlite")
    add(old, "kept", "an old note")
    for statement in ("DROP TABLE embedding_jobs", "DROP INDEX chunks_date", "ALTER TABLE chunks DROP COLUMN date",
                      "ALTER TABLE files DROP COLUMN state"):
        old.execute(statement)
    old.execute("DELETE FROM migrations WHERE name IN (?, ?)", (MIGRATIONS[1][0], MIGRATIONS[2][0]))
    old.close()
    again = Store(tmp_path / "m.sqlite")
    assert again.batch_jobs.job_count() == 0 and again.counts() == (0, 1)
    assert again.execute("SELECT date FROM chunks") == [(None,)]
    again.close()


def test_a_failed_transaction_leaves_nothing_behind(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction():
        add(store, "x", "rolled back words")
        raise RuntimeError("boom")
    assert store.counts() == (0, 0)
    assert store.keywords.search('"rolled"', 5) == []


def test_nested_transactions_are_savepoints(store: Store) -> None:
    with store.transaction():
        add(store, "outer", "outer")
        with pytest.raises(ValueError), store.transaction():
            add(store, "inner", "inner")
            raise ValueError
    assert [r[0] for r in store.execute("SELECT id FROM chunks")] == ["outer"]


def test_deleting_chunks_removes_their_keyword_rows(store: Store) -> None:
    seq = add(store, "a", "ephemeral words")
    assert store.keywords.search('"ephemeral"', 5)
    store.delete_chunks([seq])
    assert store.keywords.search('"ephemeral"', 5) == []


def test_vectors_are_float32_blobs_searched_by_knn(store: Store) -> None:
    store.vectors.ensure(3)
    for i, vec in enumerate(([1, 0, 0], [0, 1, 0], [0.7, 0.7, 0])):
        seq = add(store, f"v{i}", f"text {i}")
        store.embeddings.store_vector(seq, pack(normalize(vec) or []), "m")
    hits = store.vectors.search(pack(normalize([1, 0.1, 0]) or []), 2)
    assert [h.text for h in hits] == ["text 0", "text 2"]
    assert hits[0].distance < hits[1].distance
    assert store.execute("SELECT typeof(embedding) FROM chunks_vec LIMIT 1") == [("blob",)]


def test_without_sqlite_vec_vector_search_falls_back_to_a_scan(tmp_path: Path, monkeypatch) -> None:
    import clawmem_index.index.connection as connection

    monkeypatch.setattr(connection, "_load_sqlite_vec", lambda conn: (False, "not available"))
    s = Store(tmp_path / "novec.sqlite")
    assert not s.vec_loaded
    s.vectors.ensure(2)
    for i, vec in enumerate(([1, 0], [0, 1])):
        s.embeddings.store_vector(add(s, f"v{i}", f"t{i}"), pack(normalize(vec) or []), "m")
    assert [h.text for h in s.vectors.search(pack([0.0, 1.0]), 1)] == ["t1"]
    s.close()


def test_cache_is_pruned_oldest_used_first(store: Store) -> None:
    for i in range(10):
        store.cache.cache_embeddings("p", "m", "k", [(f"h{i}", pack([1.0]))])
    store.cache.cached_embeddings("p", "m", "k", ["h0"])  # h0 used: now the newest
    assert store.cache.prune_cache(4) == 6
    left = {r[0] for r in store.execute("SELECT hash FROM embedding_cache")}
    assert "h0" in left and len(left) == 4


# -- vectors: quantized KNN with exact rescoring ---------------------------------------------------

def unit(rng: random.Random, dims: int) -> list[float]:
    return normalize([rng.gauss(0.0, 1.0) for _ in range(dims)]) or []


def clustered(rng: random.Random, clusters: int, size: int, dims: int) -> list[list[float]]:
    """Points around random centres, like real embeddings (uniform random vectors have no near neighbours)."""
    centres = [unit(rng, dims) for _ in range(clusters)]
    return [normalize([x + rng.gauss(0.0, 0.05) for x in centres[i % clusters]]) or [] for i in range(clusters * size)]


def cosine_distance(a: list[float], b: list[float]) -> float:
    return 1.0 - sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b))


def fill(store: Store, vectors: list[list[float]], paths: list[str] | None = None) -> list[int]:
    store.vectors.ensure(len(vectors[0]))
    seqs = []
    with store.transaction():
        for i, vec in enumerate(vectors):
            seq = add(store, f"v{i}", f"text {i}", paths[i] if paths else "memory/a.md")
            store.embeddings.store_vector(seq, pack(vec), "m")
            seqs.append(seq)
    return seqs


def brute_force(vectors: dict[int, list[float]], query: list[float], k: int) -> list[int]:
    return sorted(vectors, key=lambda seq: (cosine_distance(vectors[seq], query), seq))[:k]


def test_vector_search_uses_sign_bits_then_exact_cosine_distances(store: Store) -> None:
    rng = random.Random(1)
    vectors = clustered(rng, 100, 15, 64)
    by_seq = dict(zip(fill(store, vectors), vectors, strict=True))
    assert store.vectors.method() == "sqlite-vec binary-quantized KNN, exact cosine rescoring"
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(1500,)]
    for i in range(5):
        query = normalize([x + rng.gauss(0.0, 0.05) for x in vectors[i * 7]]) or []
        hits = store.vectors.search(pack(query), 5)
        assert [h.seq for h in hits] == brute_force(by_seq, query, 5)
        for hit in hits:  # float32 storage: exact up to rounding, not a hamming count
            assert hit.distance == pytest.approx(cosine_distance(by_seq[hit.seq], query), abs=1e-5)


def test_the_true_nearest_neighbour_wins_among_many_near_duplicates(store: Store) -> None:
    """Hundreds of vectors share the query's sign bits (hamming distance 0): only exact rescoring tells them apart."""
    rng = random.Random(2)
    base = [rng.choice((-1.0, 1.0)) * (0.5 + rng.random()) for _ in range(64)]
    twins = [normalize([x * (1.0 + 0.2 * rng.random()) for x in base]) or [] for _ in range(300)]
    query = normalize(base) or []
    best = normalize([x * (1.0 + 0.001 * rng.random()) for x in base]) or []
    twins.insert(150, best)
    others = [unit(rng, 64) for _ in range(700)]
    seqs = fill(store, twins + others)
    hits = store.vectors.search(pack(query), 3)
    assert hits[0].seq == seqs[150]
    assert hits[0].distance == pytest.approx(cosine_distance(best, query), abs=1e-6)
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)


def test_deleted_chunks_lose_their_vectors_and_sign_bits(store: Store, monkeypatch) -> None:
    import clawmem_index.index.vector_index as vector_index

    rng = random.Random(3)
    vectors = [unit(rng, 16) for _ in range(200)]
    seqs = fill(store, vectors)
    query = vectors[10]
    assert store.vectors.search(pack(query), 1)[0].seq == seqs[10]
    with store.transaction():
        store.delete_chunks(seqs[:50])
    assert store.execute("SELECT count(*) FROM chunks_vec") == [(150,)]
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(150,)]
    hits = store.vectors.search(pack(query), 200)
    assert len(hits) == 150 and not {h.seq for h in hits} & set(seqs[:50])
    store.delete_file("memory/a.md")
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(0,)]
    assert store.vectors.search(pack(query), 5) == []
    monkeypatch.setattr(vector_index, "PREFIX_SCAN_ROWS", 0)
    add(store, "pending", "not embedded yet")
    assert store.vectors.search(pack(query), 5, ChunkFilter(path_prefix="memory/")) == []


@pytest.mark.parametrize("scan_rows", [8192, 0], ids=["small-prefixes-ranked-exactly", "all-through-sign-bits"])
def test_a_path_prefix_keeps_only_its_chunks_and_their_true_nearest(store: Store, monkeypatch, scan_rows: int) -> None:
    import clawmem_index.index.vector_index as vector_index

    monkeypatch.setattr(vector_index, "PREFIX_SCAN_ROWS", scan_rows)
    rng = random.Random(4)
    vectors = clustered(rng, 80, 15, 64)
    paths = [f"notes/{i}.md" if i % 100 == 0 else f"memory/{'ab'[i % 2]}/{i}.md" for i in range(1200)]  # 12 notes
    by_seq = dict(zip(fill(store, vectors, paths), vectors, strict=True))
    path_of = dict(zip(by_seq, paths, strict=True))
    for i, prefix in enumerate(("notes/", "memory/", "m", "memory/a/")):  # 1%, 99%, 99%, 49% of the chunks
        query = normalize([x + rng.gauss(0.0, 0.05) for x in vectors[i * 11]]) or []
        hits = store.vectors.search(pack(query), 5, ChunkFilter(path_prefix=prefix))
        inside = {seq: vec for seq, vec in by_seq.items() if path_of[seq].startswith(prefix)}
        assert [h.seq for h in hits] == brute_force(inside, query, 5)
    assert store.vectors.search(pack(vectors[0]), 5, ChunkFilter(path_prefix="nowhere/")) == []


def test_a_prefix_with_few_candidates_near_the_query_takes_more_of_them(store: Store, monkeypatch) -> None:
    """Under memory/a/ the nearest vector differs from the query in 5 sign bits; 450 vectors differ in 0 or 1."""
    import clawmem_index.index.vector_index as vector_index

    monkeypatch.setattr(vector_index, "PREFIX_SCAN_ROWS", 0)
    rng = random.Random(8)
    query = [rng.choice((-1.0, 1.0)) * (0.01 if i < 8 else 1.0) for i in range(64)]

    def like_query(flipped: int, spread: float) -> list[float]:
        return normalize([-x if i < flipped else x * (1.0 + spread * rng.random()) if i >= 8 else x
                          for i, x in enumerate(query)]) or []

    vectors = [like_query(0, 0.3) for _ in range(250)] + [like_query(1, 1.5) for _ in range(200)]
    vectors += [like_query(5, 0.0)] + [unit(rng, 64) for _ in range(300)]
    paths = ["memory/b/x.md"] * 250 + ["memory/a/x.md"] * 201 + ["memory/c/x.md"] * 300
    seqs = fill(store, vectors, paths)
    assert store.vectors.search(pack(query), 1, ChunkFilter(path_prefix="memory/a/"))[0].seq == seqs[450]


def test_path_prefixes_match_by_characters_at_the_edges_of_unicode(store: Store) -> None:
    paths = ["a/x.md", "a/\U0010ffff/y.md", "a0.md", "b\ud7ff/z.md", "b\ue000.md", "\U0010ffff.md", "\U0010ffffz.md"]
    rng = random.Random(5)
    fill(store, [unit(rng, 8) for _ in paths], paths)
    query = pack(unit(rng, 8))
    for prefix, expected in (("a/", {"a/x.md", "a/\U0010ffff/y.md"}), ("b\ud7ff", {"b\ud7ff/z.md"}),
                             ("\U0010ffff", {"\U0010ffff.md", "\U0010ffffz.md"})):
        assert {h.path for h in store.vectors.search(query, 10, ChunkFilter(path_prefix=prefix))} == expected


def test_zero_and_nan_vectors_are_never_stored(store: Store) -> None:
    store.vectors.ensure(4)
    for i, vec in enumerate(([0.0, 0.0, 0.0, 0.0], [math.nan, 1.0, 0.0, 0.0], [math.inf, 0.0, 0.0, 0.0])):
        store.embeddings.store_vector(add(store, f"z{i}", f"zero {i}"), pack(vec), "m")
    assert store.execute("SELECT count(*) FROM chunks_vec") == [(0,)]
    assert store.execute("SELECT count(*) FROM chunks_vec_bits") == [(0,)]
    assert store.pending_embeddings() == 0
    assert store.vectors.search(pack([1.0, 0.0, 0.0, 0.0]), 3) == []


def test_in_one_batch_only_the_vectors_with_a_direction_are_stored(store: Store) -> None:
    store.vectors.ensure(4)
    vectors = ([0.0, 0.0, 0.0, 0.0], [0.6, 0.8, 0.0, 0.0], [math.nan, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0],
               [math.inf, 0.0, 0.0, 0.0], [-math.inf, 0.0, 0.0, 0.0])
    seqs = [add(store, f"b{i}", f"batch {i}") for i in range(len(vectors))]
    with store.transaction():
        items = [(seq, f"b{i}", pack(vec)) for i, (seq, vec) in enumerate(zip(seqs, vectors, strict=True))]
        given = store.embeddings.store_vectors(items, "m")
    assert len(given) == len(vectors)  # every chunk has its answer: no usable vector is an answer too
    assert store.execute("SELECT rowid FROM chunks_vec ORDER BY rowid") == [(seqs[1],), (seqs[3],)]
    assert store.pending_embeddings() == 0


def test_a_vector_too_large_for_half_precision_is_not_stored_as_one(store: Store) -> None:
    store.vectors.ensure(4, "float16")
    big, fine = add(store, "big", "big"), add(store, "fine", "fine")
    with store.transaction():
        store.embeddings.store_vectors([(big, "big", pack([1e6, 1.0, 0.0, 0.0])),
                                        (fine, "fine", pack([0.0, 1.0, 0.0, 0.0]))], "m")
    assert store.execute("SELECT rowid FROM chunks_vec_half") == [(fine,)]  # 1e6 is infinite in float16


def test_a_limit_beyond_sqlite_vecs_k_ranks_every_vector_exactly(store: Store) -> None:
    rng = random.Random(6)
    vectors = [unit(rng, 8) for _ in range(300)]
    by_seq = dict(zip(fill(store, vectors), vectors, strict=True))
    query = unit(rng, 8)
    hits = store.vectors.search(pack(query), 1000)
    assert [h.seq for h in hits] == brute_force(by_seq, query, 1000)


def test_vectors_written_without_sqlite_vec_are_found_and_requantized_later(tmp_path: Path, monkeypatch) -> None:
    """The sign bits can only be written with sqlite-vec: a write without it leaves the exact scan until they are
    rebuilt."""
    import clawmem_index.index.connection as connection

    rng = random.Random(7)
    path = tmp_path / "mixed.sqlite"
    vectors = clustered(rng, 10, 10, 16)
    first = Store(path)
    seqs = fill(first, vectors)
    first.close()

    def without_sqlite_vec() -> Store:
        with monkeypatch.context() as patched:
            patched.setattr(connection, "_load_sqlite_vec", lambda conn: (False, "not available"))
            return Store(path)

    def requantized(expected: int) -> Store:
        again = Store(path)
        assert again.vectors.method() == "sqlite-vec exact cosine scan"  # the bits missed a write
        with again.transaction():
            again.vectors.ensure(16)
        assert again.vectors.method() == "sqlite-vec binary-quantized KNN, exact cosine rescoring"
        assert again.execute("SELECT count(*) FROM chunks_vec_bits") == [(expected,)]
        return again

    plain = without_sqlite_vec()
    assert plain.vectors.method() == "in-process cosine (sqlite-vec not loaded)"
    new = unit(rng, 16)
    added = add(plain, "new", "written without sqlite-vec")
    plain.embeddings.store_vector(added, pack(new), "m")
    assert plain.vectors.search(pack(new), 1)[0].seq == added
    plain.close()
    again = requantized(101)
    assert again.vectors.search(pack(new), 1)[0].seq == added
    again.close()

    plain = without_sqlite_vec()
    plain.delete_chunks(seqs[:10])
    plain.close()
    again = requantized(91)
    assert again.vectors.search(pack(vectors[5]), 1)[0].seq != seqs[5]
    again.close()


def test_a_schema_1_vector_table_is_still_searched_until_the_rebuild(tmp_path: Path) -> None:
    """Indexes of schema 1 kept vectors in a vec0 float table; the bumped SCHEMA_VERSION rebuilds them."""
    old = Store(tmp_path / "old.sqlite")
    old.execute("CREATE VIRTUAL TABLE chunks_vec USING vec0(embedding float[3] distance_metric=cosine)")
    for i, vec in enumerate(([1.0, 0.0, 0.0], [0.0, 1.0, 0.0])):
        old.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", (add(old, f"o{i}", f"old {i}"), pack(vec)))
    assert old.vectors.readable() and old.vectors.method() == "sqlite-vec exact cosine scan"
    hits = old.vectors.search(pack(normalize([0.1, 1.0, 0.0]) or []), 2)
    assert [h.text for h in hits] == ["old 1", "old 0"]
    old.vectors.ensure(3)  # never converted in place
    assert old.execute("SELECT count(*) FROM sqlite_master WHERE name = 'chunks_vec_bits'") == [(0,)]
    old.close()


OWNER = ("p", "a", "k")


def old_index(path: Path, texts: dict[str, list[float] | None], precision: str = "float32") -> Store:
    """An index of chunks named by text hash, each with its vector (None: still waiting for one), owned by OWNER."""
    old = Store(path)
    old.vectors.ensure(4, precision)
    old.cache.set_vector_owner(*OWNER)
    with old.transaction():
        for i, (h, vec) in enumerate(texts.items()):
            seq = old.insert_chunk(id=f"o{i}", path="memory/a.md", source="memory", start_line=1, end_line=1,
                                   hash=h.split("#")[0], text=h, fts_text=h)
            if vec is not None:
                old.embeddings.store_vector(seq, pack(normalize(vec) or []), "a")
    return old


def chunk_vectors(store: Store) -> dict[str, bytes]:
    return {str(h): store.vectors.float32(bytes(blob)) for h, blob in store.execute(
        f"SELECT c.hash, v.embedding FROM chunks AS c JOIN {store.vectors.table()} AS v ON v.rowid = c.seq")}


def cache_of(store: Store) -> dict[str, bytes]:
    return {str(h): bytes(blob) for h, blob in store.execute(
        "SELECT hash, embedding FROM embedding_cache WHERE (provider, model, provider_key) = (?, ?, ?)", OWNER)}


def test_a_rebuild_takes_the_old_chunks_vectors_by_text_and_caches_those_of_texts_gone(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    import clawmem_index.index.carry as carry

    monkeypatch.setattr(carry, "CARRY_BATCH", 2)
    old = old_index(tmp_path / "old.sqlite", {"kept": [1, 0, 0, 0], "twice": [0, 1, 0, 0], "gone": [0, 0, 1, 0],
                                              "late#pending": None, "late": [0, 0, 0, 1]})
    before = chunk_vectors(old)
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        for i, h in enumerate(["kept", "twice", "twice", "late", "edited"]):
            new.insert_chunk(id=f"n{i}", path="memory/a.md", source="memory", start_line=1, end_line=1, hash=h,
                             text=h, fts_text=h)
    told: list[tuple[int, int]] = []
    assert new.carry.carry_vectors(OWNER, progress=lambda done, total: told.append((done, total))) == 4
    assert told == [(2, 5), (4, 5), (5, 5)]  # chunks looked at, a statement each
    assert chunk_vectors(new) == {h: before[h] for h in ("kept", "twice", "late")}
    assert new.execute("SELECT hash FROM chunks WHERE embedded = 0") == [("edited",)]
    assert new.execute("SELECT DISTINCT model FROM chunks WHERE embedded = 1") == [("a",)]
    assert cache_of(new) == {"gone": before["gone"]}  # each vector stored once
    assert json.loads(new.meta.get("vector_owner") or "[]") == list(OWNER)
    if new.vec_loaded:
        assert "binary-quantized" in new.vectors.method()
    assert [h.text for h in new.vectors.search(pack(normalize([0.1, 1, 0, 0]) or []), 1)] == ["twice"]
    assert new.carry.carry_vectors(OWNER) == 0  # once
    new.close()


def test_a_blob_of_another_size_in_the_old_vector_table_is_neither_taken_nor_cached(tmp_path: Path) -> None:
    old = old_index(tmp_path / "old.sqlite", {"kept": [1, 0, 0, 0], "torn": [0, 1, 0, 0], "gone": [0, 0, 1, 0]})
    before = chunk_vectors(old)
    old.execute("UPDATE chunks_vec SET embedding = substr(embedding, 1, 12) WHERE rowid IN"
                " (SELECT seq FROM chunks WHERE hash IN ('torn', 'gone'))")
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        add(new, "kept", "kept")
        add(new, "torn", "torn")
    assert new.carry.carry_vectors(OWNER) == 1
    assert chunk_vectors(new) == {"kept": before["kept"]} and cache_of(new) == {}
    assert new.execute("SELECT hash FROM chunks WHERE embedded = 0") == [("torn",)]  # made again
    new.close()


def test_an_old_index_that_never_recorded_its_dimensions_still_gives_its_vectors(tmp_path: Path) -> None:
    old = old_index(tmp_path / "old.sqlite", {"kept": [1, 2, 3, 4], "gone": [0, 0, 1, 0]})
    before = chunk_vectors(old)
    old.execute("DELETE FROM meta WHERE key = 'vector_dims'")  # the blobs' length tells it instead
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        add(new, "kept", "kept")
    assert new.carry.carry_vectors(OWNER) == 1
    assert chunk_vectors(new) == {"kept": before["kept"]} and cache_of(new) == {"gone": before["gone"]}
    new.close()


def test_a_schema_1_vec0_table_is_carried_to_the_cache_not_taken(tmp_path: Path) -> None:
    old = Store(tmp_path / "old.sqlite")
    if not old.vec_loaded:
        pytest.skip("reading a vec0 table needs sqlite-vec")
    old.execute("CREATE VIRTUAL TABLE chunks_vec USING vec0(embedding float[4] distance_metric=cosine)")
    vector = pack(normalize([1, 2, 3, 4]) or [])
    old.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", (add(old, "kept", "kept"), vector))
    old.meta.set("vector_owner", json.dumps(list(OWNER)))
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        add(new, "kept", "kept")
    assert new.carry.carry_vectors(OWNER) == 0 and not new.vectors.readable()
    assert cache_of(new) == {"kept": vector}  # the embedding pass takes it from there
    new.close()


@pytest.mark.parametrize("owner, precision", [(("p", "b", "k"), "float32"), (("p", "b", "k"), "float16"),
                                              (None, "float32")])
def test_vectors_of_another_model_go_to_the_cache_whole(tmp_path: Path, owner, precision: str) -> None:
    old = old_index(tmp_path / "old.sqlite", {"kept": [1, 0, 0, 0], "gone": [0, 0, 1, 0]})
    before = chunk_vectors(old)
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        add(new, "kept", "kept")
    assert new.carry.carry_vectors(owner, precision) == 0
    assert not new.vectors.readable() and new.pending_embeddings() == 1
    assert cache_of(new) == before
    new.close()


def test_half_precision_vectors_are_taken_as_they_are_stored(tmp_path: Path) -> None:
    old = old_index(tmp_path / "old.sqlite", {"kept": [1, 2, 3, 4]}, precision="float16")
    stored = old.execute("SELECT embedding FROM chunks_vec_half")
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        add(new, "kept", "kept")
    assert new.carry.carry_vectors(OWNER, "float16") == 1
    assert new.execute("SELECT embedding FROM chunks_vec_half") == stored and cache_of(new) == {}
    new.close()


@pytest.mark.parametrize(("before", "after"), [("float32", "float16"), ("float16", "float32")])
def test_vectors_stored_at_another_precision_are_taken_converted_not_through_the_cache(tmp_path: Path, before: str,
                                                                                       after: str) -> None:
    """A change of precision rebuilds: the chunks take their vectors converted in one statement (no cache row
    written and deleted, so no page left free), the same vectors within the rounding of the narrower type."""
    import numpy as np

    old = old_index(tmp_path / "old.sqlite", {"kept": [1, 2, 3, 4], "also": [0, 1, 0, 1]}, precision=before)
    wanted = {h: np.frombuffer(v, "<f4").astype("<f2").astype("<f4") for h, v in chunk_vectors(old).items()}
    old.close()
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        add(new, "kept", "kept")
        add(new, "also", "also")
    assert new.carry.carry_vectors(OWNER, after) == 2
    assert new.vectors.table() == ("chunks_vec_half" if after == "float16" else "chunks_vec")
    assert new.pending_embeddings() == 0 and cache_of(new) == {}
    got = chunk_vectors(new)
    assert got.keys() == wanted.keys()
    assert all(np.array_equal(np.frombuffer(got[h], "<f4"), wanted[h]) for h in wanted)
    new.close()


def test_past_cell_min_a_rebuild_trains_the_cells_from_the_vectors_taken(tmp_path: Path, monkeypatch) -> None:
    import numpy as np

    import clawmem_index.index.vector_cells as vector_cells
    from clawmem_index.index.vector_index import VectorIndex

    monkeypatch.setattr(vector_cells, "CELL_MIN", 1000)
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((1200, 4)).astype(np.float32)
    old = old_index(tmp_path / "old.sqlite", {f"h{i}": [float(x) for x in v] for i, v in enumerate(vectors)})
    old.close()
    built: list[int] = []
    real = VectorIndex._build_bits
    monkeypatch.setattr(VectorIndex, "_build_bits", lambda self, *a, **k: built.append(1) or real(self, *a, **k))
    new = Store(tmp_path / "new.sqlite")
    new.carry.copy_cache_from(tmp_path / "old.sqlite")
    with new.transaction():
        for i in range(1200):
            add(new, f"h{i}", f"text {i}")
    trained: list[tuple[int, int]] = []
    assert new.carry.carry_vectors(OWNER, index_progress=lambda done, total: trained.append((done, total))) == 1200
    assert "cells" in new.vectors.method() and built == [] and new.pending_embeddings() == 0
    assert trained and trained[-1][0] == trained[-1][1]  # the cells build told how it went
    assert new.vectors.search(pack(normalize([float(x) for x in vectors[17]]) or []), 1)[0].text == "text 17"
    new.close()
