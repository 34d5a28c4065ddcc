"""The index file: its connection, transactions, files and chunks, and the embedding cache and jobs.

The store is the index's small interface; what lives beside the chunks has its own module:
`schema` (migrations, meta), `keyword_index` (FTS5, BM25) and `vector_index` (vectors, KNN). Only
these four modules speak SQL.

Python's stdlib sqlite3 often cannot load extensions, so the connection is apsw (a current SQLite
with FTS5, able to load sqlite-vec everywhere). apsw runs in autocommit mode; `transaction()` is
the one way to group writes, nesting as savepoints.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import stat
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from clawmem_index.errors import IndexCorrupt, IndexUnavailable
from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.keyword_index import KeywordIndex, PostingsCache, TextHit
from clawmem_index.index.parking import Owner, ParkedVectors
from clawmem_index.index.schema import MIGRATIONS, SCHEMA_VERSION, Meta, check_migrated, migrate
from clawmem_index.text.storable import storable
from clawmem_index.index.vector_cells import SharedCells
from clawmem_index.index.vector_index import FLOATS, HALVES, VectorHit, VectorIndex

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "ChunkFilter", "ChunkRow", "FileRow", "JobRow", "Store", "TextHit", "VectorHit",
           "make_private_dirs", "make_private_file"]

# Bytes the WAL file is cut back to once a checkpoint has emptied it. A rebuild's swap writes the whole
# index through the WAL, and without a limit the file keeps that size while any reader stays open
# (a daemon's readers always do): 9 GB beside a 9 GB index at 1M 1,536-d vectors.
WAL_LIMIT = 64 << 20
CARRY_BATCH = 8192  # chunks a statement when a rebuild takes the old file's vectors (progress moves between)


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


class Store:
    """One open index file. Not shared between threads: open one Store per thread."""

    # What a backend makes of a chunk's text before storing it, done where the text is chunked (a
    # parse worker) rather than on the writer; FTS5 tokenizes inside SQLite, so nothing here.
    terms_of: Callable[[str], Any] | None = None
    # Each vector is stored once: with its chunks while the index holds its text, in the cache after.
    caches_stored_vectors = False

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
        if read_only:
            flags = apsw.SQLITE_OPEN_READONLY
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if create else 0)
        try:
            if create and not read_only:
                make_private_file(path)
            self.conn = apsw.Connection(str(path), flags=flags)
            self.conn.set_busy_timeout(10_000)
            if not fast_unsafe:
                _keep_wal_files(self.conn)
            if read_only:
                pass  # the writer set WAL mode; a reader joins it as it is
            elif fast_unsafe:
                # A rebuild writes a private file that is thrown away if anything fails: no journal needed.
                # SQLite's own page cache (2 MB): 64 MB was asked for here for a long time without taking
                # effect, and taking effect it added ~65 MB to a cold index's peak (20,000 notes: 259 MB against
                # 193 MB for the process tree) for no time gained (10.3 s both).
                _pragmas(self.conn, "journal_mode=OFF", "synchronous=OFF")
            else:
                _pragmas(self.conn, "journal_mode=WAL", "synchronous=NORMAL", f"journal_size_limit={WAL_LIMIT}")
            self.vec_loaded, self.vec_error = _load_sqlite_vec(self.conn)
            if read_only:
                check_migrated(self.conn, path)
            else:
                migrate(self.conn)
        except (apsw.NotADBError, apsw.CorruptError) as exc:
            raise IndexCorrupt(f"index {path} is damaged: {exc}") from exc
        except apsw.Error as exc:
            raise IndexUnavailable(f"cannot open index {path}: {exc}") from exc
        self._depth = 0
        self.meta = Meta(self.conn)
        self.keywords = KeywordIndex(self.conn, keep_scores=keep_keyword_scores, postings=keyword_postings)
        self.vectors = VectorIndex(self.conn, self.meta, loaded=self.vec_loaded, shared_cells=shared_cells)
        self.parked = ParkedVectors(self.conn, self.meta, self.vectors)
        self._carrying: Path | None = None  # the index copy_cache_from read, until carry_vectors

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
            "SELECT seq, id, path, start_line, end_line, hash, text FROM chunks WHERE path = ? ORDER BY start_line, seq",
            (path,))]

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str,
                     text: str, fts_text: str, model: str = "", date: str | None = None, terms: Any = None) -> int:
        """Add a chunk with its FTS row; text that UTF-8 cannot encode (lone surrogates) is stored repaired.

        `terms` is never set here (`terms_of` is None): FTS5 tokenizes `fts_text` itself."""
        id, path, text, fts_text = storable(id), storable(path), storable(text), storable(fts_text)
        self.conn.execute(
            "INSERT INTO chunks(id, path, source, start_line, end_line, hash, model, text, date, updated_at)"
            " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (id, path, source, start_line, end_line, hash, model, text, date, time.time()),
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
        """Drop chunks with their FTS rows and vectors; a vector whose text is indexed nowhere else goes to the cache."""
        self._cache_live(seqs)
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

    def text_scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        """The BM25 score each of `seqs` gets for `match` in any search (absent: it does not match)."""
        return self.keywords.scores_of(match, seqs)

    def vector_distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        """The cosine distance each of `seqs` (with a vector) gets in any vector search."""
        return self.vectors.distances_of(query_blob, seqs)

    def data_version(self) -> int:
        """Changes whenever another connection commits to the index (SQLite's own counter, per connection)."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

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

    # -- embedding cache ----------------------------------------------------------------------
    #
    # Each vector is stored once. The chunks' own vectors (chunks_vec) are those of the model named
    # in meta `vector_owner`; `embedding_cache` holds only the vectors of texts the index no longer
    # has (a deleted note, another model's vectors). A lookup sees both; a chunk that takes a cached
    # vector takes it out of the cache, and a vector whose last chunk goes moves in. The model a switch
    # leaves behind is parked instead (its table renamed aside: `reset_vectors`), counted in the cache's
    # bound. `max_entries` bounds the cache and the parked vectors: the chunks' vectors are never pruned.

    def set_vector_owner(self, provider: str, model: str, key: str) -> None:
        """Whose vectors the chunks hold (set with the first vector of a model).

        An index from before vectors were stored once has the chunks' vectors in its cache too:
        those copies go when its owner is first named.
        """
        owner = json.dumps([provider, model, key])
        if self.meta.get("vector_owner") == owner:
            return
        self.meta.set("vector_owner", owner)
        self.conn.execute(
            "DELETE FROM embedding_cache WHERE provider = ? AND model = ? AND provider_key = ? AND hash IN"
            f" (SELECT c.hash FROM chunks AS c JOIN {self.vectors.table()} AS v ON v.rowid = c.seq)",
            (provider, model, key))

    def _vector_owner(self) -> tuple[str, str, str] | None:
        raw = self.meta.get("vector_owner")
        if raw is None or not self.vectors.readable():
            return None
        provider, model, key = json.loads(raw)
        return str(provider), str(model), str(key)

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str], *,
                          touch: bool = True) -> dict[str, bytes]:
        """Vectors of this model by chunk hash, from the cache and the chunks' own (two queries).

        `touch` marks the cache entries used (a write: see `touch_cached`).
        """
        wanted = json.dumps(sorted(set(hashes)))
        found = {str(h): bytes(blob) for h, blob in self.conn.execute(
            "SELECT hash, embedding FROM embedding_cache WHERE provider = ? AND model = ? AND provider_key = ?"
            " AND hash IN (SELECT value FROM json_each(?))", (provider, model, key, wanted))}
        if touch:
            self.touch_cached(provider, model, key, found)
        if self._vector_owner() == (provider, model, key):
            found.update((str(h), self.vectors.float32(bytes(blob))) for h, blob in self.conn.execute(
                f"SELECT c.hash, v.embedding FROM chunks AS c JOIN {self.vectors.table()} AS v ON v.rowid = c.seq"
                " WHERE c.hash IN (SELECT value FROM json_each(?))", (wanted,)))
        return found

    def touch_cached(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Mark cache entries as just used, so pruning (oldest used first) keeps them."""
        wanted = sorted(set(hashes))
        if wanted:
            self.conn.execute(
                "UPDATE embedding_cache SET updated_at = ? WHERE provider = ? AND model = ? AND provider_key = ?"
                " AND hash IN (SELECT value FROM json_each(?))", (time.time(), provider, model, key, json.dumps(wanted)))

    def uncache(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Take entries out of the cache: chunks hold these vectors now."""
        wanted = sorted(set(hashes))
        if wanted:
            self.conn.execute(
                "DELETE FROM embedding_cache WHERE provider = ? AND model = ? AND provider_key = ?"
                " AND hash IN (SELECT value FROM json_each(?))", (provider, model, key, json.dumps(wanted)))

    def _cache_live(self, seqs: Sequence[int] | None) -> None:
        """Move the vectors of chunks `seqs` (None: every chunk) into the cache, under their owner.

        A text another chunk still holds keeps its vector there instead (None: no chunk is left).
        """
        if seqs is not None and not seqs:
            return  # most file syncs drop no chunk: no query for them
        owner = self._vector_owner()
        if owner is None:
            return
        # Per text, once: cached if the chunks going are all the chunks holding it (k copies cost O(k log k)).
        among = "" if seqs is None else " WHERE c.seq IN (SELECT value FROM json_each(:seqs))"
        table = self.vectors.table()
        kept = "" if seqs is None else (
            f" HAVING count(*) = (SELECT count(*) FROM chunks AS o JOIN {table} AS ov ON ov.rowid = o.seq"
            " WHERE o.hash = c.hash)")
        vector = self.vectors.sql_float32("v.embedding")
        self.conn.execute(
            "INSERT OR REPLACE INTO embedding_cache(provider, model, provider_key, hash, embedding, dims, updated_at)"
            f" SELECT :provider, :model, :key, c.hash, {vector}, length({vector}) / 4, :now"
            f" FROM chunks AS c JOIN {table} AS v ON v.rowid = c.seq{among} GROUP BY c.hash{kept}",
            {"provider": owner[0], "model": owner[1], "key": owner[2], "now": time.time(),
             "seqs": json.dumps(list(seqs or ()))})

    def cache_embeddings(self, provider: str, model: str, key: str, vectors: Iterable[tuple[str, bytes]]) -> None:
        """Keep each (text hash, packed vector) for `provider`/`model`/`key`, replacing what it held."""
        now = time.time()
        self.conn.executemany(
            "INSERT OR REPLACE INTO embedding_cache VALUES(?, ?, ?, ?, ?, ?, ?)",
            ((provider, model, key, h, blob, len(blob) // 4, now) for h, blob in vectors))

    def prune_cache(self, max_entries: int) -> int:
        """Drop the oldest-used entries past `max_entries`, counting a parked model's vectors (which go
        to the cache first when the bound is passed)."""
        total = int(self.conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0])
        parked = self.parked.count()
        if parked and total + parked > max_entries:
            self.parked.to_cache()
            total = int(self.conn.execute("SELECT count(*) FROM embedding_cache").fetchone()[0])
        excess = total - max_entries
        if excess <= 0:
            return 0
        self.conn.execute(
            "DELETE FROM embedding_cache WHERE rowid IN (SELECT rowid FROM embedding_cache ORDER BY updated_at, rowid LIMIT ?)",
            (excess,))
        return excess

    def copy_cache_from(self, other: Path) -> None:
        """Carry another index's cache, parked vectors and batch jobs over: a rebuild must not re-embed what it knew.

        Its chunks' vectors follow with `carry_vectors`, once this index has its chunks. Jobs still
        running at the provider are results already paid for: their vectors land in the cache of
        whichever index holds the job when it completes.
        """
        self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        try:
            tables = {str(row[0]) for row in self.conn.execute("SELECT name FROM old.sqlite_master WHERE type = 'table'")}
            if "embedding_cache" in tables:
                self.conn.execute("INSERT OR IGNORE INTO embedding_cache SELECT * FROM old.embedding_cache")
            self.parked.carry_from("old", tables)
            if "embedding_jobs" in tables:
                self.conn.execute("INSERT OR IGNORE INTO embedding_jobs SELECT * FROM old.embedding_jobs")
        finally:
            self.conn.execute("DETACH DATABASE old")
        self._carrying = other

    def carry_vectors(self, owner: Owner | None, precision: str = "float32", *,
                      progress: Callable[[int, int], None] | None = None,
                      index_progress: Callable[[int, int], None] | None = None) -> int:
        """The chunks' vectors of the index `copy_cache_from` read; returns how many chunks took one.

        Where they are `owner`'s at `precision` they go straight to this index's chunks holding
        their texts (one statement, not a row at a time through the cache: a `reindex` of 3,003
        notes moved 80 MB each way); the others, and those of texts no chunk holds now, go to the
        cache. All or nothing: from a damaged file none is carried, and they are made again.
        Outside a transaction (it attaches the other file), in one of its own. `progress` hears
        how many chunks were looked at, `index_progress` how a cells build goes (VectorCells.build).
        """
        other, self._carrying = self._carrying, None
        if other is None:
            return 0
        try:
            return self._carry_from(other, owner, precision, progress, index_progress)
        except (apsw.Error, ValueError):
            return 0

    def _carry_from(self, other: Path, owner: Owner | None, precision: str,
                    progress: Callable[[int, int], None] | None,
                    index_progress: Callable[[int, int], None] | None) -> int:
        self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        try:
            made = {str(name): str(sql) for name, sql in self.conn.execute(
                "SELECT name, sql FROM old.sqlite_master WHERE name IN (?, ?)", (FLOATS, HALVES))}
            raw = self.conn.execute("SELECT value FROM old.meta WHERE key = 'vector_owner'").fetchone()
            table = next((t for t in (FLOATS, HALVES) if t in made), None)  # FLOATS first: see VectorIndex
            if raw is None or table is None:
                return 0
            plain = made[table].upper().startswith("CREATE TABLE")  # not a schema-1 vec0 table: those are cached
            provider, model, key = (str(part) for part in json.loads(raw[0]))
            width = 2 if table == HALVES else 4
            known = self.conn.execute("SELECT value FROM old.meta WHERE key = 'vector_dims'").fetchone() or \
                self.conn.execute(f"SELECT length(embedding) / {width} FROM old.{table} LIMIT 1").fetchone()
            if known is None:
                return 0
            dims = int(known[0])
            size = dims * width  # a blob of another size is no vector: not carried, made again
            taken = 0
            with self.transaction():
                if plain and owner == (provider, model, key) and not self.vectors.readable() \
                        and table == (HALVES if precision == "float16" else FLOATS):
                    taken = self._take_vectors(table, size, dims, owner, precision, progress, index_progress)
                vector = self.vectors.sql_float32("v.embedding", half=table == HALVES)
                self.conn.execute(
                    "INSERT OR IGNORE INTO embedding_cache(provider, model, provider_key, hash, embedding, dims,"
                    f" updated_at) SELECT ?, ?, ?, o.hash, {vector}, length({vector}) / 4, ?"
                    f" FROM old.chunks AS o JOIN old.{table} AS v ON v.rowid = o.seq WHERE length(v.embedding) = ?"
                    " AND NOT EXISTS (SELECT 1 FROM main.chunks AS c WHERE c.hash = o.hash AND c.embedded = 1)",
                    (provider, model, key, time.time(), size))
            return taken
        finally:
            self.conn.execute("DETACH DATABASE old")

    def _take_vectors(self, table: str, size: int, dims: int, owner: Owner, precision: str,
                      progress: Callable[[int, int], None] | None,
                      index_progress: Callable[[int, int], None] | None) -> int:
        """Each chunk's vector (a blob of `size` bytes) from the attached `old` file's `table`, by text,
        CARRY_BATCH chunks a statement (so that `progress` moves: a million vectors are gigabytes);
        then the cells or bits."""
        self.vectors.create(dims, precision)
        total = int(self.conn.execute("SELECT count(*) FROM main.chunks").fetchone()[0])
        taken = seen = last = 0
        while True:
            upto = self.conn.execute("SELECT max(seq), count(*) FROM (SELECT seq FROM main.chunks WHERE seq > ?"
                                     " ORDER BY seq LIMIT ?)", (last, CARRY_BATCH)).fetchone()
            if upto[0] is None:
                break
            taken += self.vectors.insert_rows(
                f"SELECT c.seq, v.embedding FROM main.chunks AS c JOIN old.{table} AS v ON v.rowid = (SELECT o.seq"
                f" FROM old.chunks AS o WHERE o.hash = c.hash AND EXISTS (SELECT 1 FROM old.{table} AS w"
                " WHERE w.rowid = o.seq AND length(w.embedding) = ?) LIMIT 1) WHERE c.seq > ? AND c.seq <= ?"
                " ORDER BY c.seq", (size, last, upto[0]))
            last, seen = int(upto[0]), seen + int(upto[1])
            if progress:
                progress(seen, total)
        self.conn.execute(f"UPDATE chunks SET embedded = 1, model = ? WHERE seq IN (SELECT rowid FROM main.{table})",
                          (owner[1],))
        self.set_vector_owner(*owner)
        self.vectors.maintain(index_progress)  # past CELL_MIN vectors the cells, straight from the vectors
        self.vectors.ensure(dims, precision)  # else the sign bits
        return taken

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
        owner = self._vector_owner()
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
            self._cache_live(None)
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
        """Texts of the chunks waiting for a vector that no cached or chunk's vector gives, by hash (what a batch job would embed)."""
        live = "" if self._vector_owner() != (provider, model, key) else (
            f" AND NOT EXISTS (SELECT 1 FROM chunks AS o JOIN {self.vectors.table()} AS v ON v.rowid = o.seq"
            " WHERE o.hash = c.hash)")
        rows = self.conn.execute(
            "SELECT c.hash, c.text FROM chunks AS c WHERE c.embedded = 0 AND NOT EXISTS (SELECT 1 FROM"
            " embedding_cache AS e WHERE e.provider = ? AND e.model = ? AND e.provider_key = ? AND e.hash = c.hash)"
            f"{live}", (provider, model, key))
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


def _pragmas(conn: apsw.Connection, *settings: str) -> None:
    """Each PRAGMA in a statement of its own, run to its end: in one `execute`, apsw stops at the first
    that answers a row (journal_mode does) and the rest never run."""
    for setting in settings:
        conn.execute(f"PRAGMA {setting}").fetchall()


def _keep_wal_files(conn: apsw.Connection) -> None:
    """Leave the -wal and -shm files in place when the last connection closes (SQLITE_FCNTL_PERSIST_WAL).

    Opening a WAL index makes its -shm file when missing, and on a full disk that fails: a daemon
    restarted then (systemd does) could not even serve what is indexed. Kept, they need no new space.
    """
    keep = ctypes.c_int(1)
    conn.file_control("main", apsw.SQLITE_FCNTL_PERSIST_WAL, ctypes.addressof(keep))


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
