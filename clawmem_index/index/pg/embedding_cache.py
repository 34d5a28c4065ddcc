"""What the embedding pass keeps in the shared index beside the vectors: the fleet's embedding cache and batch jobs.

Every vector made goes to one cache for the whole fleet (`cm_cache`, read through `cm_cached`):
another workspace holding the same text, or this one switching back to a model it had, finds
every vector made there, and nothing is parked, pruned or carried as in SQLite's index.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable

from clawmem_index.index.pg.connection import Connection
from clawmem_index.index.rows import JobRow

__all__ = ["EmbeddingCache", "Jobs"]


class EmbeddingCache:
    """The fleet's embedding cache, as one workspace's role may read and add to it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def set_vector_owner(self, provider: str, model: str, key: str) -> None:
        """Nothing to do: the shared cache keeps every vector, whichever model the chunks hold."""

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str], *,
                          touch: bool = True) -> dict[str, bytes]:
        """Through `cm_cached`: a workspace's role reads the fleet's cache only by the hash of a text it holds."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        return {str(h): bytes(blob) for h, blob in self.conn.execute(
            "SELECT hash, embedding FROM cm_cached(%s, %s, %s, %s, %s)",
            (provider, model, key, wanted, time.time() if touch else None))}

    def touch_cached(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        wanted = sorted(set(hashes))
        if wanted:
            self.conn.execute("SELECT count(*) FROM cm_cached(%s, %s, %s, %s, %s)",
                              (provider, model, key, wanted, time.time()))

    def uncache(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Nothing to do: cached vectors stay for the fleet (chunks hold their own copy)."""

    def cache_embeddings(self, provider: str, model: str, key: str, vectors: Iterable[tuple[str, bytes]]) -> None:
        """Keep each (text hash, packed vector) in the fleet's cache: one statement for the batch.

        A text already cached keeps its vector: the same provider, model and key made the same one,
        and another workspace's writer may not replace what every workspace reads."""
        rows = sorted(dict(vectors).items())  # one row a text, in key order (two writers lock alike)
        if rows:
            self.conn.execute("SELECT cm_cache(%b, %b, %b, %b::text[], %b::bytea[], %b)",
                              (provider, model, key, [h for h, _ in rows], [blob for _, blob in rows], time.time()),
                              binary=True)

    def prune_cache(self, max_entries: int) -> int:
        """The shared cache is the fleet's: one workspace's setting does not prune it."""
        return 0

    def copy_cache_from(self, other: object) -> None:
        """Nothing to copy: every generation reads the same cache."""

    def carry_vectors(self, owner: tuple[str, str, str] | None, precision: str = "float32", *,
                      progress: Callable[[int, int], None] | None = None,
                      index_progress: Callable[[int, int], None] | None = None) -> int:
        """Nothing to carry: the shared cache kept every vector of the generation being replaced."""
        return 0


class Jobs:
    """One workspace's provider batch jobs (`cm_jobs`)."""

    def __init__(self, conn: Connection, workspace: str) -> None:
        self.conn = conn
        self.workspace = workspace

    def add_job(self, job: JobRow) -> None:
        self.conn.execute(
            "INSERT INTO cm_jobs VALUES(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (self.workspace, job.id, job.provider, job.model, job.provider_key, json.dumps(list(job.hashes)),
             job.submitted_at, job.polled_at, job.state, job.detail))

    def jobs(self, provider: str, model: str, key: str) -> list[JobRow]:
        return [JobRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), tuple(json.loads(r[4])), float(r[5]), float(r[6]),
                       str(r[7]), str(r[8])) for r in self.conn.execute(
            "SELECT id, provider, model, provider_key, hashes, submitted_at, polled_at, state, detail FROM cm_jobs"
            " WHERE workspace = %s AND provider = %s AND model = %s AND provider_key = %s ORDER BY submitted_at, id",
            (self.workspace, provider, model, key))]

    def job_count(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM cm_jobs WHERE workspace = %s", (self.workspace,)).fetchone()
        return int(row[0]) if row else 0

    def touch_job(self, job_id: str, state: str, detail: str) -> None:
        self.conn.execute("UPDATE cm_jobs SET polled_at = %s, state = %s, detail = %s WHERE workspace = %s AND id = %s",
                          (time.time(), state, detail, self.workspace, job_id))

    def drop_job(self, job_id: str) -> None:
        self.conn.execute("DELETE FROM cm_jobs WHERE workspace = %s AND id = %s", (self.workspace, job_id))
