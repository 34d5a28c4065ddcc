"""The only module that speaks SQL: connection, schema, migrations, reads and writes.

Python's stdlib sqlite3 often cannot load extensions, so the connection is apsw (a current SQLite
with FTS5, able to load sqlite-vec everywhere). apsw runs in autocommit mode; `transaction()` is
the one way to group writes, nesting as savepoints.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import stat
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from clawmem.errors import IndexCorrupt, IndexUnavailable

__all__ = ["ChunkFilter", "ChunkRow", "FileRow", "JobRow", "Store", "TextHit", "VectorHit", "make_private_dirs", "make_private_file"]

SCHEMA_VERSION = 2  # 2: float32 vectors in a plain table, sign bits in a partitioned vec0 table

VECTOR_PARTITIONS = 32
# Hamming candidates per wanted hit: recall@k >= 99.4% on real MiniLM vectors, 8k SciFact chunks and 53k
# SciFact sentences (bench_vectors.py); 32 fell to 98.9% at 53k.
OVERSAMPLE = 40
MIN_CANDIDATES = 512
PREFIX_SCAN_ROWS = 8192  # a path prefix over at most this many chunks is ranked exactly (~1.6 us a vector)
PREFIX_WIDEN = 4  # at most this many times the candidates to find enough under a prefix, else rank it exactly
_KNN_MAX_K = 4096  # sqlite-vec refuses a larger k
_BITS_STALE = "vector_bits_stale"  # meta key: vectors were written without sqlite-vec, the bits miss them


@dataclass(frozen=True, slots=True)
class FileRow:
    """`state` is what an incremental source keeps between syncs (a transcript's indexed length), as JSON."""

    path: str
    source: str
    hash: str
    mtime: int
    size: int
    state: str = ""


@dataclass(frozen=True, slots=True)
class ChunkFilter:
    """What a search may return: under a path, from one source, dated within [since, before).

    Applied inside the candidate queries (keyword and vector), never to a top-k already cut, which
    would lose matches. A date bound leaves out undated chunks (MEMORY.md, notes without a date).
    """

    path_prefix: str | None = None
    source: str | None = None
    since: str | None = None  # ISO date, inclusive
    before: str | None = None  # ISO date, exclusive

    def __bool__(self) -> bool:
        return any((self.path_prefix, self.source, self.since, self.before))

    @property
    def dated(self) -> bool:
        return self.since is not None or self.before is not None

    def sql(self, alias: str) -> tuple[str, dict[str, Any]]:
        """A condition on the chunks table under `alias` (an index answers the path and date parts as ranges)."""
        clauses: list[str] = []
        args: dict[str, Any] = {}
        if self.path_prefix:
            clause, args = _prefix_range(f"{alias}.path", self.path_prefix)
            clauses.append(clause)
        if self.source:
            clauses.append(f"{alias}.source = :source")
            args["source"] = self.source
        if self.since:
            clauses.append(f"{alias}.date >= :since")
            args["since"] = self.since
        if self.before:
            clauses.append(f"{alias}.date < :before")
            args["before"] = self.before
        return " AND ".join(clauses) or "1", args


@dataclass(frozen=True, slots=True)
class ChunkRow:
    seq: int
    id: str
    path: str
    start_line: int
    end_line: int
    hash: str
    text: str


@dataclass(frozen=True, slots=True)
class JobRow:
    """A provider batch job the index waits on: which chunk texts (by hash) it embeds."""

    id: str
    provider: str
    model: str
    provider_key: str
    hashes: tuple[str, ...]
    submitted_at: float
    polled_at: float
    state: str = "running"
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TextHit:
    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    bm25: float
    date: str | None = None


@dataclass(frozen=True, slots=True)
class _VectorLayout:
    readable: bool  # chunks_vec exists and can be read (a schema-1 vec0 table needs sqlite-vec)
    legacy: bool  # chunks_vec is the vec0 float table of schema 1
    bits: bool  # chunks_vec_bits exists
    dims: int
    partitions: int


@dataclass(frozen=True, slots=True)
class VectorHit:
    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    distance: float
    date: str | None = None


MIGRATIONS: list[tuple[str, str]] = [
    ("0001_initial", """
        CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE files(
            path TEXT PRIMARY KEY,
            source TEXT NOT NULL DEFAULT 'memory',
            hash TEXT NOT NULL,
            mtime INTEGER NOT NULL,
            size INTEGER NOT NULL,
            indexed_at REAL NOT NULL
        );
        CREATE TABLE chunks(
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            path TEXT NOT NULL,
            source TEXT NOT NULL DEFAULT 'memory',
            start_line INTEGER NOT NULL,
            end_line INTEGER NOT NULL,
            hash TEXT NOT NULL,
            model TEXT NOT NULL DEFAULT '',
            text TEXT NOT NULL,
            embedded INTEGER NOT NULL DEFAULT 0,
            updated_at REAL NOT NULL
        );
        CREATE INDEX chunks_path ON chunks(path);
        CREATE INDEX chunks_pending ON chunks(embedded) WHERE embedded = 0;
        CREATE TABLE embedding_cache(
            provider TEXT NOT NULL,
            model TEXT NOT NULL,
            provider_key TEXT NOT NULL,
            hash TEXT NOT NULL,
            embedding BLOB NOT NULL,
            dims INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY(provider, model, provider_key, hash)
        );
        CREATE INDEX embedding_cache_age ON embedding_cache(updated_at);
        CREATE VIRTUAL TABLE chunks_fts USING fts5(
            text, id UNINDEXED, path UNINDEXED, source UNINDEXED, model UNINDEXED,
            start_line UNINDEXED, end_line UNINDEXED,
            content='', contentless_delete=1, contentless_unindexed=1,
            tokenize='porter unicode61 remove_diacritics 2'
        );
    """),
    ("0002_embedding_jobs", """
        CREATE TABLE embedding_jobs(
            id TEXT PRIMARY KEY,
            provider TEXT NOT NULL,
            model TEXT NOT NULL,
            provider_key TEXT NOT NULL,
            hashes TEXT NOT NULL,
            submitted_at REAL NOT NULL,
            polled_at REAL NOT NULL,
            state TEXT NOT NULL DEFAULT 'running',
            detail TEXT NOT NULL DEFAULT ''
        );
    """),
    ("0003_dates_and_file_state", """
        ALTER TABLE chunks ADD COLUMN date TEXT;
        CREATE INDEX chunks_date ON chunks(date) WHERE date IS NOT NULL;
        ALTER TABLE files ADD COLUMN state TEXT NOT NULL DEFAULT '';
    """),
]


class Store:
    """One open index file. Not shared between threads: open one Store per thread."""

    def __init__(self, path: Path, *, create: bool = True, fast_unsafe: bool = False, read_only: bool = False) -> None:
        """`read_only`: a connection SQLite refuses every write on (a query client beside a writer).

        It neither sets the journal mode nor migrates: an index that needs a migration is refused,
        for its writer (the daemon, `clawmem index`) to upgrade.
        """
        self.path = path
        self.read_only = read_only
        self._layout: tuple[int, _VectorLayout] | None = None
        if read_only:
            flags = apsw.SQLITE_OPEN_READONLY
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
        try:
            if create and not read_only:
                make_private_file(path)
            self.conn = apsw.Connection(str(path), flags=flags)
            self.conn.set_busy_timeout(10_000)
            if read_only:
                pass  # the writer set WAL mode; a reader joins it as it is
            elif fast_unsafe:
                # A rebuild writes a private file that is thrown away if anything fails: no journal needed.
                self.conn.execute("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-65536")
            else:
                self.conn.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            self.vec_loaded, self.vec_error = _load_sqlite_vec(self.conn)
            if read_only:
                self._check_migrated()
            else:
                self._migrate()
        except (apsw.NotADBError, apsw.CorruptError) as exc:
            raise IndexCorrupt(f"index {path} is damaged: {exc}") from exc
        except apsw.Error as exc:
            raise IndexUnavailable(f"cannot open index {path}: {exc}") from exc
        self._depth = 0

    def close(self) -> None:
        self.conn.close()

    # -- transactions -------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE at the outer level, SAVEPOINT inside; rollback never masks the error."""
        if self._depth == 0:
            self.conn.execute("BEGIN IMMEDIATE")
            commit, rollback = "COMMIT", "ROLLBACK"
        else:
            name = f"sp{self._depth}"
            self.conn.execute(f"SAVEPOINT {name}")
            commit, rollback = f"RELEASE {name}", f"ROLLBACK TO {name}; RELEASE {name}"
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            with contextlib.suppress(apsw.Error):
                self.conn.execute(rollback)
            raise
        else:
            self._depth -= 1
            self.conn.execute(commit)

    # -- schema -------------------------------------------------------------------------------

    def _migrate(self) -> None:
        self.conn.execute("CREATE TABLE IF NOT EXISTS migrations(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        done = {row[0] for row in self.conn.execute("SELECT name FROM migrations")}
        for name, sql in MIGRATIONS:
            if name in done:
                continue
            with self._raw_transaction():
                self.conn.execute(sql)
                self.conn.execute("INSERT INTO migrations VALUES(?, ?)", (name, time.time()))
                self.conn.execute("INSERT OR REPLACE INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
                self.conn.execute("INSERT OR IGNORE INTO meta VALUES('created_at', ?)", (str(time.time()),))

    def _check_migrated(self) -> None:
        """A read-only connection cannot migrate: an index some migration has not reached is refused."""
        try:
            done = {row[0] for row in self.conn.execute("SELECT name FROM migrations")}
        except apsw.SQLError:
            done = set()
        if any(name not in done for name, _ in MIGRATIONS):
            self.conn.close()
            raise IndexUnavailable(f"index {self.path} is from an older clawmem and a reader cannot upgrade it:"
                                   " run `clawmem index` (or start `clawmem serve`) once")

    @contextlib.contextmanager
    def _raw_transaction(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with contextlib.suppress(apsw.Error):
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def integrity_ok(self) -> bool:
        return [row[0] for row in self.conn.execute("PRAGMA integrity_check")] == ["ok"]

    # -- meta ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES(?, ?)", (key, value))

    def all_meta(self) -> dict[str, str]:
        return {k: v for k, v in self.conn.execute("SELECT key, value FROM meta")}

    # -- files and chunks ---------------------------------------------------------------------

    def files(self) -> dict[str, FileRow]:
        return {row[0]: FileRow(*row) for row in self.conn.execute(
            "SELECT path, source, hash, mtime, size, state FROM files")}

    def file_row(self, path: str) -> FileRow | None:
        row = self.conn.execute("SELECT path, source, hash, mtime, size, state FROM files WHERE path = ?",
                                (path,)).fetchone()
        return None if row is None else FileRow(*row)

    def upsert_file(self, row: FileRow) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO files(path, source, hash, mtime, size, state, indexed_at)"
            " VALUES(?, ?, ?, ?, ?, ?, ?)",
            (row.path, row.source, row.hash, row.mtime, row.size, row.state, time.time()),
        )

    def chunks_of(self, path: str) -> list[ChunkRow]:
        return [ChunkRow(*row) for row in self.conn.execute(
            "SELECT seq, id, path, start_line, end_line, hash, text FROM chunks WHERE path = ? ORDER BY start_line, seq",
            (path,))]

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str,
                     text: str, fts_text: str, model: str = "", date: str | None = None) -> int:
        self.conn.execute(
            "INSERT INTO chunks(id, path, source, start_line, end_line, hash, model, text, date, updated_at)"
            " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (id, path, source, start_line, end_line, hash, model, text, date, time.time()),
        )
        seq = self.conn.last_insert_rowid()
        self.conn.execute(
            "INSERT INTO chunks_fts(rowid, text, id, path, source, model, start_line, end_line)"
            " VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, fts_text, id, path, source, model, start_line, end_line),
        )
        return seq

    def move_chunk(self, seq: int, start_line: int, end_line: int) -> None:
        """New line numbers for an unchanged chunk (text shifted by an edit above it)."""
        self.conn.execute("UPDATE chunks SET start_line = ?, end_line = ? WHERE seq = ?", (start_line, end_line, seq))
        self.conn.execute("UPDATE chunks_fts SET start_line = ?, end_line = ? WHERE rowid = ?",
                          (start_line, end_line, seq))

    def delete_chunks(self, seqs: Sequence[int]) -> None:
        layout = self._vector_layout()
        for seq in seqs:
            self.conn.execute("DELETE FROM chunks WHERE seq = ?", (seq,))
            self.conn.execute("DELETE FROM chunks_fts WHERE rowid = ?", (seq,))
            self._drop_vector(seq, layout)

    def delete_file(self, path: str) -> int:
        removed = self.delete_chunks_from(path, 0)  # line numbers start at 1: every chunk
        self.conn.execute("DELETE FROM files WHERE path = ?", (path,))
        return removed

    def delete_chunks_from(self, path: str, start_line: int) -> int:
        """Drop a file's chunks that start at `start_line` or later (a transcript's tail made again)."""
        seqs = [row[0] for row in self.conn.execute(
            "SELECT seq FROM chunks WHERE path = ? AND start_line >= ?", (path, start_line))]
        self.delete_chunks(seqs)
        return len(seqs)

    def counts(self) -> tuple[int, int]:
        files = self.conn.execute("SELECT count(*) FROM files").fetchone()[0]
        chunks = self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return int(files), int(chunks)

    def pending_embeddings(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks WHERE embedded = 0").fetchone()[0])

    # -- keyword search -----------------------------------------------------------------------

    def text_search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        """The best `limit` chunks for an FTS5 MATCH expression, best first (bm25 ascending: FTS5 ranks are negative)."""
        join, condition, args = "", "1", {"match": match, "k": limit}
        if where:
            join = " JOIN chunks AS w ON w.seq = chunks_fts.rowid"
            condition, extra = where.sql("w")
            args.update(extra)
        sql = (
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, f.score, c.date FROM"
            f" (SELECT chunks_fts.rowid AS rowid, bm25(chunks_fts) AS score FROM chunks_fts{join}"
            f" WHERE chunks_fts MATCH :match AND {condition} ORDER BY score LIMIT :k) AS f"
            " JOIN chunks AS c ON c.seq = f.rowid ORDER BY f.score"
        )
        return [TextHit(*row) for row in self.conn.execute(sql, args)]

    # -- vectors ------------------------------------------------------------------------------
    #
    # `chunks_vec` is a plain table of float32 blobs: exact distances, and the scan when sqlite-vec is
    # missing. With sqlite-vec, `chunks_vec_bits` (vec0) holds each vector's sign bits, split into
    # partitions by seq. An exact scan of 100k 384-d vectors reads ~150 MB per query; a query here
    # takes the nearest candidates by hamming distance from every partition (vec0's KNN cost grows
    # with N * k, so several small-k KNNs beat one large one) and ranks them by exact cosine.

    def _vector_layout(self) -> _VectorLayout:
        """The vector tables this file has, re-read when the schema changes (another connection may add them)."""
        cookie = int(self.conn.execute("PRAGMA schema_version").fetchone()[0])
        if self._layout is None or self._layout[0] != cookie:
            sql = {str(name): str(text) for name, text in self.conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE name IN ('chunks_vec', 'chunks_vec_bits')")}
            floats = sql.get("chunks_vec")
            legacy = floats is not None and floats.upper().startswith("CREATE VIRTUAL")
            layout = _VectorLayout(
                readable=floats is not None and (self.vec_loaded or not legacy), legacy=legacy,
                bits="chunks_vec_bits" in sql,
                dims=int(self.get_meta("vector_dims") or 0),
                partitions=int(self.get_meta("vector_partitions") or VECTOR_PARTITIONS))
            self._layout = (cookie, layout)
        return self._layout[1]

    def vec_table_exists(self) -> bool:
        """Whether stored vectors can be searched (a schema-1 vec0 table needs sqlite-vec)."""
        return self._vector_layout().readable

    def vector_method(self) -> str:
        """How `vector_search` answers on this connection (for diagnostics and benchmarks)."""
        layout = self._vector_layout()
        if not layout.readable:
            return "none"
        if not self.vec_loaded:
            return "in-process cosine (sqlite-vec not loaded)"
        if layout.bits and self.get_meta(_BITS_STALE) is None:
            return "sqlite-vec binary-quantized KNN, exact cosine rescoring"
        return "sqlite-vec exact cosine scan"

    def ensure_vector_table(self, dims: int) -> None:
        """The tables for `dims`-d vectors; with sqlite-vec, also (re)builds sign bits that are missing or stale."""
        layout = self._vector_layout()
        if layout.legacy:
            return  # a schema-1 index: the fingerprint rebuilds it, so it is never written
        if not layout.readable:
            self.conn.execute("CREATE TABLE chunks_vec(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")
            self.set_meta("vector_dims", str(int(dims)))
        if self.vec_loaded and (not layout.bits or self.get_meta(_BITS_STALE) is not None):
            self._build_bits(dims, replace=layout.bits)

    def _build_bits(self, dims: int, *, replace: bool) -> None:
        """Quantize every stored vector: a new table, or one that missed writes made without sqlite-vec."""
        if replace:
            self.conn.execute("DROP TABLE chunks_vec_bits")
        self.conn.execute("CREATE VIRTUAL TABLE chunks_vec_bits USING vec0("
                          f"part INTEGER PARTITION KEY, embedding bit[{_padded_dims(int(dims))}])")
        self.set_meta("vector_partitions", str(VECTOR_PARTITIONS))
        for seq, blob in self.conn.execute("SELECT rowid, embedding FROM chunks_vec"):
            self._insert_bits(int(seq), bytes(blob), VECTOR_PARTITIONS)
        self.conn.execute("DELETE FROM meta WHERE key = ?", (_BITS_STALE,))

    def _insert_bits(self, seq: int, blob: bytes, partitions: int) -> None:
        self.conn.execute(
            "INSERT INTO chunks_vec_bits(rowid, part, embedding) VALUES(?, ?, vec_quantize_binary(vec_f32(?)))",
            (seq, seq % partitions, _pad8(blob)))

    def _drop_vector(self, seq: int, layout: _VectorLayout) -> None:
        if not layout.readable:
            return
        self.conn.execute("DELETE FROM chunks_vec WHERE rowid = ?", (seq,))
        if layout.bits and self.conn.changes():
            if self.vec_loaded:
                self.conn.execute("DELETE FROM chunks_vec_bits WHERE rowid = ?", (seq,))
            else:
                self.set_meta(_BITS_STALE, "1")

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        """Record a chunk's vector (None, zero or not finite: no usable vector; never matched, not retried)."""
        layout = self._vector_layout()
        self._drop_vector(seq, layout)
        if blob is not None and _usable(blob):
            if layout.dims and len(blob) != 4 * layout.dims:
                raise ValueError(f"a {len(blob) // 4}-d vector for a {layout.dims}-d index")
            self.conn.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", (seq, blob))
            if layout.bits:
                if self.vec_loaded:
                    self._insert_bits(seq, blob, layout.partitions)
                else:
                    self.set_meta(_BITS_STALE, "1")
        self.conn.execute("UPDATE chunks SET embedded = 1, model = ? WHERE seq = ?", (model, seq))

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> int:
        """`store_vector` for many chunks at once, each only if it still waits for the text `hash` names.

        A chunk may have changed or gone while its vector was made (the provider is called outside
        any transaction); those are left alone. Returns how many chunks were given their answer.
        """
        if not items:
            return 0
        waiting = {int(seq): str(h) for seq, h in self.conn.execute(
            "SELECT seq, hash FROM chunks WHERE embedded = 0 AND seq IN (SELECT value FROM json_each(?))",
            (json.dumps([seq for seq, _, _ in items]),))}
        current = [(seq, blob) for seq, h, blob in items if waiting.get(seq) == h]
        if not current:
            return 0
        layout = self._vector_layout()
        if layout.readable:  # a waiting chunk has no vector; one left by an older version is replaced
            stale = self.conn.execute("SELECT rowid FROM chunks_vec WHERE rowid IN (SELECT value FROM json_each(?))",
                                      (json.dumps([seq for seq, _ in current]),)).fetchall()
            for (seq,) in stale:
                self._drop_vector(int(seq), layout)
        vectors = [(seq, blob) for seq, blob in current if blob is not None and _usable(blob)]
        if layout.dims and any(len(blob) != 4 * layout.dims for _, blob in vectors):
            raise ValueError(f"a vector of another size than the index's {layout.dims} dimensions")
        self.conn.executemany("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", vectors)
        if layout.bits and vectors:
            if self.vec_loaded:
                self.conn.executemany(
                    "INSERT INTO chunks_vec_bits(rowid, part, embedding) VALUES(?, ?, vec_quantize_binary(vec_f32(?)))",
                    [(seq, seq % layout.partitions, _pad8(blob)) for seq, blob in vectors])
            else:
                self.set_meta(_BITS_STALE, "1")
        self.conn.executemany("UPDATE chunks SET embedded = 1, model = ? WHERE seq = ?",
                              [(model, seq) for seq, _ in current])
        return len(current)

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        """Up to `limit` chunks waiting for a vector, in seq order from `after` (a cursor, so a pass ends)."""
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT seq, hash, text FROM chunks WHERE embedded = 0 AND seq > ? ORDER BY seq LIMIT ?", (after, limit))]

    def vector_search(self, query_blob: bytes, limit: int, where: ChunkFilter | None = None) -> list[VectorHit]:
        """The `limit` chunks nearest by cosine distance (exact distances), nearest first, within `where`."""
        layout = self._vector_layout()
        if not layout.readable or limit < 1:
            return []
        where = where or None
        if not self.vec_loaded:
            return self._vector_scan(query_blob, limit, where)
        if not layout.bits or self.get_meta(_BITS_STALE) is not None:
            return self._ranked(query_blob, limit, where)
        if where and self._few_under(where):
            return self._ranked(query_blob, limit, where)
        want = max(limit * OVERSAMPLE, MIN_CANDIDATES)
        among = self._candidates(query_blob, want, layout.partitions)
        if among is not None and where:
            among = self._candidates_under(where, among, query_blob, want, layout.partitions)
        if among is None:
            return self._ranked(query_blob, limit, where)
        return self._ranked(query_blob, limit, None, among)

    def _candidates(self, query_blob: bytes, want: int, partitions: int) -> list[int] | None:
        """About `want` seqs nearest by hamming distance, an equal share from each partition (None: vec0's k limit)."""
        per_part = -(-want // partitions)
        if per_part > _KNN_MAX_K:
            return None
        bits = self.conn.execute("SELECT vec_quantize_binary(vec_f32(?))", (_pad8(query_blob),)).fetchone()[0]
        seqs: list[int] = []
        for part in range(partitions):
            seqs.extend(int(row[0]) for row in self.conn.execute(
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
        return [VectorHit(*row) for row in self.conn.execute(sql, args)]

    def _candidates_under(self, within: ChunkFilter, among: list[int], query_blob: bytes, want: int,
                          partitions: int) -> list[int] | None:
        """The candidates within the filter, enough of them for the oversampling; None: rank the filter's chunks exactly.

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
        counted = self.conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM chunks AS c WHERE {clause} LIMIT {PREFIX_SCAN_ROWS + 1})", args)
        return int(counted.fetchone()[0]) <= PREFIX_SCAN_ROWS

    def _under(self, within: ChunkFilter, seqs: list[int]) -> list[int]:
        clause, args = within.sql("c")
        return [int(row[0]) for row in self.conn.execute(
            f"SELECT c.seq FROM chunks AS c WHERE c.seq IN (SELECT value FROM json_each(:seqs)) AND {clause}",
            {**args, "seqs": json.dumps(seqs)})]

    def _vector_scan(self, query_blob: bytes, limit: int, within: ChunkFilter | None) -> list[VectorHit]:
        from clawmem.embeddings.base import unpack

        query = unpack(query_blob)
        scored: list[tuple[float, int]] = []
        for seq, blob in self.conn.execute("SELECT rowid, embedding FROM chunks_vec"):
            vec = unpack(blob)
            scored.append((1.0 - sum(a * b for a, b in zip(query, vec, strict=False)), int(seq)))
        scored.sort()
        clause, args = (within or ChunkFilter()).sql("c")
        hits: list[VectorHit] = []
        for distance, seq in scored:
            row = self.conn.execute(
                f"SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, c.date FROM chunks AS c"
                f" WHERE c.seq = :seq AND {clause}", {**args, "seq": seq}).fetchone()
            if row:
                hits.append(VectorHit(*row[:6], distance, row[6]))
                if len(hits) >= limit:
                    break
        return hits

    # -- embedding cache ----------------------------------------------------------------------

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str], *,
                          touch: bool = True) -> dict[str, bytes]:
        """Cached vectors by chunk hash (one query); `touch` marks them used (a write: see `touch_cached`)."""
        found = {str(h): bytes(blob) for h, blob in self.conn.execute(
            "SELECT hash, embedding FROM embedding_cache WHERE provider = ? AND model = ? AND provider_key = ?"
            " AND hash IN (SELECT value FROM json_each(?))", (provider, model, key, json.dumps(sorted(set(hashes)))))}
        if touch:
            self.touch_cached(provider, model, key, found)
        return found

    def touch_cached(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Mark cache entries as just used, so pruning (oldest used first) keeps them."""
        wanted = sorted(set(hashes))
        if wanted:
            self.conn.execute(
                "UPDATE embedding_cache SET updated_at = ? WHERE provider = ? AND model = ? AND provider_key = ?"
                " AND hash IN (SELECT value FROM json_each(?))", (time.time(), provider, model, key, json.dumps(wanted)))

    def cache_embedding(self, provider: str, model: str, key: str, hash: str, blob: bytes, dims: int) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO embedding_cache VALUES(?, ?, ?, ?, ?, ?, ?)",
            (provider, model, key, hash, blob, dims, time.time()))

    def prune_cache(self, max_entries: int) -> int:
        total = int(self.conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0])
        excess = total - max_entries
        if excess <= 0:
            return 0
        self.conn.execute(
            "DELETE FROM embedding_cache WHERE rowid IN (SELECT rowid FROM embedding_cache ORDER BY updated_at, rowid LIMIT ?)",
            (excess,))
        return excess

    def copy_cache_from(self, other: Path) -> None:
        """Carry another index's embedding cache and batch jobs over (a rebuild must not re-embed what it knew).

        Jobs still running at the provider are results already paid for: their vectors land in the
        cache of whichever index holds the job when it completes.
        """
        self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        try:
            tables = {str(row[0]) for row in self.conn.execute("SELECT name FROM old.sqlite_master WHERE type = 'table'")}
            if "embedding_cache" in tables:
                self.conn.execute("INSERT OR IGNORE INTO embedding_cache SELECT * FROM old.embedding_cache")
            if "embedding_jobs" in tables:
                self.conn.execute("INSERT OR IGNORE INTO embedding_jobs SELECT * FROM old.embedding_jobs")
        finally:
            self.conn.execute("DETACH DATABASE old")

    def reset_vectors(self) -> int:
        """Forget every vector (a new model's go in their place); returns the chunks now waiting for one.

        Only inside a transaction that also stores the new fingerprint: readers keep the old
        vectors until it commits. A schema-1 vec0 table cannot be dropped without sqlite-vec: apsw.Error.
        """
        self.conn.execute("DROP TABLE IF EXISTS chunks_vec_bits")
        self.conn.execute("DROP TABLE IF EXISTS chunks_vec")
        self.conn.execute("DELETE FROM meta WHERE key IN ('vector_dims', 'vector_partitions', ?)", (_BITS_STALE,))
        self.conn.execute("UPDATE chunks SET embedded = 0, model = ''")
        return self.conn.changes()

    # -- batch jobs ---------------------------------------------------------------------------

    def add_job(self, job: JobRow) -> None:
        self.conn.execute(
            "INSERT INTO embedding_jobs(id, provider, model, provider_key, hashes, submitted_at, polled_at, state,"
            " detail) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job.id, job.provider, job.model, job.provider_key, json.dumps(list(job.hashes)), job.submitted_at,
             job.polled_at, job.state, job.detail))

    def jobs(self, provider: str, model: str, key: str) -> list[JobRow]:
        """The batch jobs this provider identity has running, oldest first."""
        return [JobRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), tuple(json.loads(r[4])), float(r[5]), float(r[6]),
                       str(r[7]), str(r[8])) for r in self.conn.execute(
            "SELECT id, provider, model, provider_key, hashes, submitted_at, polled_at, state, detail"
            " FROM embedding_jobs WHERE provider = ? AND model = ? AND provider_key = ? ORDER BY submitted_at, id",
            (provider, model, key))]

    def uncached_pending(self, provider: str, model: str, key: str, *,
                         exclude: Collection[str] = ()) -> dict[str, str]:
        """Texts of the chunks waiting for a vector that the cache lacks, by hash (what a batch job would embed)."""
        rows = self.conn.execute(
            "SELECT c.hash, c.text FROM chunks AS c WHERE c.embedded = 0 AND NOT EXISTS (SELECT 1 FROM"
            " embedding_cache AS e WHERE e.provider = ? AND e.model = ? AND e.provider_key = ? AND e.hash = c.hash)",
            (provider, model, key))
        return {str(h): str(text) for h, text in rows if h not in exclude}

    def job_count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM embedding_jobs").fetchone()[0])

    def touch_job(self, job_id: str, state: str, detail: str) -> None:
        self.conn.execute("UPDATE embedding_jobs SET polled_at = ?, state = ?, detail = ? WHERE id = ?",
                          (time.time(), state, detail, job_id))

    def drop_job(self, job_id: str) -> None:
        self.conn.execute("DELETE FROM embedding_jobs WHERE id = ?", (job_id,))

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        return [tuple(row) for row in self.conn.execute(sql, args)]


def make_private_dirs(directory: Path, *, tighten: bool = False) -> None:
    """Create `directory` and any missing parents 0700, whatever the umask.

    Existing folders are left as they are unless `tighten` (folders that are clawmem's own, such as
    its cache, which older versions created 0755): then `directory` itself is made 0700 if we own it.
    """
    missing: list[Path] = []
    current = directory
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)
    if tighten and not missing:
        _make_private(directory, 0o700)


def make_private_file(path: Path, *, create: bool = True) -> None:
    """The index file and its journals 0600 (created so when missing and `create`), before SQLite opens it.

    The index holds the memory's text, so no other local user may read it. SQLite gives the -wal
    and -shm files it creates the database file's mode; existing ones are tightened here too.
    """
    make_private_dirs(path.parent)
    if create:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    for suffix in ("", "-wal", "-shm"):
        _make_private(Path(f"{path}{suffix}"), 0o600)


def _make_private(path: Path, mode: int) -> None:
    """chmod `path` to `mode` if we own it and others have any access (never following a symlink)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, mode, follow_symlinks=False)


def _load_sqlite_vec(conn: apsw.Connection) -> tuple[bool, str]:
    try:
        conn.enable_load_extension(True)
        conn.load_extension(_sqlite_vec_path())
        conn.enable_load_extension(False)
        return True, ""
    except (ImportError, apsw.Error) as exc:
        return False, str(exc)


def _sqlite_vec_path() -> str:
    """Where the sqlite-vec package keeps its extension, found without importing the package.

    `import sqlite_vec` pulls in numpy (0.12 s), a third of a CLI search's whole budget.
    """
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sqlite-vec package is not installed")
    return os.path.join(next(iter(spec.submodule_search_locations)), "vec0")


def _prefix_range(column: str, prefix: str) -> tuple[str, dict[str, Any]]:
    """A condition for `column` starting with `prefix` that an index on it can answer as a range.

    Text compares as UTF-8 bytes, which order as code points: the strings starting with `prefix` are
    those from `prefix` up to (not including) `prefix` with its last character incremented.
    """
    args: dict[str, Any] = {"prefix": prefix, "n": len(prefix)}
    clause = f"{column} >= :prefix AND substr({column}, 1, :n) = :prefix"
    following = ord(prefix[-1]) + 1
    if 0xD800 <= following < 0xE000:
        following = 0xE000  # surrogates are not characters
    if following <= 0x10FFFF:
        clause += f" AND {column} < :upper"
        args["upper"] = prefix[:-1] + chr(following)
    return clause, args


def _padded_dims(dims: int) -> int:
    return dims + (-dims) % 8


def _pad8(blob: bytes) -> bytes:
    """vec_quantize_binary wants a multiple of 8 dimensions; zeros quantize to 0 bits, alike for every vector."""
    return blob + bytes(4 * ((-(len(blob) // 4)) % 8))


def _usable(blob: bytes) -> bool:
    """A vector with a direction: a zero, NaN or infinite vector must never be stored as a match."""
    import numpy as np  # writers only: a CLI search never stores a vector

    values = np.frombuffer(blob, dtype="<f4").astype(np.float64)  # float64 squares neither overflow nor vanish
    total = float(values @ values)
    return math.isfinite(total) and total > 0.0
