"""What a search of the shared index reads: the workspaces in scope at their live generations, and their chunks.

A store takes them at each `data_version` (the start of every search); its keyword search and
its vectors read the same ones, so a rebuild's switch is seen by the next search on every side.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.rows import TextHit
from clawmem_index.index.pg.connection import Connection, pg_text
from clawmem_index.text.annotations import ANNOTATION_KINDS, Annotations

__all__ = ["Live", "filter_sql"]

_ANNOTATED = "c.importance IS NOT NULL OR c.triggers IS NOT NULL OR c.projects IS NOT NULL"  # cm_chunks_annotated's


class Live:
    """The workspaces in scope, each at its live generation and version, as `PgStore.data_version` last read
    them (until it has, `read` is false: the store's own workspace at its generation), and what a search
    reads of their chunks: the store's `facts` part."""

    def __init__(self, conn: Connection, generations: list[tuple[str, int]]) -> None:
        self.conn = conn
        self.generations = generations
        self.versions: dict[str, int] = {}
        self.read = False

    def sql(self, alias: str) -> tuple[str, dict[str, Any]]:
        """The workspaces in scope at their live generations (the first condition picks their partitions)."""
        return (f"{alias}.workspace = ANY(%(scope_ws)s::text[]) AND ({alias}.workspace, {alias}.gen) IN"
                " (SELECT * FROM unnest(%(scope_ws)s::text[], %(scope_gen)s::bigint[]))",
                {"scope_ws": [w for w, _ in self.generations], "scope_gen": [g for _, g in self.generations]})

    def rows(self, seqs: list[int]) -> dict[int, tuple[Any, ...]]:
        """Each chunk in scope: seq, path, source, start_line, end_line, text, date, workspace."""
        scope, args = self.sql("c")
        return {int(r[0]): tuple(r) for r in self.conn.execute(
            f"SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, c.date, c.workspace FROM cm_chunks AS c"
            f" WHERE c.seq = ANY(%(seqs)s) AND {scope}", {**args, "seqs": seqs})}

    def annotation_kinds(self) -> frozenset[str]:
        """Which annotations some chunk in scope carries."""
        scope, args = self.sql("c")
        row = self.conn.execute(f"SELECT bool_or(c.importance IS NOT NULL), bool_or(c.triggers IS NOT NULL),"
                                f" bool_or(c.projects IS NOT NULL) FROM cm_chunks AS c"
                                f" WHERE {scope} AND ({_ANNOTATED})", args).fetchone()
        return frozenset(kind for kind, present in zip(ANNOTATION_KINDS, row or (), strict=False) if present)

    def annotations_of(self, seqs: Collection[int]) -> dict[int, Annotations]:
        """The annotations of those chunks in scope that carry any."""
        scope, args = self.sql("c")
        return {int(seq): Annotations(importance, triggers, projects) for seq, importance, triggers, projects in
                self.conn.execute(f"SELECT c.seq, c.importance, c.triggers, c.projects FROM cm_chunks AS c"
                                  f" WHERE c.seq = ANY(%(seqs)s) AND {scope} AND ({_ANNOTATED})",
                                  {**args, "seqs": sorted(set(seqs))})}

    def dated_chunks(self, where: ChunkFilter, first: str, last: str, limit: int) -> list[TextHit]:
        """Up to `limit` dated chunks in scope `where` passes, nearest to the days `first` to `last` first (0 days
        within them), then by seq (their text left out)."""
        scope, args = self.sql("c")
        condition, filter_args = filter_sql(where, "c")
        rows = self.conn.execute(
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, '', c.date, c.workspace FROM cm_chunks AS c"
            f" WHERE {scope} AND {condition} AND c.date IS NOT NULL"
            " ORDER BY GREATEST(%(first)s::date - c.date::date, c.date::date - %(last)s::date, 0), c.seq"
            " LIMIT %(limit)s", {**args, **filter_args, "first": first, "last": last, "limit": limit}).fetchall()
        return [TextHit.of(row, 0.0) for row in rows]

    def newest_date(self) -> str | None:
        scope, args = self.sql("c")
        row = self.conn.execute(f"SELECT max(c.date) FROM cm_chunks AS c WHERE {scope} AND c.date IS NOT NULL",
                                args).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def chunk_lines(self, workspace: str, path: str, start_line: int, end_line: int) -> list[str | None]:
        """Lines start_line..end_line of a file of `workspace` (fewer past its end), from its live generation's chunks.

        For `context` across workspaces: another workspace's files are on its own host, so its lines
        are the chunk text this index holds. Chunks overlap, so each line is taken once. A line in no
        chunk is blank (the chunker makes no chunk of blank lines alone); a line too long for one chunk
        is held in pieces whose order an edit may not keep (a kept piece keeps its old seq), so it is
        None: there, but not shown whole.
        """
        rows = self.conn.execute(
            "SELECT c.start_line, c.end_line, CASE WHEN c.start_line = c.end_line"
            " AND count(*) OVER (PARTITION BY c.start_line, c.end_line) > 1 THEN NULL ELSE c.text END"
            " FROM cm_chunks AS c JOIN cm_workspaces AS w ON w.workspace = c.workspace AND w.live_gen = c.gen"
            " WHERE c.workspace = %s AND c.path = %s AND c.start_line <= %s AND c.end_line >= %s"
            " ORDER BY c.start_line, c.end_line DESC, c.seq",
            (workspace, pg_text(path), end_line, start_line)).fetchall()
        lines: dict[int, str | None] = {}
        for first, last, text in rows:
            if text is None:
                lines.setdefault(int(first), None)
                continue
            for number, line in enumerate(str(text).split("\n"), start=int(first)):
                if start_line <= number <= min(int(last), end_line):
                    lines.setdefault(number, line)
        if not lines:
            return []
        return [lines.get(number, "") for number in range(start_line, max(lines) + 1)]


def filter_sql(where: ChunkFilter | None, alias: str) -> tuple[str, dict[str, Any]]:
    """`ChunkFilter.sql` in PostgreSQL's dialect (no filter: true)."""
    return (where or ChunkFilter()).sql(alias, dialect="postgres")
