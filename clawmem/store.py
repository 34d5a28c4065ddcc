"""The only module that speaks SQL: connection, schema, migrations, reads and writes.

Python's stdlib sqlite3 often cannot load extensions, so the connection is apsw (a current SQLite
with FTS5, able to load sqlite-vec everywhere). apsw runs in autocommit mode; `transaction()` is
the one way to group writes, nesting as savepoints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from clawmem.errors import IndexCorrupt, IndexUnavailable

__all__ = ["ChunkRow", "FileRow", "Store", "TextHit", "VectorHit"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class FileRow:
    path: str
    source: str
    hash: str
    mtime: int
    size: int


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
class TextHit:
    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    bm25: float


@dataclass(frozen=True, slots=True)
class VectorHit:
    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    distance: float


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
]


class Store:
    """One open index file. Not shared between threads: open one Store per thread."""

    def __init__(self, path: Path, *, create: bool = True, fast_unsafe: bool = False) -> None:
        self.path = path
        flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
        try:
            if create:
                path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = apsw.Connection(str(path), flags=flags)
            self.conn.set_busy_timeout(10_000)
            if fast_unsafe:
                # A rebuild writes a private file that is thrown away if anything fails: no journal needed.
                self.conn.execute("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-65536")
            else:
                self.conn.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            self.vec_loaded, self.vec_error = _load_sqlite_vec(self.conn)
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
        return {row[0]: FileRow(*row) for row in self.conn.execute("SELECT path, source, hash, mtime, size FROM files")}

    def file_row(self, path: str) -> FileRow | None:
        row = self.conn.execute("SELECT path, source, hash, mtime, size FROM files WHERE path = ?", (path,)).fetchone()
        return None if row is None else FileRow(*row)

    def upsert_file(self, row: FileRow) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO files(path, source, hash, mtime, size, indexed_at) VALUES(?, ?, ?, ?, ?, ?)",
            (row.path, row.source, row.hash, row.mtime, row.size, time.time()),
        )

    def chunks_of(self, path: str) -> list[ChunkRow]:
        return [ChunkRow(*row) for row in self.conn.execute(
            "SELECT seq, id, path, start_line, end_line, hash, text FROM chunks WHERE path = ? ORDER BY start_line, seq",
            (path,))]

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str,
                     text: str, fts_text: str, model: str = "") -> int:
        self.conn.execute(
            "INSERT INTO chunks(id, path, source, start_line, end_line, hash, model, text, updated_at)"
            " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (id, path, source, start_line, end_line, hash, model, text, time.time()),
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
        for seq in seqs:
            self.conn.execute("DELETE FROM chunks WHERE seq = ?", (seq,))
            self.conn.execute("DELETE FROM chunks_fts WHERE rowid = ?", (seq,))
            if self.vec_table_exists():
                self.conn.execute("DELETE FROM chunks_vec WHERE rowid = ?", (seq,))

    def delete_file(self, path: str) -> int:
        seqs = [row[0] for row in self.conn.execute("SELECT seq FROM chunks WHERE path = ?", (path,))]
        self.delete_chunks(seqs)
        self.conn.execute("DELETE FROM files WHERE path = ?", (path,))
        return len(seqs)

    def counts(self) -> tuple[int, int]:
        files = self.conn.execute("SELECT count(*) FROM files").fetchone()[0]
        chunks = self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return int(files), int(chunks)

    def pending_embeddings(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks WHERE embedded = 0").fetchone()[0])

    # -- keyword search -----------------------------------------------------------------------

    def text_search(self, match: str, limit: int, path_prefix: str | None = None) -> list[TextHit]:
        """The best `limit` chunks for an FTS5 MATCH expression, best first (bm25 ascending: FTS5 ranks are negative)."""
        where, args = "chunks_fts MATCH ?", [match]
        if path_prefix:
            where += " AND substr(path, 1, ?) = ?"
            args += [len(path_prefix), path_prefix]
        sql = (
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, f.score FROM"
            f" (SELECT rowid, bm25(chunks_fts) AS score FROM chunks_fts WHERE {where} ORDER BY score LIMIT ?) AS f"
            " JOIN chunks AS c ON c.seq = f.rowid ORDER BY f.score"
        )
        return [TextHit(*row) for row in self.conn.execute(sql, (*args, limit))]

    # -- vectors ------------------------------------------------------------------------------

    def vec_table_exists(self) -> bool:
        cached = getattr(self, "_vec_exists", None)
        if cached is None:
            cached = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'chunks_vec'").fetchone() is not None
            self._vec_exists = cached
        return bool(cached)

    def ensure_vector_table(self, dims: int) -> None:
        """The vec0 table (or, without sqlite-vec, a plain table scanned in process) for `dims`-d vectors."""
        if self.vec_table_exists():
            return
        if self.vec_loaded:
            self.conn.execute(f"CREATE VIRTUAL TABLE chunks_vec USING vec0(embedding float[{int(dims)}] distance_metric=cosine)")
        else:
            self.conn.execute("CREATE TABLE chunks_vec(rowid INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")
        self.set_meta("vector_dims", str(int(dims)))
        self._vec_exists = True

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        """Record a chunk's vector (None: the provider gave no usable vector; never matched, not retried)."""
        if blob is not None:
            self.conn.execute("DELETE FROM chunks_vec WHERE rowid = ?", (seq,))
            self.conn.execute("INSERT INTO chunks_vec(rowid, embedding) VALUES(?, ?)", (seq, blob))
        self.conn.execute("UPDATE chunks SET embedded = 1, model = ? WHERE seq = ?", (model, seq))

    def pending_chunks(self, limit: int) -> list[tuple[int, str, str]]:
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT seq, hash, text FROM chunks WHERE embedded = 0 ORDER BY seq LIMIT ?", (limit,))]

    def vector_search(self, query_blob: bytes, limit: int, path_prefix: str | None = None) -> list[VectorHit]:
        if not self.vec_table_exists():
            return []
        if not self.vec_loaded:
            return self._vector_scan(query_blob, limit, path_prefix)
        k = limit * (4 if path_prefix else 1)
        sql = (
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, v.distance FROM"
            " (SELECT rowid, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ?) AS v"
            " JOIN chunks AS c ON c.seq = v.rowid ORDER BY v.distance"
        )
        hits = [VectorHit(*row) for row in self.conn.execute(sql, (query_blob, k))]
        if path_prefix:
            hits = [h for h in hits if h.path.startswith(path_prefix)]
        return hits[:limit]

    def _vector_scan(self, query_blob: bytes, limit: int, path_prefix: str | None) -> list[VectorHit]:
        from clawmem.embeddings.base import unpack

        query = unpack(query_blob)
        scored: list[tuple[float, int]] = []
        for seq, blob in self.conn.execute("SELECT rowid, embedding FROM chunks_vec"):
            vec = unpack(blob)
            scored.append((1.0 - sum(a * b for a, b in zip(query, vec, strict=False)), int(seq)))
        scored.sort()
        hits: list[VectorHit] = []
        for distance, seq in scored:
            row = self.conn.execute(
                "SELECT seq, path, source, start_line, end_line, text FROM chunks WHERE seq = ?", (seq,)).fetchone()
            if row and (not path_prefix or str(row[1]).startswith(path_prefix)):
                hits.append(VectorHit(*row, distance))
                if len(hits) >= limit:
                    break
        return hits

    # -- embedding cache ----------------------------------------------------------------------

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        now = time.time()
        for h in set(hashes):
            row = self.conn.execute(
                "SELECT embedding FROM embedding_cache WHERE provider = ? AND model = ? AND provider_key = ? AND hash = ?",
                (provider, model, key, h)).fetchone()
            if row is not None:
                found[h] = bytes(row[0])
                self.conn.execute(
                    "UPDATE embedding_cache SET updated_at = ? WHERE provider = ? AND model = ? AND provider_key = ?"
                    " AND hash = ?", (now, provider, model, key, h))
        return found

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
        """Carry another index's embedding cache over (a rebuild must not re-embed what it knew)."""
        self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        try:
            has = self.conn.execute("SELECT 1 FROM old.sqlite_master WHERE name = 'embedding_cache'").fetchone()
            if has:
                self.conn.execute("INSERT OR IGNORE INTO embedding_cache SELECT * FROM old.embedding_cache")
        finally:
            self.conn.execute("DETACH DATABASE old")

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        return [tuple(row) for row in self.conn.execute(sql, args)]


def _load_sqlite_vec(conn: apsw.Connection) -> tuple[bool, str]:
    try:
        import sqlite_vec

        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        conn.enable_load_extension(False)
        return True, ""
    except (ImportError, apsw.Error, AttributeError) as exc:
        return False, str(exc)
