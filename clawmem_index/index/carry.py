"""A rebuild taking over the index file it replaces: its cache, parked vectors, batch jobs and chunks' vectors.

A rebuild must not re-embed what the old file knew. `copy_cache_from` reads the old file's cache,
parked vectors and jobs before any chunk is written; `carry_vectors` gives the new chunks the old
chunks' vectors by text once they are all in (the rest go to the cache).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import apsw

from clawmem_index.errors import StoreError
from clawmem_index.index.cache import EmbeddingCache
from clawmem_index.index.parking import Owner, ParkedVectors
from clawmem_index.index.vector_index import FLOAT32_SQL, FLOATS, HALF_SQL, HALVES, VectorIndex

__all__ = ["CARRY_BATCH", "VectorCarry"]

CARRY_BATCH = 8192  # chunks a statement when a rebuild takes the old file's vectors (progress moves between)


class VectorCarry:
    """What one connection's index takes over from another file; `transaction`: the store's (see Store.transaction)."""

    def __init__(self, conn: apsw.Connection, vectors: VectorIndex, parked: ParkedVectors, cache: EmbeddingCache,
                 transaction: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        self.conn = conn
        self.vectors = vectors
        self.parked = parked
        self.cache = cache
        self.transaction = transaction
        self._carrying: Path | None = None  # the index copy_cache_from read, until carry_vectors

    def copy_cache_from(self, other: Path) -> None:
        """Carry another index's cache, parked vectors and batch jobs over: a rebuild must not re-embed what it knew.

        Its chunks' vectors follow with `carry_vectors`, once this index has its chunks. Jobs still
        running at the provider are results already paid for: their vectors land in the cache of
        whichever index holds the job when it completes.
        """
        self.conn.execute("ATTACH DATABASE ? AS old", (str(other),))
        try:
            tables = {str(row[0]) for row in self.conn.execute(
                "SELECT name FROM old.sqlite_master WHERE type = 'table'")}
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

        Where they are `owner`'s they go straight to this index's chunks holding their texts, at
        `precision` (converted in the statement when the old file stored another: one statement, not
        a row at a time through the cache: a `reindex` of 3,003 notes moved 80 MB each way, and a
        cache row written and deleted leaves a free page behind); the others, and those of texts no
        chunk holds now, go to the cache. All or nothing: from a damaged file none is carried, and they are made again.
        Outside a transaction (it attaches the other file), in one of its own. `progress` hears
        how many chunks were looked at, `index_progress` how a cells build goes (VectorCells.build).
        """
        other, self._carrying = self._carrying, None
        if other is None:
            return 0
        try:
            return self._carry_from(other, owner, precision, progress, index_progress)
        except (apsw.Error, StoreError, ValueError):  # its transaction's refusals are StoreErrors
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
                if plain and owner == (provider, model, key) and not self.vectors.readable():
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
        """Each chunk's vector (a blob of `size` bytes) from the attached `old` file's `table`, by text, stored at
        `precision`, CARRY_BATCH chunks a statement (so that `progress` moves: a million vectors are gigabytes);
        then the cells or bits."""
        self.vectors.create(dims, precision)
        target = self.vectors.table()
        stored = {(FLOATS, HALVES): f"{HALF_SQL}(v.embedding)",
                  (HALVES, FLOATS): f"{FLOAT32_SQL}(v.embedding)"}.get((table, target), "v.embedding")
        total = int(self.conn.execute("SELECT count(*) FROM main.chunks").get)
        taken = seen = last = 0
        while True:
            row = self.conn.execute("SELECT max(seq), count(*) FROM (SELECT seq FROM main.chunks WHERE seq > ?"
                                    " ORDER BY seq LIMIT ?)", (last, CARRY_BATCH)).fetchone()
            assert row is not None  # an aggregate's one row
            upto, count = row
            if upto is None:
                break
            taken += self.vectors.insert_rows(
                f"SELECT seq, stored FROM (SELECT c.seq, {stored} AS stored FROM main.chunks AS c"
                f" JOIN old.{table} AS v ON v.rowid = (SELECT o.seq FROM old.chunks AS o WHERE o.hash = c.hash AND"
                f" EXISTS (SELECT 1 FROM old.{table} AS w WHERE w.rowid = o.seq AND length(w.embedding) = ?) LIMIT 1)"
                " WHERE c.seq > ? AND c.seq <= ? ORDER BY c.seq) WHERE stored IS NOT NULL", (size, last, upto))
            last, seen = int(upto), seen + int(count)
            if progress:
                progress(seen, total)
        self.conn.execute(f"UPDATE chunks SET embedded = 1, model = ? WHERE seq IN (SELECT rowid FROM main.{target})",
                          (owner[1],))
        self.cache.set_vector_owner(*owner)
        self.vectors.maintain(index_progress)  # past CELL_MIN vectors the cells, straight from the vectors
        self.vectors.ensure(dims, precision)  # else the sign bits
        return taken
