"""Which chunks of an index file hold a vector and which wait for one: the store's `embeddings` part.

A chunk's vector lives in the vector tables (vector_index) and its `embedded` flag in `chunks`; both
change together here. A change of model parks the live model's vectors (parking) or caches them
(cache) before the chunks wait again.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

import apsw

from clawmem_index.index.cache import EmbeddingCache
from clawmem_index.index.parking import Owner, ParkedVectors
from clawmem_index.index.schema import Meta
from clawmem_index.index.vector_index import FLOATS, HALVES, VectorIndex

__all__ = ["ChunkVectors"]


class ChunkVectors:
    """The chunks' vectors on one connection, with the cache and parked model they trade with."""

    def __init__(self, conn: apsw.Connection, meta: Meta, vectors: VectorIndex, parked: ParkedVectors,
                 cache: EmbeddingCache) -> None:
        self._conn = conn
        self._meta = meta
        self._vectors = vectors
        self._parked = parked
        self._cache = cache

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        """Record a chunk's vector (None, zero or not finite: no usable vector; never matched, not retried)."""
        self._vectors.put([(seq, blob)])
        self._conn.execute("UPDATE chunks SET embedded = 1, model = ? WHERE seq = ?", (model, seq))

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> list[tuple[int, bytes]]:
        """`store_vector` for many chunks at once, each only if it still waits for the text `hash` names.

        A chunk may have changed or gone while its vector was made (the provider is called outside
        any transaction); those are left alone. Returns the chunks given their answer (seq, blob).
        """
        if not items:
            return []
        waiting = {int(seq): str(h) for seq, h in self._conn.execute(
            "SELECT seq, hash FROM chunks WHERE embedded = 0 AND seq IN (SELECT value FROM json_each(?))",
            (json.dumps([seq for seq, _, _ in items]),))}
        current = [(seq, blob) for seq, h, blob in items if waiting.get(seq) == h]
        if not current:
            return []
        self._vectors.put(current)
        self._conn.execute("UPDATE chunks SET embedded = 1, model = ? WHERE seq IN (SELECT value FROM json_each(?))",
                           (model, json.dumps([seq for seq, _ in current])))
        return current  # type: ignore[return-value]  # (a None blob is stored as no usable vector)

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        """Up to `limit` chunks waiting for a vector, in seq order from `after` (a cursor, so a pass ends)."""
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self._conn.execute(
            "SELECT seq, hash, text FROM chunks WHERE embedded = 0 AND seq > ? ORDER BY seq LIMIT ?", (after, limit))]

    def uncached_pending(self, provider: str, model: str, key: str, *,
                         exclude: Collection[str] = ()) -> dict[str, str]:
        """Texts of the chunks waiting for a vector that no cached or chunk's vector gives, by hash
        (what a batch job would embed)."""
        live = "" if self._cache.vector_owner() != (provider, model, key) else (
            f" AND NOT EXISTS (SELECT 1 FROM chunks AS o JOIN {self._vectors.table()} AS v ON v.rowid = o.seq"
            " WHERE o.hash = c.hash)")
        rows = self._conn.execute(
            "SELECT c.hash, c.text FROM chunks AS c WHERE c.embedded = 0 AND NOT EXISTS (SELECT 1 FROM"
            " embedding_cache AS e WHERE e.provider = ? AND e.model = ? AND e.provider_key = ? AND e.hash = c.hash)"
            f"{live}", (provider, model, key))
        return {str(h): str(text) for h, text in rows if h not in exclude}

    def reset_vectors(self, next_owner: Owner | None = None, precision: str = "float32") -> int:
        """Forget every vector (a new model's go in their place); returns how many chunks the index holds.

        The live model's vectors are parked (clawmem_index.index.parking) when `next_owner` is another
        model, else they go to the cache; a model parked earlier goes to the cache first, unless it is
        `next_owner` at the same `precision`: then its table is taken back, and only the chunks that
        changed meanwhile wait for a vector. Only inside a transaction that also stores the new
        fingerprint: readers keep the old vectors until it commits. A schema-1 vec0 table cannot be
        dropped without sqlite-vec: apsw.Error.
        """
        layout = self._vectors.layout()
        owner = self._cache.vector_owner()
        parked = self._parked.owner()
        table = HALVES if precision == "float16" else FLOATS
        back = next_owner is not None and parked == (next_owner, table)
        if parked is not None and not back:
            self._parked.to_cache()
        if back:
            self._parked.start_return()
        if owner is not None and next_owner is not None and owner != next_owner and not layout.legacy:
            self._parked.park(owner, layout.table)
        else:
            self._cache.cache_live(None)
        self._vectors.drop_all()
        self._meta.delete("vector_owner")
        self._conn.execute("UPDATE chunks SET embedded = 0, model = ''")
        chunks = self._conn.changes()
        dims = self._parked.finish_return(next_owner, table) if back and next_owner is not None else 0
        if dims and next_owner is not None:  # (`back` implies an owner: said again for the type checker)
            self._meta.set("vector_dims", str(dims))
            self._meta.set("vector_owner", json.dumps(list(next_owner)))
            self._cache.uncache(*next_owner, (str(r[0]) for r in self._conn.execute(
                f"SELECT c.hash FROM chunks AS c JOIN {table} AS v ON v.rowid = c.seq")))  # stored once
            self._vectors.maintain()  # past CELL_MIN vectors the cells, straight from the vectors
            self._vectors.ensure(dims, precision)  # else the sign bits
        return int(chunks)
