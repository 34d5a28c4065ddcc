"""What ranking reads of an index file's chunks beside their text and vectors: the store's `facts` part.

A chunk's date (a daily note's day, for dated questions and recency) and its annotations (importance,
triggers, projects: clawmem_index.text.annotations) are columns of `chunks`.
"""

from __future__ import annotations

from collections.abc import Collection

import apsw

from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.rows import TextHit
from clawmem_index.text.annotations import ANNOTATION_KINDS, Annotations

__all__ = ["ChunkFacts"]

_ANNOTATED = "importance IS NOT NULL OR triggers IS NOT NULL OR projects IS NOT NULL"  # as chunks_annotated's
_BATCH = 500  # seqs a statement


class ChunkFacts:
    """The chunks' dates and annotations on one connection."""

    def __init__(self, conn: apsw.Connection) -> None:
        self._conn = conn

    def dated_chunks(self, where: ChunkFilter, first: str, last: str, limit: int) -> list[TextHit]:
        """Up to `limit` dated chunks `where` passes (a window of days), nearest to the days `first` to `last` first
        (0 days within them), then by seq; their text is left out ("": a busy window holds many) and their bm25 is 0
        (listed for their date, not for a keyword)."""
        condition, args = where.sql("w")
        rows = self._conn.execute(
            "SELECT w.seq, w.path, w.source, w.start_line, w.end_line, '', w.date FROM chunks AS w"
            f" WHERE {condition} AND w.date IS NOT NULL"
            " ORDER BY max(julianday(:first) - julianday(w.date), julianday(w.date) - julianday(:last), 0), w.seq"
            " LIMIT :limit", {**args, "first": first, "last": last, "limit": limit})
        return [TextHit.of(row, 0.0) for row in rows]

    def newest_date(self) -> str | None:
        """The latest date a chunk carries (recency decay counts ages from it)."""
        row = self._conn.execute("SELECT max(date) FROM chunks WHERE date IS NOT NULL").fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def annotation_kinds(self) -> frozenset[str]:
        """Which annotations some chunk carries ("importance", "triggers", "projects"; none: ranking looks at none)."""
        row = self._conn.execute(f"SELECT max(importance IS NOT NULL), max(triggers IS NOT NULL),"
                                 f" max(projects IS NOT NULL) FROM chunks WHERE {_ANNOTATED}").fetchone()
        return frozenset(kind for kind, present in zip(ANNOTATION_KINDS, row or (), strict=False) if present)

    def annotations_of(self, seqs: Collection[int]) -> dict[int, Annotations]:
        """The annotations of those of `seqs` that carry any."""
        found: dict[int, Annotations] = {}
        ordered = sorted(set(seqs))
        for start in range(0, len(ordered), _BATCH):
            part = ordered[start:start + _BATCH]
            found.update((seq, Annotations(importance, triggers, projects)) for seq, importance, triggers, projects in
                         self._conn.execute(f"SELECT seq, importance, triggers, projects FROM chunks WHERE seq IN"
                                            f" ({','.join('?' * len(part))}) AND ({_ANNOTATED})", part))
        return found
