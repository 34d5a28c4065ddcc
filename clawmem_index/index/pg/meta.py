"""A shared index generation's own settings and facts (`cm_meta`): the store's `meta` part.

Each generation has its own (a rebuild fills a new one beside the live one); a write outside a
transaction is its own commit, and moves the workspace's version as every write does (`PgStore._write`).
"""

from __future__ import annotations

from typing import Any, Protocol

import psycopg

from clawmem_index.index.pg.connection import pg_text

__all__ = ["PgMeta"]


class _Owner(Protocol):
    """What the meta uses of its store: its connection, workspace, generation and writes."""

    conn: Any
    workspace: str
    gen: int

    def _write(self, query: str, args: Any = None) -> psycopg.Cursor[Any]: ...


class PgMeta:
    """`cm_meta` of the store's workspace at its current generation (a switch or a reader's `data_version`
    moves it)."""

    def __init__(self, store: _Owner) -> None:
        self._store = store

    def get(self, key: str) -> str | None:
        store = self._store
        row = store.conn.execute("SELECT value FROM cm_meta WHERE workspace = %s AND gen = %s AND key = %s",
                                 (store.workspace, store.gen, key)).fetchone()
        return None if row is None else str(row[0])

    def set(self, key: str, value: str) -> None:
        store = self._store
        store._write("INSERT INTO cm_meta VALUES(%s, %s, %s, %s) ON CONFLICT(workspace, gen, key)"
                     " DO UPDATE SET value = excluded.value", (store.workspace, store.gen, key, pg_text(value)))

    def delete(self, *keys: str) -> None:
        if not keys:
            return  # no write, so the workspace's version stays (as SQLite's)
        store = self._store
        store._write("DELETE FROM cm_meta WHERE workspace = %s AND gen = %s AND key = ANY(%s)",
                     (store.workspace, store.gen, list(keys)))

    def all(self) -> dict[str, str]:
        store = self._store
        return {str(k): str(v) for k, v in store.conn.execute(
            "SELECT key, value FROM cm_meta WHERE workspace = %s AND gen = %s", (store.workspace, store.gen))}
