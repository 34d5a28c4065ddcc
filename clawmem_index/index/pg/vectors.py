"""The vectors of a shared index's chunks: pgvector rows ranked by cosine distance, their HNSW graphs, their writes.

Vectors are rows of their own (`cm_vectors`, one a chunk, made with it by a trigger and filled
when its vector comes), ranked by exact cosine distance, through a generation's HNSW index once
its embedding pass has built one. Every vector made also goes to the fleet-wide embedding cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

import psycopg

from clawmem_index.errors import IndexUnavailable
from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.interface import MetaPart
from clawmem_index.index.pg.connection import PgVector, vector_args
from clawmem_index.index.pg.live import Live, filter_sql
from clawmem_index.index.rows import VectorHit

__all__ = ["Owner", "Vectors"]


class Owner(Protocol):
    """What the vectors use of the store they belong to (`PgStore`): its connection, generation, meta and
    transactions, so their writes are the store's."""

    conn: Any
    workspace: str
    gen: int
    new_generation: bool

    def transaction(self) -> contextlib.AbstractContextManager[None]: ...
    def _atomic(self) -> contextlib.AbstractContextManager[None]: ...
    def _write(self, query: str, args: Any = None) -> psycopg.Cursor[Any]: ...
    @property
    def meta(self) -> MetaPart: ...
    def data_version(self) -> int: ...


class Vectors:
    """The vectors of one PgStore's generation, and searches of those of the workspaces in scope (`live`).

    Its writes are the store's: on its connection, in its transactions (which move the workspace's
    version), with its meta."""

    def __init__(self, store: Owner, live: Live) -> None:
        self._store = store
        self.conn = store.conn
        self.workspace = store.workspace
        self._live = live
        self._ef_search: int | None = None
        self._vector_dims: set[int] = set()  # noted in this generation's meta (`ensure`)
        self._vectors_indexed: set[tuple[int, int]] = set()  # (generation, dims) known to have their index

    @property
    def gen(self) -> int:
        """The store's generation (a switch or a reader's `data_version` moves it)."""
        return self._store.gen

    def search(self, query_blob: bytes, limit: int, where: ChunkFilter | None = None, *,
               candidates_for: int | None = None) -> list[VectorHit]:
        """The `limit` nearest chunks by cosine distance, nearest first (ties by seq).

        One search per workspace in scope, each through its generation's HNSW index when it has one
        (`build_index`): the index is partial, so the generation and dimensions are written into
        the query for the planner to match it. An iterative scan goes on past chunks a filter drops
        until `limit` pass; the distances are exact, the order is re-sorted on them.
        """
        if limit < 1 or not self._live.generations:
            return []
        dims = len(query_blob) // 4
        self._tune_hnsw(candidates_for or limit)
        condition, args = filter_sql(where, "c")
        arms = []
        for n, (workspace, gen) in enumerate(self._live.generations):
            args[f"w{n}"] = workspace
            arms.append(
                "(SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text,"
                f" v.embedding::vector({dims}) <=> %(q)b::vector({dims}) AS d, c.date, c.workspace"
                " FROM cm_vectors AS v JOIN cm_chunks AS c ON c.workspace = v.workspace AND c.seq = v.seq"
                f" WHERE v.workspace = %(w{n})s AND v.gen = {int(gen)} AND v.dims = {dims}"
                f" AND c.workspace = %(w{n})s AND {condition} ORDER BY d LIMIT %(limit)s)")
        rows = self.conn.execute(
            f"SELECT * FROM ({' UNION ALL '.join(arms)}) AS near ORDER BY d, seq LIMIT %(limit)s",
            {**args, "q": PgVector(query_blob), "limit": limit}).fetchall()
        return [VectorHit.of((int(r[0]), *r[1:6], r[7], r[8]), float(r[6])) for r in rows]

    def _tune_hnsw(self, wanted: int) -> None:
        """How many candidates an HNSW search keeps: four times the rows the search needs
        (`candidates_for`: a read ahead past them continues the scan), at least 300, at most 1000
        (pgvector's bound). The graphs are lean (m 8, built fast) and searched wide: recall@10 0.987
        against the exact order on real vectors (docs/benchmarks.md). Each workspace's index holds
        only its own vectors (its partition's)."""
        ef = min(1000, max(300, 4 * wanted))
        if ef != self._ef_search:
            self.conn.execute(f"SET hnsw.ef_search = {ef}")
            if self._ef_search is None:
                self.conn.execute("SET hnsw.iterative_scan = relaxed_order")
            self._ef_search = ef

    def distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        if not seqs:
            return {}
        scope, args = self._live.sql("v")
        return {int(seq): float(d) for seq, d in self.conn.execute(
            f"SELECT v.seq, v.embedding <=> %(q)b::vector FROM cm_vectors AS v WHERE v.seq = ANY(%(seqs)s) AND {scope}"
            " AND v.embedding IS NOT NULL AND v.dims = %(dims)s",
            {**args, "q": PgVector(query_blob), "seqs": list(seqs), "dims": len(query_blob) // 4})}

    def readable(self) -> bool:
        """Always: pgvector is the server's."""
        return True

    def in_cells(self) -> bool:
        """Never: pgvector's HNSW graph answers deeper reads itself."""
        return False

    def method(self) -> str:
        """HNSW when every workspace in scope has its index for the vectors it holds; an exact scan
        (slower, never wrong) while one waits for its embedding pass to end (see `build_index`)."""
        self._store.data_version()
        missing = self.conn.execute(
            "SELECT count(*) FROM cm_meta AS m JOIN unnest(%s::text[], %s::bigint[]) AS l(w, g)"
            " ON m.workspace = l.w AND m.gen = l.g WHERE m.key = 'vector_dims'"
            " AND to_regclass(quote_ident(cm_vector_index_name(l.w, l.g, m.value::integer))) IS NULL",
            ([w for w, _ in self._live.generations], [g for _, g in self._live.generations])).fetchone()
        if missing and missing[0]:
            return "pgvector exact cosine scan (the HNSW index is built when the embedding pass ends)"
        return "pgvector HNSW (cosine), exact distances"

    def ensure(self, dims: int, precision: str = "float32") -> None:
        """Note that this generation holds vectors of `dims` dimensions (`vector_dims`, as SQLite's store).

        Their HNSW index is not made here: pgvector keeps one up to date row by row, which cost a
        cold index nine tenths of its vector writes. `build_index` builds it whole at the end of
        the embedding pass. Vectors are float32 here (`precision` float16 is refused by the settings).
        """
        if precision != "float32":
            raise ValueError("the shared PostgreSQL index stores float32 vectors only")
        if dims in self._vector_dims:
            return
        self._vector_dims.add(dims)
        if self._store.meta.get("vector_dims") != str(int(dims)):
            self._store.meta.set("vector_dims", str(int(dims)))

    def build_index(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Build this generation's HNSW index from the vectors stored, if it has none yet (each
        generation and size of vector has its own: a rebuild's is made before its switch).
        One statement in the server: no `progress` to report.

        Through `cm_index_vectors`, which runs as the tables' owner for any role that may write the
        workspace, with memory for the graph. The build holds writes to this workspace's rows
        (its writer's own, being this one), not reads. A role that may not build it leaves
        searches to scan exactly: slower, never wrong.
        """
        dims = self._store.meta.get("vector_dims")
        if dims is None or (self.gen, int(dims)) in self._vectors_indexed:
            return
        try:
            with self._store._atomic():
                built = self.conn.execute("SELECT cm_index_vectors(%s, %s, %s)",
                                          (self.workspace, self.gen, int(dims))).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return
        self._vectors_indexed.add((self.gen, int(dims)))
        if built and built[0] and not self._store.new_generation and not self.conn.in_transaction:
            self.drop_stale_indexes()  # the graph of a size of vector this generation no longer holds

    def release_index(self) -> None:
        """Before every vector of this generation is replaced in place (a model switch): drop its graphs.

        Kept, the graph would take each new vector one by one; dropped, searches scan exactly until
        `build_index` builds the new one whole at the end of the fill (status says which). Run
        outside any transaction: the DROP's exclusive lock on the partition lasts only this statement,
        not the switch.
        """
        if self.conn.in_transaction:
            return
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            self.conn.execute("SELECT cm_drop_generation_vector_indexes(%s, %s)", (self.workspace, self.gen))
        self._vectors_indexed = {key for key in self._vectors_indexed if key[0] != self.gen}

    def drop_stale_indexes(self) -> None:
        """The HNSW indexes of generations (or sizes of vector) no longer live: each held its rows' graph.
        One that cannot be dropped now (a reader of the workspace holds its lock past the function's
        lock_timeout) goes at a later drop: searches never read a graph of a generation not live."""
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege, IndexUnavailable):
            self.conn.execute("SELECT cm_drop_vector_indexes(%s)", (self.workspace,))

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        self._store._write("UPDATE cm_vectors SET embedded = true, model = %s, dims = %s, embedding = %b::vector"
                           " WHERE seq = %s AND workspace = %s AND gen = %s",
                           (model, *vector_args(blob), seq, self.workspace, self.gen))

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> list[tuple[int, bytes]]:
        """Each chunk's vector if it still waits for the text `hash` names (see ChunkVectors.store_vectors).

        One statement for the batch, the vectors bound as one binary array: an UPDATE a vector
        cost twice the server's time (each statement's own start, plan and round trip)."""
        if not items:
            return []
        self.conn.type_vectors()
        columns: tuple[list[Any], ...] = ([], [], [], [])
        for seq, h, blob in items:
            dims, vector = vector_args(blob)
            for column, value in zip(columns, (seq, h, dims, vector), strict=True):
                column.append(value)
        with self._store.transaction():
            given = {int(row[0]) for row in self.conn.execute(
                "UPDATE cm_vectors AS v SET embedded = true, model = %b, dims = u.dims, embedding = u.embedding"
                " FROM unnest(%b::bigint[], %b::text[], %b::integer[], %b::vector[]) AS u(seq, hash, dims, embedding)"
                " WHERE v.workspace = %b AND v.gen = %b AND v.seq = u.seq AND v.hash = u.hash AND NOT v.embedded"
                " RETURNING v.seq", (model, *columns, self.workspace, self.gen), binary=True)}
        return [(seq, blob) for seq, _, blob in items if seq in given]  # type: ignore[misc]

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT v.seq, v.hash, c.text FROM cm_vectors AS v JOIN cm_chunks AS c ON c.workspace = v.workspace"
            " AND c.seq = v.seq WHERE v.workspace = %s AND v.gen = %s AND NOT v.embedded AND v.seq > %s"
            " AND c.workspace = %s ORDER BY v.seq LIMIT %s", (self.workspace, self.gen, after, self.workspace, limit))]

    def reset_vectors(self, next_owner: tuple[str, str, str] | None = None, precision: str = "float32") -> int:
        """Forget this generation's vectors (a new model's go in their place; the cache keeps the old ones,
        as the fleet's cache keeps every vector: nothing to park)."""
        with self._store._atomic():
            cur = self.conn.execute("UPDATE cm_vectors SET embedded = false, model = '', dims = NULL, embedding = NULL"
                                    " WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))
            self._store.meta.delete("vector_dims")
        self._vector_dims.clear()
        return int(cur.rowcount)

    def uncached_pending(self, provider: str, model: str, key: str, *,
                         exclude: Collection[str] = ()) -> dict[str, str]:
        rows = self.conn.execute(
            "WITH pending AS (SELECT c.hash, c.text FROM cm_vectors AS v JOIN cm_chunks AS c"
            " ON c.workspace = v.workspace AND c.seq = v.seq WHERE v.workspace = %s AND v.gen = %s AND NOT v.embedded"
            " AND c.workspace = %s) SELECT p.hash, p.text FROM pending AS p"
            " WHERE p.hash IN (SELECT cm_uncached(%s, %s, %s, ARRAY(SELECT hash FROM pending)))",
            (self.workspace, self.gen, self.workspace, provider, model, key))
        return {str(h): str(text) for h, text in rows if h not in exclude}

