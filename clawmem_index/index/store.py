"""The index file: its transactions, files and chunks; what lives beside them, each part in its own module.

The store is the index's small interface (PgStore's too); what lives beside the chunks has its own
module: `connection` (opening the file), `schema` (migrations, meta), `keyword_index` (FTS5, BM25),
`vector_index` (vectors, KNN), `parking` (a model's vectors set aside), `cache` (the embedding cache
and batch jobs) and `carry` (what a rebuild takes over from the file it replaces). The rows it hands
out (`rows`) are PgStore's too.

apsw runs in autocommit mode; `transaction()` is the one way to group writes, nesting as savepoints.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import apsw

from clawmem_index.errors import StoreError
from clawmem_index.index.cache import BatchJobs, EmbeddingCache
from clawmem_index.index.carry import VectorCarry
from clawmem_index.index.connection import connect
from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.keyword_index import KeywordIndex, PostingsCache, TextHit
from clawmem_index.index.parking import Owner, ParkedVectors
from clawmem_index.index.rows import ChunkRow, FileRow, JobRow
from clawmem_index.index.schema import MIGRATIONS, SCHEMA_VERSION, Meta
from clawmem_index.index.vector_cells import SharedCells
from clawmem_index.index.vector_index import FLOATS, HALVES, VectorHit, VectorIndex
from clawmem_index.index.vocabulary import FtsVocabulary
from clawmem_index.text.annotations import ANNOTATION_KINDS, Annotations
from clawmem_index.text.storable import storable

# The rows, schema version and hits are the store's interface: importable from here as they always were.
__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "ChunkFilter", "ChunkRow", "FileRow", "JobRow", "Store", "TextHit",
           "VectorHit"]


_NO_ANNOTATIONS = Annotations()
_ANNOTATED = "importance IS NOT NULL OR triggers IS NOT NULL OR projects IS NOT NULL"  # as chunks_annotated's


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
        self.stems = FtsVocabulary(self.conn)
        self.vectors = VectorIndex(self.conn, self.meta, loaded=self.vec_loaded, shared_cells=shared_cells)
        self.parked = ParkedVectors(self.conn, self.meta, self.vectors)
        self.cache = EmbeddingCache(self.conn, self.meta, self.vectors, self.parked)
        self.batch_jobs = BatchJobs(self.conn)
        self.carry = VectorCarry(self.conn, self.vectors, self.parked, self.cache, self.transaction)

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

    # -- meta ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        return self.meta.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self.meta.set(key, value)

    def delete_meta(self, key: str) -> None:
        self.meta.delete(key)

    def all_meta(self) -> dict[str, str]:
        return self.meta.all()

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
        files = self.conn.execute("SELECT count(*) FROM files").fetchone()[0]
        chunks = self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return int(files), int(chunks)

    def pending_embeddings(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks WHERE embedded = 0").fetchone()[0])

    def damage(self, chunks: int | None = None) -> str | None:
        """Rows changed behind the writer's back (see PgStore.damage). A SQLite index is one private file
        only its user writes: what can go wrong with it is what `integrity_ok` finds."""
        return None

    # -- search (the keyword and vector indexes) -----------------------------------------------

    def text_search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        """The best `limit` chunks for an FTS5 MATCH expression, best first."""
        return self.keywords.search(match, limit, where)

    def vector_search(self, query_blob: bytes, limit: int, where: ChunkFilter | None = None, *,
                      candidates_for: int | None = None) -> list[VectorHit]:
        """The `limit` chunks nearest by cosine distance (exact distances), nearest first, within `where`."""
        return self.vectors.search(query_blob, limit, where, candidates_for=candidates_for)

    def text_ranking(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the best `limit` chunks for `match`, best first, without their rows."""
        return self.keywords.ranking(match, limit, where)

    def text_hits(self, ranked: Sequence[tuple[int, float]]) -> list[TextHit]:
        """The `TextHit`s of (seq, bm25) pairs, in their order (a chunk deleted meanwhile is left out)."""
        return self.keywords.hits(ranked)

    def dated_chunks(self, where: ChunkFilter, first: str, last: str, limit: int) -> list[TextHit]:
        """Up to `limit` dated chunks `where` passes (a window of days), nearest to the days `first` to `last` first
        (0 days within them), then by seq; their text is left out ("": a busy window holds many) and their bm25 is 0
        (listed for their date, not for a keyword)."""
        condition, args = where.sql("w")
        rows = self.conn.execute(
            "SELECT w.seq, w.path, w.source, w.start_line, w.end_line, '', w.date FROM chunks AS w"
            f" WHERE {condition} AND w.date IS NOT NULL"
            " ORDER BY max(julianday(:first) - julianday(w.date), julianday(w.date) - julianday(:last), 0), w.seq"
            " LIMIT :limit", {**args, "first": first, "last": last, "limit": limit})
        return [TextHit(*row[:6], 0.0, row[6]) for row in rows]

    def vocabulary(self, prefix: str) -> dict[str, int] | None:
        """The stems the keyword index holds that begin with `prefix`, each with how many chunks hold it (None:
        too many do to read at once; ask a longer prefix)."""
        return self.stems.stems(prefix)

    def text_scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        """The BM25 score each of `seqs` gets for `match` in any search (absent: it does not match)."""
        return self.keywords.scores_of(match, seqs)

    def vector_distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        """The cosine distance each of `seqs` (with a vector) gets in any vector search."""
        return self.vectors.distances_of(query_blob, seqs)

    def data_version(self) -> int:
        """Changes whenever another connection commits to the index (SQLite's own counter, per connection)."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def annotation_kinds(self) -> frozenset[str]:
        """Which annotations some chunk carries ("importance", "triggers", "projects"; none: ranking looks at none)."""
        row = self.conn.execute(f"SELECT max(importance IS NOT NULL), max(triggers IS NOT NULL),"
                                f" max(projects IS NOT NULL) FROM chunks WHERE {_ANNOTATED}").fetchone()
        return frozenset(kind for kind, present in zip(ANNOTATION_KINDS, row or (), strict=False) if present)

    def annotations_of(self, seqs: Collection[int]) -> dict[int, Annotations]:
        """The annotations of those of `seqs` that carry any."""
        found: dict[int, Annotations] = {}
        ordered = sorted(set(seqs))
        for start in range(0, len(ordered), 500):
            part = ordered[start:start + 500]
            found.update((seq, Annotations(importance, triggers, projects)) for seq, importance, triggers, projects in
                         self.conn.execute(f"SELECT seq, importance, triggers, projects FROM chunks WHERE seq IN"
                                           f" ({','.join('?' * len(part))}) AND ({_ANNOTATED})", part))
        return found

    def newest_date(self) -> str | None:
        """The latest date a chunk carries (recency decay counts ages from it)."""
        row = self.conn.execute("SELECT max(date) FROM chunks WHERE date IS NOT NULL").fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def vec_table_exists(self) -> bool:
        """Whether stored vectors can be searched (a schema-1 vec0 table needs sqlite-vec)."""
        return self.vectors.readable()

    def vector_method(self) -> str:
        """How `vector_search` answers on this connection (for diagnostics and benchmarks)."""
        return self.vectors.method()

    def vectors_in_cells(self) -> bool:
        """Whether vector search reads k-means cells (a large index: a deeper read ranks thousands of
        vectors fetched one by one, tens of milliseconds)."""
        return self.vectors.layout().cells

    def ensure_vector_table(self, dims: int, precision: str = "float32") -> None:
        self.vectors.ensure(dims, precision)

    def index_vectors(self, progress: Callable[[int, int], None] | None = None) -> None:
        """After an embedding pass: past CELL_MIN vectors, (re)build the cells searches read (vector_cells)."""
        with self.transaction():
            self.vectors.maintain(progress)

    def release_vector_index(self) -> None:
        """Before every vector is replaced in place: nothing to drop here (no graph is kept)."""

    # -- vectors of chunks ----------------------------------------------------------------------

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        """Record a chunk's vector (None, zero or not finite: no usable vector; never matched, not retried)."""
        self.vectors.put([(seq, blob)])
        self.conn.execute("UPDATE chunks SET embedded = 1, model = ? WHERE seq = ?", (model, seq))

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> list[tuple[int, bytes]]:
        """`store_vector` for many chunks at once, each only if it still waits for the text `hash` names.

        A chunk may have changed or gone while its vector was made (the provider is called outside
        any transaction); those are left alone. Returns the chunks given their answer (seq, blob).
        """
        if not items:
            return []
        waiting = {int(seq): str(h) for seq, h in self.conn.execute(
            "SELECT seq, hash FROM chunks WHERE embedded = 0 AND seq IN (SELECT value FROM json_each(?))",
            (json.dumps([seq for seq, _, _ in items]),))}
        current = [(seq, blob) for seq, h, blob in items if waiting.get(seq) == h]
        if not current:
            return []
        self.vectors.put(current)
        self.conn.execute("UPDATE chunks SET embedded = 1, model = ? WHERE seq IN (SELECT value FROM json_each(?))",
                          (model, json.dumps([seq for seq, _ in current])))
        return current

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        """Up to `limit` chunks waiting for a vector, in seq order from `after` (a cursor, so a pass ends)."""
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT seq, hash, text FROM chunks WHERE embedded = 0 AND seq > ? ORDER BY seq LIMIT ?", (after, limit))]

    # -- embedding cache (clawmem_index.index.cache) --------------------------------------------

    def set_vector_owner(self, provider: str, model: str, key: str) -> None:
        """Whose vectors the chunks hold (set with the first vector of a model)."""
        self.cache.set_vector_owner(provider, model, key)

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str], *,
                          touch: bool = True) -> dict[str, bytes]:
        """Vectors of this model by chunk hash, from the cache and the chunks' own; `touch` marks them used."""
        return self.cache.cached_embeddings(provider, model, key, hashes, touch=touch)

    def touch_cached(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Mark cache entries as just used, so pruning (oldest used first) keeps them."""
        self.cache.touch_cached(provider, model, key, hashes)

    def uncache(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Take entries out of the cache: chunks hold these vectors now."""
        self.cache.uncache(provider, model, key, hashes)

    def cache_embeddings(self, provider: str, model: str, key: str, vectors: Iterable[tuple[str, bytes]]) -> None:
        """Keep each (text hash, packed vector) for `provider`/`model`/`key`, replacing what it held."""
        self.cache.cache_embeddings(provider, model, key, vectors)

    def prune_cache(self, max_entries: int) -> int:
        """Drop the oldest-used entries past `max_entries`, counting a parked model's vectors."""
        return self.cache.prune_cache(max_entries)

    # -- a rebuild taking over the file it replaces (clawmem_index.index.carry) -----------------

    def copy_cache_from(self, other: Path) -> None:
        """Carry another index's cache, parked vectors and batch jobs over: a rebuild must not re-embed what it knew."""
        self.carry.copy_cache_from(other)

    def carry_vectors(self, owner: Owner | None, precision: str = "float32", *,
                      progress: Callable[[int, int], None] | None = None,
                      index_progress: Callable[[int, int], None] | None = None) -> int:
        """The chunks' vectors of the index `copy_cache_from` read; returns how many chunks took one."""
        return self.carry.carry_vectors(owner, precision, progress=progress, index_progress=index_progress)

    # -- a change of model ------------------------------------------------------------------------

    def reset_vectors(self, next_owner: Owner | None = None, precision: str = "float32") -> int:
        """Forget every vector (a new model's go in their place); returns how many chunks the index holds.

        The live model's vectors are parked (clawmem_index.index.parking) when `next_owner` is another
        model, else they go to the cache; a model parked earlier goes to the cache first, unless it is
        `next_owner` at the same `precision`: then its table is taken back, and only the chunks that
        changed meanwhile wait for a vector. Only inside a transaction that also stores the new
        fingerprint: readers keep the old vectors until it commits. A schema-1 vec0 table cannot be
        dropped without sqlite-vec: apsw.Error.
        """
        layout = self.vectors.layout()
        owner = self.cache.vector_owner()
        parked = self.parked.owner()
        table = HALVES if precision == "float16" else FLOATS
        back = next_owner is not None and parked == (next_owner, table)
        if parked is not None and not back:
            self.parked.to_cache()
        if back:
            self.parked.start_return()
        if owner is not None and next_owner is not None and owner != next_owner and not layout.legacy:
            self.parked.park(owner, layout.table)
        else:
            self.cache.cache_live(None)
        self.vectors.drop_all()
        self.meta.delete("vector_owner")
        self.conn.execute("UPDATE chunks SET embedded = 0, model = ''")
        chunks = self.conn.changes()
        dims = self.parked.finish_return(next_owner, table) if back and next_owner is not None else 0
        if dims and next_owner is not None:  # (`back` implies an owner: said again for the type checker)
            self.meta.set("vector_dims", str(dims))
            self.meta.set("vector_owner", json.dumps(list(next_owner)))
            self.uncache(*next_owner, (str(r[0]) for r in self.conn.execute(
                f"SELECT c.hash FROM chunks AS c JOIN {table} AS v ON v.rowid = c.seq")))  # stored once
            self.vectors.maintain()  # past CELL_MIN vectors the cells, straight from the vectors
            self.vectors.ensure(dims, precision)  # else the sign bits
        return chunks

    # -- batch jobs (clawmem_index.index.cache) ---------------------------------------------------

    def add_job(self, job: JobRow) -> None:
        self.batch_jobs.add_job(job)

    def jobs(self, provider: str, model: str, key: str) -> list[JobRow]:
        """The batch jobs this provider identity has running, oldest first."""
        return self.batch_jobs.jobs(provider, model, key)

    def uncached_pending(self, provider: str, model: str, key: str, *,
                         exclude: Collection[str] = ()) -> dict[str, str]:
        """Texts of the chunks waiting for a vector that no cached or chunk's vector gives, by hash."""
        return self.cache.uncached_pending(provider, model, key, exclude=exclude)

    def job_count(self) -> int:
        return self.batch_jobs.job_count()

    def touch_job(self, job_id: str, state: str, detail: str) -> None:
        self.batch_jobs.touch_job(job_id, state, detail)

    def drop_job(self, job_id: str) -> None:
        self.batch_jobs.drop_job(job_id)

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        return [tuple(row) for row in self.conn.execute(sql, args)]

