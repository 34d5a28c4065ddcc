"""The vector index: float32 vectors beside the chunks, searched by cosine distance.

`chunks_vec` is a plain table of float32 blobs: exact distances, and the scan when sqlite-vec is
missing. With sqlite-vec, `chunks_vec_bits` (vec0) holds each vector's sign bits, split into
partitions by seq. An exact scan of 100k 384-d vectors reads ~150 MB per query; a query here takes
the nearest candidates by hamming distance from every partition (vec0's KNN cost grows with N * k,
so several small-k KNNs beat one large one) and ranks them by exact cosine.

Past CELL_MIN vectors the sign bits move into k-means cells instead (clawmem_index.index.vector_cells): a
query reads the cells nearest it, not every vector's bits, so its cost stops growing with the index.

At half precision (`embedding.precision = "float16"`) the table is `chunks_vec_half`, of float16
blobs: half the bytes for no measured loss of recall (1M vectors: recall@10 0.965 against 0.967),
ranked exactly in numpy since sqlite-vec has no float16 distance. Vectors come in and go out (to the
embedding cache) as float32 whatever the table holds. Its own name, not a flag: a clawmem that
knows no half precision sees no vectors there (and embeds again) instead of reading float16 as float32.

Rows are keyed by the chunk's `seq`; whether a chunk waits for a vector is the chunks table's
business (the store's), so this module only stores, drops and ranks vectors.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, cast

import apsw

from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.rows import VectorHit
from clawmem_index.index.schema import Meta
from clawmem_index.index.vector_blobs import (
    are_usable,
    float32_of_half,
    half_of_float32,
    pad8,
    padded_dims,
    to_stored,
)
from clawmem_index.index.vector_cells import SharedCells, VectorCells

__all__ = ["MIN_CANDIDATES", "OVERSAMPLE", "PRECISIONS", "PREFIX_SCAN_ROWS", "VECTOR_PARTITIONS", "VectorHit",
           "VectorIndex", "candidate_count"]

PRECISIONS = {"float32": "<f4", "float16": "<f2"}  # how the vector table stores a vector, and its numpy dtype
FLOATS, HALVES = "chunks_vec", "chunks_vec_half"  # the vector table at float32 and at float16

VECTOR_PARTITIONS = 32
# sqlite-vec gives each partition its slots a chunk at a time. With 1,024-slot chunks a small index is
# mostly empty slots (32 partitions x 1,024: 1.9 MB of 384-d bits for 2,000 vectors) and its prefilter
# reads them all: 256-slot chunks make it a third of the size and 2-3x faster up to 16k vectors, and
# slower past ~24k (docs/benchmarks.md, stop 33). A table whose vectors cross those lines (with a margin,
# so that none is rebuilt back and forth) is made again after an embedding pass.
BITS_CHUNK, BITS_CHUNK_SMALL = 1024, 256
BITS_SMALL_MAX = 16_384  # vectors for which a new table gets small chunks
BITS_SMALL_OUTGROWN = 24_576  # vectors past which a small-chunk table is rebuilt with large chunks
BITS_LARGE_OUTGROWN = 8_192  # vectors at or below which a large-chunk table (older ones too) is rebuilt small
# Hamming candidates per wanted hit: recall@k >= 99.4% on real MiniLM vectors, 8k SciFact chunks and 53k
# SciFact sentences (bench_vectors.py); 32 fell to 98.9% at 53k.
OVERSAMPLE = 40
MIN_CANDIDATES = 512
OVERSAMPLE_DIMS = 384  # the width both were tuned at; wider vectors need fewer (candidate_count)
PREFIX_SCAN_ROWS = 8192  # a path prefix over at most this many chunks is ranked exactly (~1.6 us a vector)
PREFIX_WIDEN = 4  # at most this many times the candidates to find enough under a prefix, else rank it exactly
_KNN_MAX_K = 4096  # sqlite-vec refuses a larger k
_SCAN_BATCH = 8192  # vectors decoded at a time by the scan without sqlite-vec
_BITS_STALE = "vector_bits_stale"  # meta key: vectors were written without sqlite-vec, the bits miss them
FLOAT32_SQL = "clawmem_float32"  # SQL function: a stored blob as float32 (registered on every connection)
HALF_SQL = "clawmem_half"  # SQL function: a float32 blob as float16, NULL if it has no direction there


@dataclass(frozen=True, slots=True)
class _VectorLayout:
    readable: bool  # chunks_vec exists and can be read (a schema-1 vec0 table needs sqlite-vec)
    legacy: bool  # chunks_vec is the vec0 float table of schema 1
    bits: bool  # chunks_vec_bits exists
    bits_chunk: int  # its vec0 chunk_size (slots a partition is given at a time)
    cells: bool  # chunks_vec_cells exists, chunks_vec_bits does not: the cells find the candidates
    stale_cells: bool  # both exist: a writer that knows no cells (an older clawmem) wrote the bits since
    dims: int
    partitions: int
    half: bool = False  # the vectors are float16, in chunks_vec_half
    stray_half: bool = False  # chunks_vec_half beside chunks_vec: left by a switch an older clawmem made, dropped

    @property
    def dtype(self) -> str:
        return PRECISIONS["float16" if self.half else "float32"]

    @property
    def table(self) -> str:
        return HALVES if self.half else FLOATS



def _on_blobs(convert: Callable[[bytes | None], bytes | None]) -> Callable[..., bytes | None]:
    """`convert` as SQL calls it: a value that is not a blob is no vector (NULL)."""
    return lambda value: convert(value if isinstance(value, bytes) else None)

class VectorIndex:
    """chunks_vec (+ chunks_vec_bits) on one connection; `loaded`: sqlite-vec is loaded there; `shared_cells`:
    the cells' centroids and members this connection shares with the other readers of its process."""

    def __init__(self, conn: apsw.Connection, meta: Meta, transaction: Callable[[], AbstractContextManager[None]], *,
                 loaded: bool, shared_cells: SharedCells | None = None) -> None:
        self._conn = conn
        self._transaction = transaction
        self._meta = meta
        self.loaded = loaded
        self._layout: tuple[int, _VectorLayout] | None = None
        self._cells = VectorCells(conn, meta, lambda: (self.layout().table, self.layout().dtype), shared_cells)
        conn.create_scalar_function(FLOAT32_SQL, _on_blobs(float32_of_half), 1, deterministic=True)
        conn.create_scalar_function(HALF_SQL, _on_blobs(half_of_float32), 1, deterministic=True)

    def layout(self) -> _VectorLayout:
        """The vector tables this file has, re-read when the schema changes (another connection may add them)."""
        cookie = int(self._conn.execute("PRAGMA schema_version").get)
        if self._layout is None or self._layout[0] != cookie:
            sql = {str(name): str(text) for name, text in self._conn.execute(
                "SELECT name, sql FROM sqlite_master"
                " WHERE name IN ('chunks_vec', 'chunks_vec_half', 'chunks_vec_bits', 'chunks_vec_cells')")}
            floats = sql.get(FLOATS)
            legacy = floats is not None and floats.upper().startswith("CREATE VIRTUAL")
            half = floats is None and HALVES in sql
            layout = _VectorLayout(
                readable=half or (floats is not None and (self.loaded or not legacy)), legacy=legacy,
                bits="chunks_vec_bits" in sql,
                bits_chunk=_chunk_size(sql.get("chunks_vec_bits", "")),
                cells="chunks_vec_cells" in sql and "chunks_vec_bits" not in sql,
                stale_cells="chunks_vec_cells" in sql and "chunks_vec_bits" in sql,
                dims=int(self._meta.get("vector_dims") or 0),
                partitions=int(self._meta.get("vector_partitions") or VECTOR_PARTITIONS),
                half=half, stray_half=floats is not None and HALVES in sql)
            self._layout = (cookie, layout)
        return self._layout[1]

    def readable(self) -> bool:
        """Whether stored vectors can be searched (a schema-1 vec0 table needs sqlite-vec)."""
        return self.layout().readable

    def method(self) -> str:
        """How `search` answers on this connection (for diagnostics and benchmarks)."""
        layout = self.layout()
        if not layout.readable:
            return "none"
        if not self.loaded:
            return "in-process cosine (sqlite-vec not loaded)"
        rescoring = "exact cosine rescoring of float16 vectors in numpy" if layout.half else "exact cosine rescoring"
        if layout.cells:
            return f"k-means cells of sign bits, {rescoring}"
        if layout.bits and self._meta.get(_BITS_STALE) is None:
            return f"sqlite-vec binary-quantized KNN, {rescoring}"
        return "exact cosine scan of float16 vectors in numpy" if layout.half else "sqlite-vec exact cosine scan"

    def in_cells(self) -> bool:
        """Whether a search reads k-means cells (a large index: a deeper read ranks thousands of vectors fetched
        one by one, tens of milliseconds)."""
        return self.layout().cells

    def build_index(self, progress: Callable[[int, int], None] | None = None) -> None:
        """After an embedding pass, in one transaction: `maintain`."""
        with self._transaction():
            self.maintain(progress)

    def release_index(self) -> None:
        """Before every vector is replaced in place: nothing to drop here (no graph is kept)."""

    def ensure(self, dims: int, precision: str = "float32") -> None:
        """The tables for `dims`-d vectors; with sqlite-vec, also (re)builds sign bits that are missing or stale.

        `precision` is that of a new table; an existing one keeps its own until `drop_all` (a change
        of precision changes the fingerprint, which replaces every vector).
        """
        layout = self.layout()
        if layout.legacy:
            return  # a schema-1 index: the fingerprint rebuilds it, so it is never written
        if layout.stray_half:
            self._conn.execute(f"DROP TABLE {HALVES}")
        if not layout.readable:
            self.create(dims, precision)
        if self.loaded and not layout.cells and (not layout.bits or self._meta.get(_BITS_STALE) is not None):
            self._build_bits(dims, replace=layout.bits)

    def maintain(self, progress: Callable[[int, int], None] | None = None) -> None:
        """After an embedding pass: move the sign bits into cells past CELL_MIN vectors, rebuild or drop them.

        `progress`: told how a cells build goes (VectorCells.build); nothing else here takes long.

        Counted from the chunks' own indexes (a count of chunks_vec would read every vector). Cells
        beside sign bits were missed by a writer that knows no cells: the bits answer until they are rebuilt.
        """
        layout = self.layout()
        if not layout.readable or layout.legacy or not layout.dims or (layout.bits and not self.loaded):
            return  # a vec0 table can only be dropped with sqlite-vec loaded
        chunks = int(self._conn.execute("SELECT count(*) FROM chunks").get)
        pending = int(self._conn.execute("SELECT count(*) FROM chunks WHERE embedded = 0").get)
        action = self._cells.due(chunks - pending, layout.cells or layout.stale_cells)
        if layout.stale_cells and action is None:
            action = "build"
        if action == "build" and self._cells.build(layout.dims, progress):
            self._conn.execute("DROP TABLE IF EXISTS chunks_vec_bits")
            self._meta.delete(_BITS_STALE)
        elif action == "drop":
            self._cells.drop()
            if self.loaded:
                self._build_bits(layout.dims, replace=layout.bits)
        elif layout.bits and self.loaded and _rechunk(layout.bits_chunk, chunks - pending):
            self._build_bits(layout.dims, replace=True)

    def create(self, dims: int, precision: str) -> None:
        """A new, empty vector table. Filled by `insert_rows` (a rebuild taking the vectors of the file
        it replaces), its sign bits or cells are the caller's to make after (`maintain`, then `ensure`)."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown vector precision {precision!r}")
        table = HALVES if precision == "float16" else FLOATS
        self._conn.execute(f"CREATE TABLE {table}(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")
        self._meta.set("vector_dims", str(int(dims)))

    def insert_rows(self, rows: str, params: Sequence[object]) -> int:
        """Vectors selected by `rows` (rowid, blob as the table stores it), by one statement; how many went in."""
        self._conn.execute(f"INSERT INTO {self.table()}(rowid, embedding) {rows}", tuple(params))
        return int(self._conn.changes())

    def _build_bits(self, dims: int, *, replace: bool) -> None:
        """Quantize every stored vector: a new table, or one that missed writes made without sqlite-vec.

        Its chunk size is chosen by how many vectors the index will hold: its chunks (a first pass is
        about to embed them all)."""
        if replace:
            self._conn.execute("DROP TABLE chunks_vec_bits")
        chunks = int(self._conn.execute("SELECT count(*) FROM chunks").get)
        chunk_size = BITS_CHUNK_SMALL if chunks <= BITS_SMALL_MAX else BITS_CHUNK
        self._conn.execute(f"CREATE VIRTUAL TABLE chunks_vec_bits USING vec0(chunk_size={chunk_size},"
                           f" part INTEGER PARTITION KEY, embedding bit[{padded_dims(int(dims))}])")
        self._meta.set("vector_partitions", str(VECTOR_PARTITIONS))
        pad = 4 * ((-int(dims)) % 8)  # as pad8: zeros to a multiple of 8 dimensions
        vector = self.sql_float32("embedding")
        padded = f"CAST({vector} || zeroblob({pad}) AS BLOB)" if pad else vector
        self._conn.execute(  # one statement: a row at a time gives up and retakes the GIL for each
            f"INSERT INTO chunks_vec_bits(rowid, part, embedding) SELECT rowid, rowid % ?,"
            f" vec_quantize_binary(vec_f32({padded})) FROM {self.table()}", (VECTOR_PARTITIONS,))
        self._meta.delete(_BITS_STALE)

    def remove(self, seq: int) -> None:
        """Drop a chunk's vector, if it has one."""
        layout = self.layout()
        if not layout.readable:
            return
        self._conn.execute(f"DELETE FROM {layout.table} WHERE rowid = ?", (seq,))
        if layout.cells:
            self._cells.removed(self._conn.changes())
        elif layout.bits and self._conn.changes():
            if self.loaded:
                self._conn.execute("DELETE FROM chunks_vec_bits WHERE rowid = ?", (seq,))
            else:
                self._meta.set(_BITS_STALE, "1")

    def put(self, items: Sequence[tuple[int, bytes | None]]) -> None:
        """Store each chunk's vector in place of any it had (None, zero or not finite: dropped, never stored)."""
        layout = self.layout()
        if layout.readable:  # a vector left by an older version (or an earlier answer) is replaced
            stale = cast("list[tuple[int]]", self._conn.execute(
                f"SELECT rowid FROM {layout.table} WHERE rowid IN (SELECT value FROM json_each(?))",
                (json.dumps([seq for seq, _ in items]),)).fetchall())
            for (seq,) in stale:
                self.remove(seq)
        given = [(seq, blob) for seq, blob in items if blob is not None]
        vectors = [item for item, usable in zip(given, are_usable([blob for _, blob in given], layout.dtype),
                                                strict=True) if usable]
        if layout.dims and any(len(blob) != 4 * layout.dims for _, blob in vectors):
            raise ValueError(f"a vector of another size than the index's {layout.dims} dimensions")
        if not vectors:
            return
        seqs = json.dumps([seq for seq, _ in vectors])
        stored = [to_stored(blob, layout.dtype) for _, blob in vectors]
        self._conn.execute(f"INSERT INTO {layout.table}(rowid, embedding) {_SLICED}",
                           (seqs, b"".join(stored), len(stored[0])))
        if layout.cells:
            self._cells.add(vectors)
        elif layout.bits:
            if self.loaded:
                padded = [pad8(blob) for _, blob in vectors]
                self._conn.execute("INSERT INTO chunks_vec_bits(rowid, part, embedding) SELECT value, value % ?4,"
                                   " vec_quantize_binary(vec_f32(substr(?2, key * ?3 + 1, ?3))) FROM json_each(?1)",
                                   (seqs, b"".join(padded), len(padded[0]), layout.partitions))
            else:
                self._meta.set(_BITS_STALE, "1")

    def drop_all(self) -> None:
        """Forget every vector and the layout (a new model's vectors go in their place)."""
        self._conn.execute("DROP TABLE IF EXISTS chunks_vec_bits")
        self._cells.drop()
        self._conn.execute(f"DROP TABLE IF EXISTS {FLOATS}")
        self._conn.execute(f"DROP TABLE IF EXISTS {HALVES}")
        self._meta.delete("vector_dims", "vector_partitions", _BITS_STALE)

    def table(self) -> str:
        """The name of the table that holds the vectors (FLOATS or HALVES)."""
        return self.layout().table

    def float32(self, blob: bytes) -> bytes:
        """A stored vector as float32 (what providers give and the embedding cache keeps)."""
        return (float32_of_half(blob) or b"") if self.layout().half else blob

    def sql_float32(self, column: str, *, half: bool | None = None) -> str:
        """An SQL expression reading a stored `column` as float32 (`half`: that of another file's table)."""
        return f"{FLOAT32_SQL}({column})" if (self.layout().half if half is None else half) else column

    def search(self, query_blob: bytes, limit: int, where: ChunkFilter | None = None, *,
               candidates_for: int | None = None) -> list[VectorHit]:
        """The `limit` chunks nearest by cosine distance (exact distances), nearest first, within `where`.

        `candidates_for`: oversample the sign-bit candidates for this many hits instead of `limit`
        (a search reading ahead ranks more of the same candidates, at no extra prefilter cost).
        """
        layout = self.layout()
        if not layout.readable or limit < 1:
            return []
        where = where or None
        exact = self._vector_scan if layout.half or not self.loaded else self._ranked  # sqlite-vec: float32 only
        prefilter = layout.cells or (self.loaded and layout.bits and self._meta.get(_BITS_STALE) is None)
        if not prefilter or (where and self._few_under(where)):
            return exact(query_blob, limit, where)
        want = candidate_count(min(limit, candidates_for or limit), len(query_blob) // 4)
        among = self._candidates(query_blob, want, layout.partitions)
        if among is not None and where:
            among = self._candidates_under(where, among, query_blob, want, layout.partitions)
        if among is None:
            return exact(query_blob, limit, where)
        return exact(query_blob, limit, None, among)

    def distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        """The cosine distance `search` would give each of `seqs` that has a vector."""
        layout = self.layout()
        if not layout.readable or not seqs:
            return {}
        among = json.dumps(list(seqs))
        if self.loaded and not layout.half:
            return {int(seq): float(distance) for seq, distance in self._conn.execute(
                f"SELECT rowid, vec_distance_cosine(embedding, ?) FROM {layout.table} WHERE rowid IN"
                " (SELECT value FROM json_each(?))", (query_blob, among))}
        rows = cast("list[tuple[int, bytes]]", self._conn.execute(
            f"SELECT rowid, embedding FROM {layout.table} WHERE rowid IN (SELECT value FROM json_each(?))",
            (among,)).fetchall())
        import numpy as np  # the same arithmetic as `_vector_scan`

        query = np.frombuffer(query_blob, dtype="<f4").astype(np.float64)
        return {int(seq): float(1.0 - np.frombuffer(blob, dtype=layout.dtype).astype(np.float64) @ query)
                for seq, blob in rows}

    def _candidates(self, query_blob: bytes, want: int, partitions: int) -> list[int] | None:
        """About `want` seqs nearest by hamming distance, an equal share from each partition (None: vec0's k limit)."""
        if self.layout().cells:
            return self._cells.candidates(query_blob, want)
        per_part = -(-want // partitions)
        if per_part > _KNN_MAX_K:
            return None
        bits = self._conn.execute("SELECT vec_quantize_binary(vec_f32(?))", (pad8(query_blob),)).get
        seqs: list[int] = []
        for part in range(partitions):
            seqs.extend(int(row[0]) for row in self._conn.execute(
                "SELECT rowid FROM chunks_vec_bits WHERE embedding MATCH vec_bit(?) AND k = ? AND part = ?",
                (bits, per_part, part)))
        return seqs

    def _ranked(self, query_blob: bytes, limit: int, within: ChunkFilter | None,
                among: list[int] | None = None) -> list[VectorHit]:
        """Exact cosine ranking in SQL of `among`, or of every vector (within the filter if given)."""
        args: dict[str, Any] = {"q": query_blob, "k": limit}
        join, where = "", []
        if among is not None:
            where.append("v.rowid IN (SELECT value FROM json_each(:among))")
            args["among"] = json.dumps(among)
        if within:  # walks the chunks' path or date index over the range, not the whole table
            join = " JOIN chunks AS p ON p.seq = v.rowid"
            clause, bounds = within.sql("p")
            where.append(clause)
            args.update(bounds)
        sql = (
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, r.distance, c.date FROM"
            " (SELECT v.rowid AS seq, vec_distance_cosine(v.embedding, :q) AS distance FROM chunks_vec AS v"
            f"{join}{' WHERE ' + ' AND '.join(where) if where else ''} ORDER BY distance, v.rowid LIMIT :k) AS r"
            " JOIN chunks AS c ON c.seq = r.seq ORDER BY r.distance, r.seq"
        )
        return [VectorHit(*row) for row in self._conn.execute(sql, args)]

    def _candidates_under(self, within: ChunkFilter, among: list[int], query_blob: bytes, want: int,
                          partitions: int) -> list[int] | None:
        """The candidates within the filter, enough of them for the oversampling; None: rank the filter's chunks
        exactly.

        When few candidates pass, fetch proportionally more (vec0's cost grows with k), up to
        PREFIX_WIDEN times; a filter with still fewer vectors near the query is ranked exactly.
        """
        inside = self._under(within, among)
        if 4 * len(inside) >= 3 * want:
            return inside
        if not inside or len(inside) * PREFIX_WIDEN < len(among):
            return None
        wider = self._candidates(query_blob, want * len(among) // len(inside), partitions)
        return None if wider is None else self._under(within, wider)

    def _few_under(self, within: ChunkFilter) -> bool:
        """Whether at most PREFIX_SCAN_ROWS chunks pass the filter (counted on the index, stopping there)."""
        clause, args = within.sql("c")
        counted = self._conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM chunks AS c WHERE {clause} LIMIT {PREFIX_SCAN_ROWS + 1})", args)
        return int(counted.get) <= PREFIX_SCAN_ROWS

    def _under(self, within: ChunkFilter, seqs: list[int]) -> list[int]:
        clause, args = within.sql("c")
        return [int(row[0]) for row in self._conn.execute(
            f"SELECT c.seq FROM chunks AS c WHERE c.seq IN (SELECT value FROM json_each(:seqs)) AND {clause}",
            {**args, "seqs": json.dumps(seqs)})]

    def _vector_scan(self, query_blob: bytes, limit: int, within: ChunkFilter | None,
                     among: list[int] | None = None) -> list[VectorHit]:
        """Without sqlite-vec, or at half precision: cosine distances in numpy over every vector (or `among`),
        read a batch at a time."""
        import numpy as np

        dtype = self.layout().dtype

        query = np.frombuffer(query_blob, dtype="<f4").astype(np.float64)
        sql = f"SELECT rowid, embedding FROM {self.table()}"
        rows = self._conn.execute(sql) if among is None else self._conn.execute(
            f"{sql} WHERE rowid IN (SELECT value FROM json_each(?))", (json.dumps(among),))
        seqs: list[Any] = []
        distances: list[Any] = []
        while batch := list(itertools.islice(rows, _SCAN_BATCH)):
            vectors = np.frombuffer(b"".join(bytes(blob) for _, blob in batch), dtype=dtype).reshape(len(batch), -1)
            seqs.append(np.fromiter((seq for seq, _ in batch), dtype=np.int64, count=len(batch)))
            distances.append(1.0 - vectors.astype(np.float64) @ query)
        if not seqs:
            return []
        all_seqs, all_distances = np.concatenate(seqs), np.concatenate(distances)
        order = np.lexsort((all_seqs, all_distances))
        clause, args = (within or ChunkFilter()).sql("c")
        hits: list[VectorHit] = []
        for start in range(0, len(order), max(4 * limit, 64)):  # nearest first, a slice at a time through the filter
            picked = order[start:start + max(4 * limit, 64)]
            found = {int(row[0]): row for row in self._conn.execute(
                "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, c.date FROM chunks AS c"
                f" WHERE c.seq IN (SELECT value FROM json_each(:seqs)) AND {clause}",
                {**args, "seqs": json.dumps(all_seqs[picked].tolist())})}
            for position in picked.tolist():
                row = found.get(int(all_seqs[position]))
                if row:
                    hits.append(VectorHit.of(row, float(all_distances[position])))
                    if len(hits) >= limit:
                        return hits
        return hits


def candidate_count(hits: int, dims: int) -> int:
    """Sign-bit candidates ranked exactly for the `hits` nearest of `dims`-wide vectors.

    One bit a dimension estimates the angle with an error shrinking as 1/sqrt(bits), so wider vectors
    need proportionally fewer candidates for the same recall: 1M 1,536-d vectors with half of 384-d's
    share keep recall@10 0.975 and recall@256 0.951, in 13 ms instead of 19 (docs/benchmarks.md).
    Never more than at 384-d, where the shares were tuned.
    """
    share = min(1.0, math.sqrt(OVERSAMPLE_DIMS / max(dims, 1)))
    return max(math.ceil(hits * OVERSAMPLE * share), math.ceil(MIN_CANDIDATES * share))


# A batch of vectors stored by one statement: ?1 their seqs (a JSON array), ?2 the vectors end to end,
# ?3 the bytes of one. A statement a row (executemany) gives up the GIL and takes it back at every row,
# and behind a busy thread (the one reading the provider's answers) each take waits out Python's switch
# interval: 87k vectors with one pure-Python thread beside them took 616 s (2.6 s alone); now 28 s.
_SLICED = "SELECT value, substr(?2, key * ?3 + 1, ?3) FROM json_each(?1)"


def _rechunk(chunk_size: int, vectors: int) -> bool:
    """Whether a sign-bit table with chunks of `chunk_size` slots is to be made again for `vectors` vectors."""
    if chunk_size < BITS_CHUNK:
        return vectors > BITS_SMALL_OUTGROWN
    return chunk_size > BITS_CHUNK_SMALL and vectors <= BITS_LARGE_OUTGROWN


def _chunk_size(sql: str) -> int:
    """The chunk_size a vec0 table was made with (sqlite-vec's default when its statement names none)."""
    found = re.search(r"chunk_size\s*=\s*(\d+)", sql)
    return int(found.group(1)) if found else BITS_CHUNK
