"""The index file: its transactions, files and chunks; what lives beside them, each part in its own module.

The store is the core of the index's interface (clawmem_index.index.interface, PgStore's too); its
parts are attributes, each a module of its own: `meta` (schema: migrations, meta), `keywords`
(keyword_index: FTS5, BM25, the vocabulary), `vectors` (vector_index: vectors, KNN), `embeddings`
(embedded: which chunks hold a vector), `cache` (the embedding cache) and `batch_jobs` (cache),
`carry` (what a rebuild takes over from the file it replaces) and `facts` (the chunks' dates and
annotations); `parked` (parking) holds a model's vectors set aside. `connection` opens the file. The
rows it hands out (`rows`) are PgStore's too.

apsw runs in autocommit mode; `transaction()` is the one way to group writes, nesting as savepoints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import apsw

from clawmem_index.errors import StoreError
from clawmem_index.index.cache import BatchJobs, EmbeddingCache
from clawmem_index.index.carry import VectorCarry
from clawmem_index.index.connection import connect
from clawmem_index.index.embedded import ChunkVectors
from clawmem_index.index.facts import ChunkFacts
from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.keyword_index import KeywordIndex, PostingsCache, TextHit
from clawmem_index.index.parking import ParkedVectors
from clawmem_index.index.rows import ChunkRow, FileRow, JobRow
from clawmem_index.index.schema import MIGRATIONS, SCHEMA_VERSION, Meta
from clawmem_index.index.vector_cells import SharedCells
from clawmem_index.index.vector_index import VectorHit, VectorIndex
from clawmem_index.text.annotations import Annotations
from clawmem_index.text.storable import storable

# The rows, schema version and hits are the store's interface: importable from here as they always were.
__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "ChunkFilter", "ChunkRow", "FileRow", "JobRow", "Store", "TextHit",
           "VectorHit"]


_NO_ANNOTATIONS = Annotations()


class Store:
    """One open index file. Not shared between threads: open one Store per thread."""

    # What a backend makes of a chunk's text before storing it, done where the text is chunked (a
    # parse worker) rather than on the writer; FTS5 tokenizes inside SQLite, so nothing here.
    terms_of: Callable[[str], Any] | None = None
    # Each vector is stored once: with its chunks while the index holds its text, in the cache after.
    caches_stored_vectors = False
    vec_loaded: bool  # sqlite-vec loaded on this connection (set when it opens)

    def __init__(self, path: Path, *, create: bool = True, fast_unsafe: bool = False, read_only: bool = False,
                 keep_keyword_scores: bool = True, keyword_postings: PostingsCache | None = None,
                 shared_cells: SharedCells | None = None) -> None:
        """`read_only`: a connection SQLite refuses every write on (a query client beside a writer).

        `keep_keyword_scores`: rank common-word queries from per-phrase scores kept on this
        connection (see keyword_index); worth it only in a long-lived process, since the first use
        of a phrase reads all its matches. `keyword_postings`: where they are kept, when the
        connections to this file share them (else on this connection alone). `shared_cells`: the
        vector cells' centroids and members, likewise (else the centroids alone, on this connection).

        It neither sets the journal mode nor migrates: an index that needs a migration is refused,
        for its writer (the daemon, `clawmem index`) to upgrade.
        """
        self.path = path
        self.read_only = read_only
        self.conn, self.vec_loaded, self.vec_error = connect(path, create=create, fast_unsafe=fast_unsafe,
                                                             read_only=read_only)
        self._depth = 0
        self.meta = Meta(self.conn)
        self.keywords = KeywordIndex(self.conn, keep_scores=keep_keyword_scores, postings=keyword_postings)
        self.vectors = VectorIndex(self.conn, self.meta, self.transaction, loaded=self.vec_loaded,
                                   shared_cells=shared_cells)
        self.parked = ParkedVectors(self.conn, self.meta, self.vectors)
        self.cache = EmbeddingCache(self.conn, self.meta, self.vectors, self.parked)
        self.embeddings = ChunkVectors(self.conn, self.meta, self.vectors, self.parked, self.cache)
        self.batch_jobs = BatchJobs(self.conn)
        self.carry = VectorCarry(self.conn, self.vectors, self.parked, self.cache, self.transaction)
        self.facts = ChunkFacts(self.conn)

    def close(self) -> None:
        self.conn.close()

    def interrupt(self) -> None:
        """End the statement running on this connection now (from any thread): it fails with InterruptError."""
        self.conn.interrupt()

    # -- transactions -------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE at the outer level, SAVEPOINT inside; rollback never masks the error. What SQLite refuses
        inside is a StoreError (a full disk stays apsw's: the backend's `writing` says it)."""
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
        except BaseException as exc:
            self._depth -= 1
            with contextlib.suppress(apsw.Error):
                self.conn.execute(rollback)
            if isinstance(exc, apsw.Error) and not isinstance(exc, apsw.FullError):  # the disk's: the backend's
                raise StoreError(f"{type(exc).__name__}: {exc}") from exc
            raise
        else:
            self._depth -= 1
            self.conn.execute(commit)

    # -- schema -------------------------------------------------------------------------------

    def integrity_ok(self) -> bool:
        return [row[0] for row in self.conn.execute("PRAGMA integrity_check")] == ["ok"]

    # -- files and chunks ---------------------------------------------------------------------

    def file_stats(self) -> dict[str, tuple[int, int]]:
        """(mtime, size) of every indexed file: all a no-change sync needs to know."""
        return {row[0]: (row[1], row[2]) for row in self.conn.execute("SELECT path, mtime, size FROM files")}

    def file_stat(self, path: str) -> tuple[int, int] | None:
        """(mtime, size) of one indexed file: a query's bounded check of pending files asks for thousands."""
        row = self.conn.execute("SELECT mtime, size FROM files WHERE path = ?", (path,)).fetchone()
        return None if row is None else (row[0], row[1])

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
            "SELECT seq, id, path, start_line, end_line, hash, text FROM chunks WHERE path = ?"
            " ORDER BY start_line, seq",
            (path,))]

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str,
                     text: str, fts_text: str, model: str = "", date: str | None = None, terms: Any = None,
                     annotations: Annotations | None = None) -> int:
        """Add a chunk with its FTS row; text that UTF-8 cannot encode (lone surrogates) is stored repaired.

        `terms` is never set here (`terms_of` is None): FTS5 tokenizes `fts_text` itself."""
        id, path, text, fts_text = storable(id), storable(path), storable(text), storable(fts_text)
        notes = annotations or _NO_ANNOTATIONS
        self.conn.execute(
            "INSERT INTO chunks(id, path, source, start_line, end_line, hash, model, text, date, updated_at,"
            " importance, triggers, projects) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (id, path, source, start_line, end_line, hash, model, text, date, time.time(), notes.importance,
             None if notes.triggers is None else storable(notes.triggers),
             None if notes.projects is None else storable(notes.projects)),
        )
        seq = self.conn.last_insert_rowid()
        self.keywords.add(seq, fts_text, id=id, path=path, source=source, model=model, start_line=start_line,
                          end_line=end_line)
        return seq

    def date_undated(self, dates: Mapping[str, str]) -> int:
        """Give the undated chunks of these memory files (path -> ISO date) that date; returns how many."""
        before = self.conn.total_changes()
        self.conn.executemany("UPDATE chunks SET date = ? WHERE path = ? AND source = 'memory' AND date IS NULL",
                              [(day, path) for path, day in dates.items()])
        return self.conn.total_changes() - before

    def move_chunk(self, seq: int, start_line: int, end_line: int) -> None:
        """New line numbers for an unchanged chunk (text shifted by an edit above it)."""
        self.conn.execute("UPDATE chunks SET start_line = ?, end_line = ? WHERE seq = ?", (start_line, end_line, seq))
        self.keywords.move(seq, start_line, end_line)

    def delete_chunks(self, seqs: Sequence[int]) -> None:
        """Drop chunks with their FTS rows and vectors; a vector whose text is indexed nowhere else goes to the
        cache."""
        self.cache.cache_live(seqs)
        for seq in seqs:
            self.conn.execute("DELETE FROM chunks WHERE seq = ?", (seq,))
            self.keywords.remove(seq)
            self.vectors.remove(seq)

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
        files = self.conn.execute("SELECT count(*) FROM files").get
        chunks = self.conn.execute("SELECT count(*) FROM chunks").get
        return int(files), int(chunks)

    def pending_embeddings(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks WHERE embedded = 0").get)

    def damage(self, chunks: int | None = None) -> str | None:
        """Rows changed behind the writer's back (see PgStore.damage). A SQLite index is one private file
        only its user writes: what can go wrong with it is what `integrity_ok` finds."""
        return None

    def data_version(self) -> int:
        """Changes whenever another connection commits to the index (SQLite's own counter, per connection)."""
        return int(self.conn.execute("PRAGMA data_version").get)

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        return [tuple(row) for row in self.conn.execute(sql, args)]

