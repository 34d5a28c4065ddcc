"""The shared index's migrations against a real PostgreSQL: an older database is carried forward whole."""

from __future__ import annotations

import psycopg
import pytest

from clawmem_index.index.pg.schema import MIGRATIONS, migrate
from clawmem_index.index.pg.store import PgStore


@pytest.fixture
def empty_url(pg_cluster):  # type: ignore[no-untyped-def]
    import uuid

    name = f"m_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_cluster.url(name)
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _as_of(conn: psycopg.Connection, last: str) -> None:
    """The schema an older clawmem left: the migrations up to `last`, applied as `migrate` did."""
    conn.execute("CREATE TABLE cm_migrations(name text PRIMARY KEY, applied_at double precision NOT NULL)")
    for name, body in MIGRATIONS:
        conn.execute(body)  # type: ignore[arg-type]
        conn.execute("INSERT INTO cm_migrations VALUES(%s, 0)", (name,))
        if name == last:
            return
    raise AssertionError(f"no migration {last}")


def test_chunks_of_an_unpartitioned_index_move_into_their_workspaces_partitions(empty_url: str) -> None:
    with psycopg.connect(empty_url, autocommit=True) as conn:
        _as_of(conn, "0003_leaner_writes")
        for n, workspace in enumerate(("alpha", "beta")):
            conn.execute("INSERT INTO cm_workspaces(workspace, created_at) VALUES(%s, 0)", (workspace,))
            conn.execute("INSERT INTO cm_stats VALUES(%s, 0, 1, 2)", (workspace,))
            conn.execute(
                "INSERT INTO cm_chunks(workspace, gen, id, path, start_line, end_line, hash, text, updated_at, terms,"
                " counts, length, embedded, dims, embedding) VALUES(%s, 0, 'c', 'MEMORY.md', 1, 1, 'h', %s, 0,"
                " %s, '{1,1}', 2, true, 3, %s)",
                (workspace, f"{workspace} notes", [workspace, "note"], f"[1,{n},0]"))
        migrate(conn)
        assert {r[0] for r in conn.execute("SELECT name FROM cm_migrations")} == {name for name, _ in MIGRATIONS}
        partitions = {r[0]: r[1] for r in conn.execute(
            "SELECT workspace, tableoid::regclass::text FROM cm_chunks")}
        assert partitions == {w: conn.execute("SELECT cm_partition_name(%s)", (w,)).fetchone()[0]  # type: ignore[index]
                              for w in ("alpha", "beta")}
        assert conn.execute("SELECT to_regclass('cm_chunks_hnsw_3')").fetchone() == (None,)
        assert [conn.execute("SELECT to_regclass(cm_vector_index_name(%s, 0, 3)) IS NOT NULL", (w,)).fetchone()
                for w in ("alpha", "beta")] == [(True,), (True,)], "each live generation's vectors get their own"
        assert conn.execute("SELECT relrowsecurity FROM pg_class WHERE relname = 'cm_chunks'").fetchone() == (True,)
    store = PgStore(empty_url, "alpha", read_only=True, scope=("alpha", "beta"))
    try:
        store.data_version()
        assert [(h.workspace, h.text) for h in store.keywords.search('"note"', 5)] == \
            [("alpha", "alpha notes"), ("beta", "beta notes")]
        assert [h.workspace for h in store.vectors.search(b"\x00\x00\x80?\x00\x00\x80?\x00\x00\x00\x00", 2)] == \
            ["beta", "alpha"]
    finally:
        store.close()
    # New chunks after the move take numbers the moved ones never had.
    writer = PgStore(empty_url, "gamma")
    try:
        with writer.transaction():
            seq = writer.insert_chunk(id="c", path="MEMORY.md", source="memory", start_line=1, end_line=1, hash="h",
                                      text="gamma", fts_text="gamma")
        assert seq > max(r[0] for r in writer.execute("SELECT seq FROM cm_chunks WHERE workspace <> 'gamma'"))
    finally:
        writer.close()


def test_a_role_without_a_partition_for_its_workspace_is_told_who_can_make_it(pg_url: str) -> None:
    import os
    from urllib.parse import urlsplit

    from clawmem_index.errors import IndexUnavailable
    from clawmem_index.index.pg.schema import grant_workspace

    role = f"agent_{os.urandom(4).hex()}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT CONNECT ON DATABASE {urlsplit(pg_url).path.lstrip('/')} TO {role}")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON cm_workspaces TO {role}")
        conn.execute("INSERT INTO cm_access VALUES(%s, 'delta', true)", (role,))
    url = pg_url.replace("postgresql://postgres@", f"postgresql://{role}@")
    with pytest.raises(IndexUnavailable, match="grant_workspace"):
        PgStore(url, "delta")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        grant_workspace(conn, role, "delta", writable=True)
    PgStore(url, "delta").close()


def test_a_role_granted_before_vectors_had_their_own_table_keeps_its_rights_to_them(empty_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    role, _ = pg_role("writer")  # roles are the cluster's: this one logs in to the database made here
    url = empty_url.replace("postgresql://postgres@", f"postgresql://{role}@")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        _as_of(conn, "0006_vector_indexes_per_generation")
        conn.execute("INSERT INTO cm_access VALUES(%s, 'alpha', true)", (role,))  # as grant_workspace did then
        conn.execute("SELECT cm_add_partition('alpha')")
        for table in ("cm_workspaces", "cm_meta", "cm_files", "cm_chunks", "cm_terms", "cm_stats", "cm_jobs",
                      "cm_embedding_cache"):
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")
        conn.execute(f"GRANT USAGE ON SEQUENCE cm_chunks_seq_seq TO {role}")
        migrate(conn)
    writer = PgStore(url, "alpha")
    try:
        with writer.transaction():
            seq = writer.insert_chunk(id="c", path="MEMORY.md", source="memory", start_line=1, end_line=1, hash="h",
                                      text="alpha", fts_text="alpha")
        assert writer.pending_embeddings() == 1
        assert writer.embeddings.store_vectors([(seq, "h", b"\x00\x00\x80?\x00\x00\x00\x00")], "m") == \
            [(seq, b"\x00\x00\x80?\x00\x00\x00\x00")]
        assert writer.pending_embeddings() == 0
        writer.data_version()
        assert [h.seq for h in writer.vectors.search(b"\x00\x00\x80?\x00\x00\x00\x00", 1)] == [seq]
    finally:
        writer.close()


def _graph_options(conn: psycopg.Connection, workspace: str, gen: int, dims: int) -> list[str] | None:
    row = conn.execute("SELECT c.reloptions FROM pg_class AS c"
                       " WHERE c.oid = to_regclass(cm_vector_index_name(%s, %s, %s))",
                       (workspace, gen, dims)).fetchone()
    return None if row is None else sorted(row[0])


def test_graphs_built_after_the_lean_graph_migration_are_lean_and_older_ones_are_kept(empty_url: str) -> None:
    with psycopg.connect(empty_url, autocommit=True) as conn:
        _as_of(conn, "0007_vectors_apart_from_chunks")
        conn.execute("SELECT cm_add_partition('alpha')")
        conn.execute("INSERT INTO cm_workspaces(workspace, created_at) VALUES('alpha', 0)")
        conn.execute("INSERT INTO cm_chunks(workspace, gen, id, path, start_line, end_line, hash, text, updated_at,"
                     " terms, counts, length) VALUES('alpha', 0, 'c', 'MEMORY.md', 1, 1, 'h', 'alpha', 0, '{alpha}',"
                     " '{1}', 1), ('alpha', 1, 'c', 'MEMORY.md', 1, 1, 'h', 'alpha', 0, '{alpha}', '{1}', 1)")
        conn.execute("UPDATE cm_vectors SET embedded = true, model = 'm', dims = 2, embedding = '[1,0]'")
        assert conn.execute("SELECT cm_index_vectors('alpha', 0, 2)").fetchone() == (True,)
        migrate(conn)
        assert _graph_options(conn, "alpha", 0, 2) == ["ef_construction=48", "m=12"], "a graph built is kept"
        assert conn.execute("SELECT cm_index_vectors('alpha', 1, 2)").fetchone() == (True,)
        assert _graph_options(conn, "alpha", 1, 2) == ["ef_construction=32", "m=8"]


def test_a_search_through_a_lean_graph_keeps_a_wide_candidate_list(pg_url: str) -> None:
    store = PgStore(pg_url, "alpha")
    try:
        with store.transaction():
            seq = store.insert_chunk(id="c", path="MEMORY.md", source="memory", start_line=1, end_line=1, hash="h",
                                     text="alpha", fts_text="alpha")
        store.embeddings.store_vectors([(seq, "h", b"\x00\x00\x80?\x00\x00\x00\x00")], "m")
        store.vectors.build_index()
        store.data_version()
        for wanted, ef in ((6, "300"), (100, "400"), (5000, "1000")):
            assert [h.seq for h in store.vectors.search(b"\x00\x00\x80?\x00\x00\x00\x00", 6, candidates_for=wanted)] \
                == [seq]
            assert store.execute("SHOW hnsw.ef_search") == [(ef,)]
    finally:
        store.close()


def test_a_role_granted_the_cache_before_it_was_read_by_text_only_loses_the_table_and_keeps_the_lookups(
        empty_url: str, pg_role) -> None:  # type: ignore[no-untyped-def]
    role, _ = pg_role("writer")
    url = empty_url.replace("postgresql://postgres@", f"postgresql://{role}@")
    with psycopg.connect(empty_url, autocommit=True) as conn:
        _as_of(conn, "0008_leaner_vector_graphs")
        conn.execute("INSERT INTO cm_access VALUES(%s, 'alpha', true)", (role,))  # as grant_workspace did then
        conn.execute("SELECT cm_add_partition('alpha')")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON cm_embedding_cache TO {role}")
        conn.execute("INSERT INTO cm_embedding_cache VALUES('p', 'm', 'k', 'other', '\\x0000803f', 1, 0)")
        migrate(conn)
    with psycopg.connect(url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT hash FROM cm_embedding_cache")
        conn.execute("SELECT cm_cache('p', 'm', 'k', ARRAY['mine'], ARRAY['\\x00000040'::bytea], 1)")
        assert conn.execute("SELECT hash, embedding FROM cm_cached('p', 'm', 'k', ARRAY['mine', 'other'], NULL)"
                            " ORDER BY hash").fetchall() == [("mine", b"\x00\x00\x00@"), ("other", b"\x00\x00\x80?")]
        assert conn.execute("SELECT cm_uncached('p', 'm', 'k', ARRAY['mine', 'new', 'new'])").fetchall() == [("new",)]
