"""The one interface of an index store, whichever database holds it: `IndexStore`, a core and its parts.

The engine, the search and the daemon hold a store through these protocols; the SQLite `Store`
(clawmem_index.index.store) and the PostgreSQL `PgStore` (clawmem_index.index.pg.store) both
implement all of them, with the same parameter names (tests/index/test_interface.py checks it), and
each adds only what its own database needs (a shared index's generations and claim, a file's
private WAL). The store itself is its transactions, files and chunks; what lives beside them is a
part of a handful of methods, reached as an attribute (`store.meta`, `store.keywords`, ...). A new
backend is a store and its eight parts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from clawmem_index.index.filters import ChunkFilter
    from clawmem_index.index.rows import TextHit
    from clawmem_index.index.parking import Owner
    from clawmem_index.index.rows import ChunkRow, FileRow, JobRow
    from clawmem_index.index.rows import VectorHit
    from clawmem_index.text.annotations import Annotations

__all__ = ["CachePart", "CarryPart", "EmbeddingPart", "FactPart", "IndexStore", "JobPart", "KeywordPart",
           "MetaPart", "SharedReads", "VectorPart"]


class MetaPart(Protocol):
    """`store.meta`: the index's own settings and facts (its fingerprint, schema version, vector size)."""

    def get(self, key: str) -> str | None:
        ...

    def set(self, key: str, value: str) -> None:
        ...

    def delete(self, *keys: str) -> None:
        ...

    def all(self) -> dict[str, str]:
        ...


class KeywordPart(Protocol):
    """`store.keywords`: BM25 over the chunks' text, and the vocabulary a misspelled word is read against."""

    def search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        """The best `limit` chunks for an FTS5 MATCH expression, best first."""
        ...

    def ranking(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the best `limit` chunks for `match`, best first, without their rows."""
        ...

    def hits(self, ranked: Sequence[tuple[int, float]]) -> list[TextHit]:
        """The `TextHit`s of (seq, bm25) pairs, in their order (a chunk deleted meanwhile is left out)."""
        ...

    def scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        """The BM25 score each of `seqs` gets for `match` in any search (absent: it does not match)."""
        ...

    def vocabulary(self, prefix: str) -> dict[str, int] | None:
        """The stems (clawmem_index.text.stemming) the keyword index holds that begin with `prefix`, each
        with how many chunks hold it: what a misspelled query word is corrected against (None: too many do to read
        at once; ask a longer prefix)."""
        ...


class VectorPart(Protocol):
    """`store.vectors`: the vector index a search reads."""

    def search(self, query_blob: bytes, limit: int, where: ChunkFilter | None = None, *,
            candidates_for: int | None = None) -> list[VectorHit]:
        """The `limit` chunks nearest by cosine distance (exact distances), nearest first, within `where`."""
        ...

    def distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        """The cosine distance each of `seqs` (with a vector) gets in any vector search."""
        ...

    def method(self) -> str:
        """How `search` answers on this connection (for diagnostics and benchmarks)."""
        ...

    def readable(self) -> bool:
        """Whether stored vectors can be searched (a schema-1 vec0 table needs sqlite-vec)."""
        ...

    def in_cells(self) -> bool:
        """Whether a search reads k-means cells (a large index: a deeper read ranks thousands of vectors fetched
        one by one, tens of milliseconds)."""
        ...

    def ensure(self, dims: int, precision: str = "float32") -> None:
        """The tables (and their search structures) for `dims`-d vectors."""
        ...

    def build_index(self, progress: Callable[[int, int], None] | None = None) -> None:
        """After an embedding pass: (re)build what searches read (SQLite's cells, pgvector's HNSW graph)."""
        ...

    def release_index(self) -> None:
        """Before every vector is replaced in place: drop what would be rebuilt anyway."""
        ...


class EmbeddingPart(Protocol):
    """`store.embeddings`: which chunks hold a vector and which wait for one."""

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        """Record a chunk's vector (None, zero or not finite: no usable vector; never matched, not retried)."""
        ...

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> list[tuple[int, bytes]]:
        """`store_vector` for many chunks at once, each only if it still waits for the text `hash` names."""
        ...

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        """Up to `limit` chunks waiting for a vector, in seq order from `after` (a cursor, so a pass ends)."""
        ...

    def uncached_pending(self, provider: str, model: str, key: str, *, exclude: Collection[str] = ()) -> dict[str, str]:
        """Texts of the chunks waiting for a vector that no cached or chunk's vector gives, by hash (what a batch job
        would embed)."""
        ...

    def reset_vectors(self, next_owner: Owner | None = None, precision: str = "float32") -> int:
        """Forget every vector (a new model's go in their place); returns how many chunks the index holds."""
        ...


class CachePart(Protocol):
    """`store.cache`: vectors kept by the hash of their text, so no text is embedded twice."""

    def set_vector_owner(self, provider: str, model: str, key: str) -> None:
        """Whose vectors the chunks hold (set with the first vector of a model)."""
        ...

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str], *,
            touch: bool = True) -> dict[str, bytes]:
        """Vectors of this model by chunk hash, from the cache and the chunks' own (two queries)."""
        ...

    def touch_cached(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Mark cache entries as just used, so pruning (oldest used first) keeps them."""
        ...

    def uncache(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Take entries out of the cache: chunks hold these vectors now."""
        ...

    def cache_embeddings(self, provider: str, model: str, key: str, vectors: Iterable[tuple[str, bytes]]) -> None:
        """Keep each (text hash, packed vector) for `provider`/`model`/`key`, replacing what it held."""
        ...

    def prune_cache(self, max_entries: int) -> int:
        """Drop the oldest-used entries past `max_entries`; returns how many went."""
        ...


class CarryPart(Protocol):
    """`store.carry`: what a rebuild takes over from the index it replaces."""

    def copy_cache_from(self, other: Path) -> None:
        """Carry another index's cache, parked vectors and batch jobs over: a rebuild must not re-embed what it knew."""
        ...

    def carry_vectors(self, owner: Owner | None, precision: str = "float32", *, progress: Callable[[int, int],
            None] | None = None, index_progress: Callable[[int, int], None] | None = None) -> int:
        """The chunks' vectors of the index `copy_cache_from` read; returns how many chunks took one."""
        ...


class JobPart(Protocol):
    """`store.batch_jobs`: a provider's batch jobs the embedding pass is waiting on."""

    def add_job(self, job: JobRow) -> None:
        ...

    def jobs(self, provider: str, model: str, key: str) -> list[JobRow]:
        """The batch jobs this provider identity has running, oldest first."""
        ...

    def job_count(self) -> int:
        ...

    def touch_job(self, job_id: str, state: str, detail: str) -> None:
        ...

    def drop_job(self, job_id: str) -> None:
        ...


class FactPart(Protocol):
    """`store.facts`: what ranking reads of the chunks beside their text and vectors: their dates and notes."""

    def dated_chunks(self, where: ChunkFilter, first: str, last: str, limit: int) -> list[TextHit]:
        """Up to `limit` dated chunks `where` passes (a window of days), nearest to the days `first` to `last` first
        (0 days within them), then by seq; their text is left out ("": a busy window holds many) and their bm25 is 0
        (listed for their date, not for a keyword)."""
        ...

    def newest_date(self) -> str | None:
        """The latest date a chunk carries (recency decay counts ages from it)."""
        ...

    def annotation_kinds(self) -> frozenset[str]:
        """Which annotations some chunk carries: "importance", "triggers", "projects"
        (clawmem_index.text.annotations)."""
        ...

    def annotations_of(self, seqs: Collection[int]) -> dict[int, Annotations]:
        """The annotations of those of `seqs` that carry any."""
        ...


class IndexStore(Protocol):
    """What every index store answers: its transactions, files and chunks, and its parts."""

    @property
    def terms_of(self) -> Callable[[str], Any] | None:
        """What the store makes of a chunk's text before storing it, done where the text is chunked (None: the
        database tokenizes it, as FTS5 does). Read-only here, so a store may name what its terms are."""
        ...

    # Whether every stored vector is also in the embedding cache (a shared index's cache is the fleet's).
    caches_stored_vectors: bool
    # Whether vector search runs in the database (sqlite-vec loaded; pgvector always), for `status`.
    vec_loaded: bool

    # Its parts (read-only: each store names its own classes).
    @property
    def meta(self) -> MetaPart: ...
    @property
    def keywords(self) -> KeywordPart: ...
    @property
    def vectors(self) -> VectorPart: ...
    @property
    def embeddings(self) -> EmbeddingPart: ...
    @property
    def cache(self) -> CachePart: ...
    @property
    def carry(self) -> CarryPart: ...
    @property
    def batch_jobs(self) -> JobPart: ...
    @property
    def facts(self) -> FactPart: ...

    def close(self) -> None:
        ...

    def interrupt(self) -> None:
        """End the statement running on this store's connection now, from any thread (its client has gone)."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """BEGIN IMMEDIATE at the outer level, SAVEPOINT inside; rollback never masks the error."""
        ...

    def integrity_ok(self) -> bool:
        ...

    def data_version(self) -> int:
        """Changes whenever another connection commits to the index (SQLite's own counter, per connection)."""
        ...

    def file_stats(self) -> dict[str, tuple[int, int]]:
        """(mtime, size) of every indexed file: all a no-change sync needs to know."""
        ...

    def file_stat(self, path: str) -> tuple[int, int] | None:
        """(mtime, size) of one indexed file (None: not indexed)."""
        ...

    def file_row(self, path: str) -> FileRow | None:
        ...

    def upsert_file(self, row: FileRow) -> None:
        ...

    def chunks_of(self, path: str) -> list[ChunkRow]:
        ...

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str, text: str,
            fts_text: str, model: str = "", date: str | None = None, terms: Any = None,
            annotations: Annotations | None = None) -> int:
        """Add a chunk with its FTS row; text that UTF-8 cannot encode (lone surrogates) is stored repaired."""
        ...

    def date_undated(self, dates: Mapping[str, str]) -> int:
        """Give the undated chunks of these memory files (path -> ISO date) that date; returns how many."""
        ...

    def move_chunk(self, seq: int, start_line: int, end_line: int) -> None:
        """New line numbers for an unchanged chunk (text shifted by an edit above it)."""
        ...

    def delete_chunks(self, seqs: Sequence[int]) -> None:
        """Drop chunks with their keyword rows and vectors; a vector whose text is indexed nowhere else is cached."""
        ...

    def delete_file(self, path: str) -> int:
        ...

    def delete_chunks_from(self, path: str, start_line: int) -> int:
        """Drop a file's chunks that start at `start_line` or later (a transcript's tail made again)."""
        ...

    def counts(self) -> tuple[int, int]:
        ...

    def pending_embeddings(self) -> int:
        ...

    def damage(self, chunks: int | None = None) -> str | None:
        """Rows changed behind the writer's back (see PgStore.damage). A SQLite index is one private file"""
        ...

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        ...


@runtime_checkable
class SharedReads(Protocol):
    """What a store that reads several workspaces adds (a shared index's; a SQLite index holds one workspace):
    the engine asks for it by this protocol, not by the backend's name."""

    scope: tuple[str, ...]  # the workspaces a search reads (this one first)

    def visible(self) -> list[str]:
        """The workspaces in scope this connection found, at its last `data_version`."""
        ...

    def chunk_lines(self, workspace: str, path: str, start_line: int, end_line: int) -> list[str | None]:
        """Lines `start_line` to `end_line` of another workspace's file, as the chunks the index holds give them
        (None for a line no chunk holds)."""
        ...
