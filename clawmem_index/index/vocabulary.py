"""The keyword index's vocabulary: the stems FTS5 holds, read a prefix at a time.

A misspelled query word is corrected against the words the index holds (clawmem_index.search.typo_reading),
a two-letter block of stems at a time: one range scan of an `fts5vocab` row table (FTS5's own
vocabulary, so always the index's current one; ~0.3-2 ms a block at 112k stems). Blocks are kept
until the index changes (another connection's commit or this one's: SQLite's `data_version` and the
connection's change count), so a daemon's repeated queries read each block once.
"""

from __future__ import annotations

import apsw

from clawmem_index.index.filters import prefix_upper

__all__ = ["FtsVocabulary"]

TABLE = "temp.clawmem_fts_terms"
HELD = 200_000  # stems kept per version of the index, in all blocks (~20 MB); past it they are read again
ROWS = 5_000  # stems read for one prefix at most (more: None, and the caller asks a longer prefix)


class FtsVocabulary:
    """`chunks_fts`'s stems by prefix, on one connection."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn
        self._made = False
        self._version: tuple[int, int] | None = None
        self._held: dict[str, dict[str, int] | None] = {}
        self._count = 0

    def stems(self, prefix: str) -> dict[str, int] | None:
        """The stems that begin with `prefix`, each with how many chunks hold it (None: more than ROWS do)."""
        if not prefix:
            return {}
        if not self._conn.get_autocommit():  # inside a transaction: its changes may yet be rolled back
            return self._read(prefix)
        version = (int(self._conn.execute("PRAGMA data_version").get), self._conn.total_changes())
        if version != self._version or self._count > HELD:
            self._version, self._held, self._count = version, {}, 0
        if prefix not in self._held:
            block = self._held[prefix] = self._read(prefix)
            self._count += 1 + (len(block) if block else 0)
        return self._held[prefix]

    def _read(self, prefix: str) -> dict[str, int] | None:
        if not self._made:
            self._conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {TABLE} USING fts5vocab(main, chunks_fts, row)")
            self._made = True
        upper = prefix_upper(prefix)
        found = {str(term): int(doc) for term, doc in self._conn.execute(
            f"SELECT term, doc FROM {TABLE} WHERE term >= ?" + (" AND term < ?" if upper else "") + " LIMIT ?",
            (prefix, *([upper] if upper else []), ROWS + 1)) if str(term).startswith(prefix)}
        return None if len(found) > ROWS else found
