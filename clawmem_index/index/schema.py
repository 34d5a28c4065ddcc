"""The index schema: named migrations applied in order, each in its own transaction, recorded in `migrations`.

A schema change is a new entry at the end of `MIGRATIONS`, never an edit of an applied one. A
read-only connection cannot migrate: it refuses an index some migration has not reached.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import apsw

from clawmem_index.errors import IndexUnavailable

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Meta", "check_migrated", "migrate"]

SCHEMA_VERSION = 2  # 2: float32 vectors in a plain table, sign bits in a partitioned vec0 table

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
    ("0002_embedding_jobs", """
        CREATE TABLE embedding_jobs(
            id TEXT PRIMARY KEY,
            provider TEXT NOT NULL,
            model TEXT NOT NULL,
            provider_key TEXT NOT NULL,
            hashes TEXT NOT NULL,
            submitted_at REAL NOT NULL,
            polled_at REAL NOT NULL,
            state TEXT NOT NULL DEFAULT 'running',
            detail TEXT NOT NULL DEFAULT ''
        );
    """),
    ("0003_dates_and_file_state", """
        ALTER TABLE chunks ADD COLUMN date TEXT;
        CREATE INDEX chunks_date ON chunks(date) WHERE date IS NOT NULL;
        ALTER TABLE files ADD COLUMN state TEXT NOT NULL DEFAULT '';
    """),
    ("0004_chunk_hashes", """
        CREATE INDEX chunks_hash ON chunks(hash);
    """),
    ("0005_chunk_annotations", """
        ALTER TABLE chunks ADD COLUMN importance INTEGER;
        ALTER TABLE chunks ADD COLUMN triggers TEXT;
        ALTER TABLE chunks ADD COLUMN projects TEXT;
        CREATE INDEX chunks_annotated ON chunks(seq)
            WHERE importance IS NOT NULL OR triggers IS NOT NULL OR projects IS NOT NULL;
    """),  # OpenClaw's annotations of an entry (clawmem_index.text.annotations): few chunks carry any
]



def migrate(conn: apsw.Connection) -> None:
    """Apply the migrations this file has not had, each with its record in one transaction.

    Each is looked for again inside its (write-locked) transaction: another connection, such as a
    daemon's reader while its writer makes the first index, may have applied it since."""
    conn.execute("CREATE TABLE IF NOT EXISTS migrations(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    done = {row[0] for row in conn.execute("SELECT name FROM migrations")}
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        with _transaction(conn):
            if conn.execute("SELECT 1 FROM migrations WHERE name = ?", (name,)).fetchone():
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO migrations VALUES(?, ?)", (name, time.time()))
            conn.execute("INSERT OR REPLACE INTO meta VALUES('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute("INSERT OR IGNORE INTO meta VALUES('created_at', ?)", (str(time.time()),))


def check_migrated(conn: apsw.Connection, path: Path) -> None:
    """Raise IndexUnavailable (closing `conn`) if some migration has not reached this file."""
    try:
        done = {row[0] for row in conn.execute("SELECT name FROM migrations")}
    except apsw.SQLError:
        done = set()
    if any(name not in done for name, _ in MIGRATIONS):
        conn.close()
        raise IndexUnavailable(f"index {path} is from an older clawmem and a reader cannot upgrade it:"
                               " run `clawmem index` (or start `clawmem serve`) once")


class Meta:
    """The `meta` table's key/value pairs (schema version, fingerprint, vector layout, last error)."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def get(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES(?, ?)", (key, value))

    def delete(self, *keys: str) -> None:
        self._conn.executemany("DELETE FROM meta WHERE key = ?", [(key,) for key in keys])

    def all(self) -> dict[str, str]:
        return {k: v for k, v in self._conn.execute("SELECT key, value FROM meta")}


@contextlib.contextmanager
def _transaction(conn: apsw.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(apsw.Error):
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
