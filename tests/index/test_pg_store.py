"""PgStore's own mechanics against a real PostgreSQL: batched writes, lazy savepoints, COPY's text format.

What both backends must answer alike is in test_backends.py; here is what only the shared index
does to get there (rows held and sent together, savepoints opened only when needed).
"""

from __future__ import annotations

import pytest

from clawmem_index.index.pg.store import PgStore
from clawmem_index.index.store import FileRow


@pytest.fixture
def store(pg_url: str):  # type: ignore[no-untyped-def]
    store = PgStore(pg_url, "alpha")
    yield store
    store.close()


def _add(store: PgStore, path: str, text: str, n: int = 0) -> int:
    return store.insert_chunk(id=f"{path}:{n}", path=path, source="memory", start_line=n + 1, end_line=n + 1,
                              hash=f"h-{path}-{n}", text=text, fts_text=text)


def _paths(store: PgStore) -> list[str]:
    return sorted({row[0] for row in store.execute("SELECT path FROM cm_chunks WHERE workspace = 'alpha'")})


def test_a_failed_file_in_a_batch_leaves_nothing_and_the_others_land(store: PgStore) -> None:
    with store.transaction():
        with store.transaction():
            _add(store, "memory/a.md", "apples grow here")
            store.upsert_file(FileRow("memory/a.md", "memory", "ha", 1, 1))
        with pytest.raises(RuntimeError), store.transaction():
            _add(store, "memory/b.md", "bananas grow there")
            store.upsert_file(FileRow("memory/b.md", "memory", "hb", 1, 1))
            raise RuntimeError("the file could not be parsed")
        with pytest.raises(RuntimeError), store.transaction():
            _add(store, "memory/c.md", "cherries")
            store.chunks_of("memory/c.md")  # a statement: this level's savepoint is opened and its rows sent
            raise RuntimeError("failed after its rows reached the server")
        with store.transaction():
            _add(store, "memory/d.md", "dates")
            store.upsert_file(FileRow("memory/d.md", "memory", "hd", 1, 1))
    assert _paths(store) == ["memory/a.md", "memory/d.md"]
    assert sorted(store.file_stats()) == ["memory/a.md", "memory/d.md"]
    assert store.counts() == (2, 2)
    # The failed files' terms are not counted either.
    assert store.execute("SELECT df FROM cm_terms WHERE workspace = 'alpha' AND term IN ('banana', 'cherri')") == []
    assert store.execute("SELECT chunks FROM cm_stats WHERE workspace = 'alpha'") == [(2,)]


def test_held_rows_are_seen_by_the_next_read_in_the_same_transaction(store: PgStore) -> None:
    with store.transaction():
        seq = _add(store, "memory/a.md", "first line")
        store.upsert_file(FileRow("memory/a.md", "memory", "h1", 1, 1))
        assert [c.seq for c in store.chunks_of("memory/a.md")] == [seq]
        store.upsert_file(FileRow("memory/a.md", "memory", "h2", 2, 2))  # the last of two held rows is kept
        assert store.file_row("memory/a.md") == FileRow("memory/a.md", "memory", "h2", 2, 2)


def test_a_failed_outer_transaction_sends_nothing(store: PgStore) -> None:
    before = store.data_version()
    with pytest.raises(RuntimeError), store.transaction():
        for n in range(300):  # more than one block of sequence numbers
            with store.transaction():
                _add(store, "memory/a.md", f"line {n}", n)
        raise RuntimeError("interrupted")
    assert _paths(store) == []
    assert store.data_version() == before


def test_text_with_copys_special_characters_is_stored_as_given(store: PgStore) -> None:
    text = 'tab\there\nnew line\r\\backslash\\N "quoted" {braces} \\\\ end'
    with store.transaction():
        _add(store, "memory/odd\\path\t.md", text)
    [row] = store.execute("SELECT path, text, terms FROM cm_chunks WHERE workspace = 'alpha'")
    assert row[0] == "memory/odd\\path\t.md"
    assert row[1] == text
    assert {"tab", "backslash", "quot", "brace"} <= set(row[2])


def test_a_chunk_added_outside_a_transaction_is_committed_at_once(store: PgStore, pg_url: str) -> None:
    _add(store, "memory/a.md", "alone")
    other = PgStore(pg_url, "alpha", read_only=True)
    try:
        assert other.execute("SELECT count(*) FROM cm_chunks WHERE workspace = 'alpha'") == [(1,)]
    finally:
        other.close()


def test_strays_are_dropped_and_nothing_to_drop_commits_nothing(store: PgStore, pg_url: str) -> None:
    with store.transaction():
        _add(store, "memory/a.md", "live row")
    before = store.data_version()
    store.drop_strays()
    assert store.data_version() == before  # a reader's kept matches stay valid
    stray = PgStore(pg_url, "alpha", new_generation=True)  # a rebuild that died before its switch
    try:
        with stray.transaction():
            _add(stray, "memory/a.md", "half-built row")
    finally:
        stray.close()
    store.drop_strays()
    assert [r[0] for r in store.execute("SELECT text FROM cm_chunks WHERE workspace = 'alpha'")] == ["live row"]


def test_a_rebuild_leaves_no_pending_keyword_entries(tmp_path, pg_url: str) -> None:  # type: ignore[no-untyped-def]
    """GIN keeps new entries in a list every search scans whole: a rebuild merges it before readers switch."""
    from clawmem_index.config import load_settings
    from clawmem_index.engine.core import MemoryIndex

    (tmp_path / "memory").mkdir()
    for i in range(40):
        (tmp_path / "memory" / f"n{i}.md").write_text(f"# note {i}\n\nthe harbour pilot logged tide {i}\n")
    index = MemoryIndex(load_settings(workspace=tmp_path, overrides={
        "index_backend": "postgres", "index_url": pg_url, "workspace_name": "alpha", "embedding.provider": "none"}))
    try:
        index.sync()
    finally:
        index.close()
    owner = PgStore(pg_url, "alpha")
    try:
        gin = owner.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " JOIN pg_am AS a ON a.oid = c.relam WHERE a.amname = 'gin'"
            " AND i.indrelid = to_regclass(quote_ident(cm_partition_name('alpha')))")
        assert len(gin) == 1
        assert owner.execute("SELECT gin_clean_pending_list(%s::regclass)", (gin[0][0],)) == [(0,)]
        _add(owner, "memory/x.md", "one more chunk, written as a daemon's edit is")
        assert owner.execute("SELECT gin_clean_pending_list(%s::regclass)", (gin[0][0],)) == [(1,)], \
            "an ordinary write leaves its entries pending (what the test above would see without the merge)"
    finally:
        owner.close()


def _embedded(store: PgStore, n: int, seed: int = 3) -> list[tuple[int, list[float]]]:
    """`n` chunks with 3-d vectors stored, the way an embedding pass stores them; returns (seq, vector)."""
    import random
    import struct

    rng = random.Random(seed)
    with store.transaction():
        seqs = [_add(store, f"memory/v{i}.md", f"vector note {i}") for i in range(n)]
    vectors = [[rng.uniform(-1, 1) for _ in range(3)] for _ in seqs]
    with store.transaction():
        store.vectors.ensure(3)
        store.embeddings.store_vectors([(seq, f"h-memory/v{i}.md-0", struct.pack("3f", *vector))
                             for i, (seq, vector) in enumerate(zip(seqs, vectors, strict=True))], "m")
    return list(zip(seqs, vectors, strict=True))


def _index_of(store: PgStore, gen: int, dims: int = 3) -> bool:
    name = store.execute("SELECT cm_vector_index_name(%s, %s, %s)", (store.workspace, gen, dims))[0][0]
    return store.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))[0][0]  # type: ignore[no-any-return]


def test_vectors_get_their_hnsw_index_when_the_pass_ends_and_searches_use_it(store: PgStore, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import math
    import struct

    stored = _embedded(store, 40)
    assert not _index_of(store, store.gen), "stored row by row into no graph: the pass's writes stay cheap"
    assert store.vectors.method().startswith("pgvector exact cosine scan")
    store.vectors.build_index()
    assert _index_of(store, store.gen)
    assert store.vectors.method() == "pgvector HNSW (cosine), exact distances"

    sent: list[tuple[str, object]] = []
    execute = store.conn.execute

    def recording(query, args=None, **kw):  # type: ignore[no-untyped-def]
        sent.append((query, args))
        return execute(query, args, **kw)

    monkeypatch.setattr(store.conn, "execute", recording)
    query = [0.3, -0.2, 0.9]
    hits = store.vectors.search(struct.pack("3f", *query), 5)
    monkeypatch.undo()
    search, args = next((q, a) for q, a in sent if "<=>" in q)
    store.execute("SET enable_seqscan = off")  # 40 rows: a scan would be cheaper; is the index usable at all?
    plan = "\n".join(row[0] for row in store.conn.execute("EXPLAIN " + search, args))
    name = store.execute("SELECT cm_vector_index_name(%s, %s, 3)", (store.workspace, store.gen))[0][0]
    assert f"Index Scan using {name}" in plan, plan

    def cosine(v: list[float]) -> float:
        return 1 - sum(a * b for a, b in zip(v, query, strict=True)) / math.hypot(*v) / math.hypot(*query)

    nearest = sorted(stored, key=lambda item: cosine(item[1]))[:5]
    assert [h.seq for h in hits] == [seq for seq, _ in nearest]
    assert [h.distance for h in hits] == pytest.approx([cosine(v) for _, v in nearest], abs=1e-5)


def test_a_rebuilds_vectors_are_indexed_before_its_switch_and_the_old_index_goes_after(store: PgStore,
                                                                                       pg_url: str) -> None:
    _embedded(store, 10)
    store.vectors.build_index()
    old = store.gen
    fresh = PgStore(pg_url, "alpha", new_generation=True)
    try:
        _embedded(fresh, 10, seed=4)
        assert not _index_of(fresh, fresh.gen)
        fresh.vectors.build_index()
        assert _index_of(fresh, fresh.gen) and _index_of(store, old), "readers keep the live one until the switch"
        store.switch_to(fresh)
        assert _index_of(store, fresh.gen) and not _index_of(store, old)
    finally:
        fresh.close()


def test_vectors_of_another_size_get_their_own_graph_and_the_old_one_goes(store: PgStore) -> None:
    import struct

    stored = _embedded(store, 6)
    store.vectors.build_index()
    store.embeddings.reset_vectors()  # a model of another size, over the same chunks
    with store.transaction():
        store.vectors.ensure(2)
        store.embeddings.store_vectors([(seq, f"h-memory/v{i}.md-0", struct.pack("2f", 1.0, float(i)))
                             for i, (seq, _) in enumerate(stored)], "m2")
    store.vectors.build_index()
    assert _index_of(store, store.gen, 2) and not _index_of(store, store.gen, 3)
    assert len(store.vectors.search(struct.pack("2f", 1.0, 2.0), 3)) == 3


def test_a_failed_rebuilds_index_goes_with_its_rows(store: PgStore, pg_url: str) -> None:
    _embedded(store, 5)
    store.vectors.build_index()
    stray = PgStore(pg_url, "alpha", new_generation=True)
    try:
        _embedded(stray, 5)
        stray.vectors.build_index()
        assert _index_of(stray, stray.gen)
        stray.drop_own_generation()
        assert not _index_of(stray, stray.gen) and _index_of(store, store.gen)
    finally:
        stray.close()


def test_a_writer_role_gets_its_index_built_and_no_role_builds_or_drops_anothers(pg_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    from clawmem_index.index.pg.schema import grant_workspace

    (writer, writer_url), (reader, reader_url) = pg_role("writer"), pg_role("reader")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, writer, "alpha", writable=True)
        grant_workspace(conn, reader, "alpha")
        grant_workspace(conn, reader, "beta", writable=True)
    agent = PgStore(writer_url, "alpha")
    try:
        _embedded(agent, 8)
        agent.vectors.build_index()
        assert _index_of(agent, agent.gen), "built by the tables' owner on the writer's behalf"
    finally:
        agent.close()
    with psycopg.connect(reader_url, autocommit=True) as conn:
        for call in ("SELECT cm_index_vectors('alpha', 5, 3)", "SELECT cm_drop_vector_indexes('alpha')",
                     "SELECT cm_drop_generation_vector_indexes('alpha', 0)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(call)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"SET ROLE {reader}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT cm_index_vectors('alpha', 5, 3)")  # the role set, not the one logged in
        conn.execute("RESET ROLE")
        conn.execute(f"GRANT {writer} TO {reader}")
    with psycopg.connect(reader_url, autocommit=True) as conn:
        assert conn.execute("SELECT cm_index_vectors('alpha', 5, 3)").fetchone() == (True,), \
            "a member of a writer role writes as it"


def test_the_texts_a_batch_job_would_embed_are_the_pending_ones_the_fleets_cache_lacks(store: PgStore) -> None:
    with store.transaction():
        for n, text in enumerate(("cached text", "new text", "excluded text")):
            _add(store, "memory/a.md", text, n)
    store.cache.cache_embeddings("p", "m", "k", [("h-memory/a.md-0", b"\x00\x00\x80?")])
    assert store.embeddings.uncached_pending("p", "m", "k", exclude={"h-memory/a.md-2"}) == \
        {"h-memory/a.md-1": "new text"}
    assert store.cache.cached_embeddings("p", "m", "k", ["h-memory/a.md-0", "h-memory/a.md-1"]) == \
        {"h-memory/a.md-0": b"\x00\x00\x80?"}
    assert set(store.embeddings.uncached_pending("q", "m", "k")) == {f"h-memory/a.md-{n}" for n in range(3)}, \
        "another model's"


def test_an_in_place_model_switch_builds_a_new_graph_whole_instead_of_filling_the_old_one(tmp_path,  # type: ignore[no-untyped-def]
                                                                                          pg_url: str) -> None:
    from clawmem_index.config import load_settings
    from clawmem_index.embeddings.fake import FakeProvider
    from clawmem_index.engine.core import MemoryIndex
    from clawmem_index.search.ranking import SearchRequest

    (tmp_path / "memory").mkdir()
    for i in range(6):
        (tmp_path / "memory" / f"n{i}.md").write_text(f"# Note {i}\nthe heron count on pond {i} was {i * 7}\n")
    settings = load_settings(workspace=tmp_path, overrides={"index_backend": "postgres", "index_url": pg_url})

    def graph(index: MemoryIndex) -> int | None:
        store = index.reader()
        dims = store.meta.get("vector_dims")
        found = store.execute("SELECT to_regclass(cm_vector_index_name(%s, %s, %s))::oid",
                              (store.workspace, store.gen, int(dims)))
        return found[0][0] if found else None

    first = MemoryIndex(settings, provider=FakeProvider(dims=8, model="a"))
    try:
        first.sync()
        before = graph(first)
    finally:
        first.close()
    assert before is not None
    second = MemoryIndex(settings, provider=FakeProvider(dims=8, model="b"))
    try:
        report = second.sync()
        assert report.embedded == 6
        after = graph(second)
        assert after is not None and after != before, "the old graph was dropped and a new one built whole"
        assert second.reader().vectors.method() == "pgvector HNSW (cosine), exact distances"
        store = second.reader()
        assert store.execute("SELECT DISTINCT model FROM cm_vectors WHERE workspace = %s AND gen = %s",
                             (store.workspace, store.gen)) == [("b",)]
        found = second.search(SearchRequest("heron count on pond 3", mode="vector", min_score=0.0))["results"]
        assert len(found) == 6
    finally:
        second.close()
