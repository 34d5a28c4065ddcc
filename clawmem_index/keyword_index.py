"""The keyword index: FTS5 rows beside the chunks, ranked by BM25.

`chunks_fts` is contentless (the text is stored once, in `chunks`) with contentless_delete, so a
row is removed by rowid; its rowid is the chunk's `seq`. The caller's transaction covers the chunk
row and its FTS row together.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import apsw

from clawmem_index.filters import ChunkFilter

__all__ = ["KeywordIndex", "TextHit"]


@dataclass(frozen=True, slots=True)
class TextHit:
    seq: int
    path: str
    source: str
    start_line: int
    end_line: int
    text: str
    bm25: float
    date: str | None = None



class KeywordIndex:
    """chunks_fts on one connection."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def add(self, seq: int, text: str, *, id: str, path: str, source: str, model: str, start_line: int,
            end_line: int) -> None:
        self._conn.execute(
            "INSERT INTO chunks_fts(rowid, text, id, path, source, model, start_line, end_line)"
            " VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, text, id, path, source, model, start_line, end_line),
        )

    def move(self, seq: int, start_line: int, end_line: int) -> None:
        self._conn.execute("UPDATE chunks_fts SET start_line = ?, end_line = ? WHERE rowid = ?",
                           (start_line, end_line, seq))

    def remove(self, seq: int) -> None:
        self._conn.execute("DELETE FROM chunks_fts WHERE rowid = ?", (seq,))

    def search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        """The best `limit` chunks for an FTS5 MATCH expression, best first (bm25 ascending: FTS5 ranks are negative)."""
        join, condition, args = "", "1", {"match": match, "k": limit}
        if where:
            join = " JOIN chunks AS w ON w.seq = chunks_fts.rowid"
            condition, extra = where.sql("w")
            args.update(extra)
        sql = (
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, f.score, c.date FROM"
            f" (SELECT chunks_fts.rowid AS rowid, bm25(chunks_fts) AS score FROM chunks_fts{join}"
            f" WHERE chunks_fts MATCH :match AND {condition} ORDER BY score LIMIT :k) AS f"
            " JOIN chunks AS c ON c.seq = f.rowid ORDER BY f.score"
        )
        return [TextHit(*row) for row in self._conn.execute(sql, args)]

    def ranking(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the best `limit` matches, best first (ties by seq): `search` without the chunks' rows.

        FTS5 scores every match to sort them, so reading deeper costs almost nothing more; the rows
        are fetched (`TextHit`s, through the store) only for the chunks a search keeps.
        """
        join, condition, args = "", "1", {"match": match, "k": limit}
        if where:
            join = " JOIN chunks AS w ON w.seq = chunks_fts.rowid"
            condition, extra = where.sql("w")
            args.update(extra)
        sql = (f"SELECT chunks_fts.rowid, bm25(chunks_fts) AS score FROM chunks_fts{join}"
               f" WHERE chunks_fts MATCH :match AND {condition} ORDER BY score, chunks_fts.rowid LIMIT :k")
        return [(int(seq), float(score)) for seq, score in self._conn.execute(sql, args)]

    def scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        """The BM25 score `search` would give each of `seqs` (absent: it does not match).

        FTS5's BM25 takes its statistics from the whole table, so a score asked for one row is the
        one that row gets in any search; a rowid constraint makes FTS5 seek, not scan the matches.
        """
        sql = "SELECT bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? AND rowid = ?"
        scores: dict[int, float] = {}
        for seq in seqs:
            row = self._conn.execute(sql, (match, seq)).fetchone()
            if row is not None:
                scores[seq] = float(row[0])
        return scores
