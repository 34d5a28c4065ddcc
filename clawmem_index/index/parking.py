"""The vectors of the model a switch leaves behind, parked: their table renamed aside, not copied.

A switch of model used to move every vector through `embedding_cache`, both ways (3,003 notes at
1,536-d: 80 MB each way and ~240 MB of pages committed, 1.9-2.1 s for a switch back). Parked, the live
vector table is renamed to PARKED, with each chunk's text hash as it was (PARKED_HASHES); a switch
back to that model at the same precision renames it back, keeps the rows whose chunk still holds
that text and caches the rest under the text they were made for (0.56 s, most of it rebuilding the
sign bits: sqlite-vec cannot rename a `vec0` table). One model is parked at a time: a third model, a
rebuild or the cache's bound sends it into the cache, dated when it was parked. The caller's
transaction covers it all.
"""

from __future__ import annotations

import json
import time

import apsw

from clawmem_index.index.schema import Meta
from clawmem_index.index.vector_index import HALVES, VectorIndex

__all__ = ["PARKED", "PARKED_HASHES", "Owner", "ParkedVectors"]

PARKED, PARKED_HASHES = "parked_vectors", "parked_hashes"
_RETURNING, _RETURNING_HASHES = "returning_vectors", "returning_hashes"  # while a switch back takes them in
_OWNER, _AT = "parked_owner", "parked_at"

Owner = tuple[str, str, str]  # provider, model, provider key: whose vectors


class ParkedVectors:
    """The parked model's table on one connection."""

    def __init__(self, conn: apsw.Connection, meta: Meta, vectors: VectorIndex) -> None:
        self._conn = conn
        self._meta = meta
        self._vectors = vectors

    def owner(self) -> tuple[Owner, str] | None:
        """Whose vectors are parked, and the table they were stored in (FLOATS or HALVES)."""
        raw = self._meta.get(_OWNER)
        if raw is None:
            return None
        provider, model, key, table = json.loads(raw)
        return (str(provider), str(model), str(key)), str(table)

    def count(self) -> int:
        return 0 if self.owner() is None else int(self._conn.execute(f"SELECT count(*) FROM {PARKED}").get)

    def park(self, owner: Owner, table: str) -> None:
        """Rename the live vector table aside (nothing may be parked already)."""
        self._conn.execute(f"ALTER TABLE {table} RENAME TO {PARKED}")
        self._conn.execute(f"CREATE TABLE {PARKED_HASHES}(seq INTEGER PRIMARY KEY, hash TEXT NOT NULL)")
        self._conn.execute(f"INSERT INTO {PARKED_HASHES} SELECT c.seq, c.hash FROM chunks AS c JOIN {PARKED} AS v"
                           " ON v.rowid = c.seq")
        self._meta.set(_OWNER, json.dumps([*owner, table]))
        self._meta.set(_AT, str(time.time()))  # when they left the chunks: their age in the cache

    def to_cache(self) -> None:
        """The parked vectors into the cache, by the hash of the text each was made for."""
        parked = self.owner()
        if parked is None:
            return
        self._cache_rows(parked[0], PARKED, PARKED_HASHES, parked[1] == HALVES, "",
                         float(self._meta.get(_AT) or time.time()))
        self._conn.execute(f"DROP TABLE {PARKED}")
        self._conn.execute(f"DROP TABLE {PARKED_HASHES}")
        self._meta.delete(_OWNER, _AT)

    def start_return(self) -> None:
        """Set the parked table apart for `finish_return`, so that the live one can be parked in its place."""
        self._conn.execute(f"ALTER TABLE {PARKED} RENAME TO {_RETURNING}")
        self._conn.execute(f"ALTER TABLE {PARKED_HASHES} RENAME TO {_RETURNING_HASHES}")
        self._meta.delete(_OWNER, _AT)

    def finish_return(self, owner: Owner, table: str) -> int:
        """The returning table becomes the chunks' `table`; returns the vectors' dimensions (0: none was left).

        A row whose chunk holds another text now (or is gone) goes to the cache under the text it
        was made for, unless a chunk kept holds that text too; the chunks kept are marked embedded.
        """
        kept = f"SELECT r.seq FROM {_RETURNING_HASHES} AS r JOIN chunks AS c ON c.seq = r.seq AND c.hash = r.hash"
        self._cache_rows(owner, _RETURNING, _RETURNING_HASHES, table == HALVES,
                         f" WHERE v.rowid NOT IN ({kept}) AND h.hash NOT IN (SELECT c.hash FROM chunks AS c"
                         f" WHERE c.seq IN ({kept}))")
        self._conn.execute(f"DELETE FROM {_RETURNING} WHERE rowid NOT IN ({kept})")
        self._conn.execute(f"DROP TABLE {_RETURNING_HASHES}")
        row = self._conn.execute(f"SELECT length(embedding) FROM {_RETURNING} LIMIT 1").fetchone()
        if row is None:
            self._conn.execute(f"DROP TABLE {_RETURNING}")
            return 0
        self._conn.execute(f"ALTER TABLE {_RETURNING} RENAME TO {table}")
        self._conn.execute(f"UPDATE chunks SET embedded = 1, model = ? WHERE seq IN (SELECT rowid FROM {table})",
                           (owner[1],))
        return int(row[0]) // (2 if table == HALVES else 4)

    def carry_from(self, schema: str, tables: set[str]) -> None:
        """Cache the vectors another index file (attached as `schema`, holding `tables`) has parked."""
        parked = self._conn.execute(f"SELECT value FROM {schema}.meta WHERE key = ?", (_OWNER,)).fetchone()
        if parked is None or PARKED not in tables or PARKED_HASHES not in tables:
            return
        provider, model, key, table = json.loads(parked[0])
        at = self._conn.execute(f"SELECT value FROM {schema}.meta WHERE key = ?", (_AT,)).fetchone()
        self._cache_rows((provider, model, key), f"{schema}.{PARKED}", f"{schema}.{PARKED_HASHES}", table == HALVES,
                         "", float(at[0]) if at else None, replace=False)

    def _cache_rows(self, owner: Owner, table: str, hashes: str, half: bool, where: str, at: float | None = None,
                    *, replace: bool = True) -> None:
        vector = self._vectors.sql_float32("v.embedding", half=half)
        self._conn.execute(
            f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO embedding_cache(provider, model, provider_key,"
            f" hash, embedding, dims, updated_at) SELECT ?, ?, ?, h.hash, {vector}, length({vector}) / 4, ?"
            f" FROM {table} AS v JOIN {hashes} AS h ON h.seq = v.rowid{where} GROUP BY h.hash",
            (*owner, at or time.time()))
