"""The embedding cache beside the chunks' own vectors, and the provider batch jobs whose vectors land in it.

Each vector is stored once. The chunks' own vectors (chunks_vec) are those of the model named in
meta `vector_owner`; `embedding_cache` holds only the vectors of texts the index no longer has (a
deleted note, another model's vectors). A lookup sees both; a chunk that takes a cached vector takes
it out of the cache, and a vector whose last chunk goes moves in. The model a switch leaves behind is
parked instead (its table renamed aside: `ChunkVectors.reset_vectors`), counted in the cache's bound.
`max_entries` bounds the cache and the parked vectors: the chunks' vectors are never pruned.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence

import apsw

from clawmem_index.index.parking import Owner, ParkedVectors
from clawmem_index.index.rows import JobRow
from clawmem_index.index.schema import Meta
from clawmem_index.index.vector_index import VectorIndex

__all__ = ["BatchJobs", "EmbeddingCache"]


class EmbeddingCache:
    """`embedding_cache` and the vectors' owner on one connection, looked up with the chunks' vectors."""

    def __init__(self, conn: apsw.Connection, meta: Meta, vectors: VectorIndex, parked: ParkedVectors) -> None:
        self.conn = conn
        self.meta = meta
        self.vectors = vectors
        self.parked = parked

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

    def vector_owner(self) -> Owner | None:
        """Whose vectors the chunks hold (None: none named, or they cannot be read)."""
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
        if self.vector_owner() == (provider, model, key):
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
                " AND hash IN (SELECT value FROM json_each(?))",
                (time.time(), provider, model, key, json.dumps(wanted)))

    def uncache(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Take entries out of the cache: chunks hold these vectors now."""
        wanted = sorted(set(hashes))
        if wanted:
            self.conn.execute(
                "DELETE FROM embedding_cache WHERE provider = ? AND model = ? AND provider_key = ?"
                " AND hash IN (SELECT value FROM json_each(?))", (provider, model, key, json.dumps(wanted)))

    def cache_live(self, seqs: Sequence[int] | None) -> None:
        """Move the vectors of chunks `seqs` (None: every chunk) into the cache, under their owner.

        A text another chunk still holds keeps its vector there instead (None: no chunk is left).
        """
        if seqs is not None and not seqs:
            return  # most file syncs drop no chunk: no query for them
        owner = self.vector_owner()
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
        total = int(self.conn.execute("SELECT count(*) FROM embedding_cache").get)
        parked = self.parked.count()
        if parked and total + parked > max_entries:
            self.parked.to_cache()
            total = int(self.conn.execute("SELECT count(*) FROM embedding_cache").get)
        excess = total - max_entries
        if excess <= 0:
            return 0
        self.conn.execute(
            "DELETE FROM embedding_cache WHERE rowid IN"
            " (SELECT rowid FROM embedding_cache ORDER BY updated_at, rowid LIMIT ?)", (excess,))
        return excess


class BatchJobs:
    """`embedding_jobs` on one connection: the provider batch jobs the index waits on."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn

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

    def job_count(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM embedding_jobs").get)

    def touch_job(self, job_id: str, state: str, detail: str) -> None:
        self.conn.execute("UPDATE embedding_jobs SET polled_at = ?, state = ?, detail = ? WHERE id = ?",
                          (time.time(), state, detail, job_id))

    def drop_job(self, job_id: str) -> None:
        self.conn.execute("DELETE FROM embedding_jobs WHERE id = ?", (job_id,))
