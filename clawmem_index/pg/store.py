"""The index in a shared PostgreSQL: the same small interface as `clawmem_index.store.Store`.

One `PgStore` is one connection working for one workspace (its writer, or a reader that may also
read other workspaces: `scope`). A writer works on one generation: the live one, or a new one a
rebuild fills and `switch_to` makes live. A reader takes each workspace's live generation when
`data_version` is asked (the start of every search), so a switch is seen by the next search.

Keyword ranking is FTS5's BM25, computed here from the terms `terms.chunk_terms` keeps per chunk
and each workspace's term statistics (`cm_terms`, `cm_stats`), kept in step in the same
transaction as the chunks. Vectors are pgvector columns of the chunks, ranked by exact cosine
distance; every vector made also goes to the fleet-wide embedding cache.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import psycopg

from clawmem_index.errors import IndexUnavailable
from clawmem_index.filters import ChunkFilter
from clawmem_index.keyword_index import TextHit
from clawmem_index.pg.schema import migrate
from clawmem_index.pg.terms import Phrase, chunk_terms, phrases_of
from clawmem_index.storable import storable
from clawmem_index.store import ChunkRow, FileRow, JobRow
from clawmem_index.vector_index import VectorHit

__all__ = ["PgStore", "connect", "pg_text"]

K1, B = 1.2, 0.75  # FTS5's bm25() defaults


def pg_text(value: str) -> str:
    """Text PostgreSQL can hold: lone surrogates repaired (as SQLite's store does) and NUL, which it refuses, as U+FFFD."""
    return storable(value).replace("\x00", "\ufffd")


def connect(url: str) -> psycopg.Connection:
    """An autocommit connection (transactions are explicit), or IndexUnavailable saying why not."""
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10, prepare_threshold=None)
    except psycopg.Error as exc:
        raise IndexUnavailable(f"cannot reach the shared index: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class _Connection:
    """A connection that survives the server's restart: a lost one raises IndexUnavailable once, and the
    next call connects again (a transaction cut by the loss was rolled back by the server)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.raw = connect(url)

    def _live(self) -> psycopg.Connection:
        if self.raw.broken or self.raw.closed:
            self.raw = connect(self.url)
        return self.raw

    def execute(self, query: Any, args: Any = None) -> psycopg.Cursor[Any]:
        try:
            return self._live().execute(query, args)
        except psycopg.OperationalError as exc:
            raise IndexUnavailable(f"lost the shared index: {_one_line(exc)}") from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            with self._live().transaction():
                yield
        except psycopg.OperationalError as exc:
            raise IndexUnavailable(f"lost the shared index: {_one_line(exc)}") from exc

    def cursor(self) -> psycopg.Cursor[Any]:
        return self._live().cursor()

    @property
    def info(self) -> Any:
        return self.raw.info

    def close(self) -> None:
        self.raw.close()


class PgStore:
    """One connection to the shared index, for one workspace (see the module's docstring)."""

    vec_loaded = True
    vec_error = ""

    def __init__(self, url: str, workspace: str, *, read_only: bool = False, new_generation: bool = False,
                 scope: Sequence[str] | None = None, create: bool = True) -> None:
        self.url = url
        self.workspace = workspace
        self.read_only = read_only
        self.conn = _Connection(url)
        try:
            if not read_only:
                migrate(self.conn)
            self.gen = self._generation(new=new_generation, create=create and not read_only)
        except psycopg.Error as exc:
            self.conn.close()
            raise IndexUnavailable(f"the shared index cannot be used: {_one_line(exc)}") from exc
        except BaseException:
            self.conn.close()
            raise
        self.scope = tuple(dict.fromkeys(scope or (workspace,)))
        self.switched = False  # a new generation made live (see PostgresBackend.fresh)
        self._term_deltas: Counter[str] = Counter()  # df changes not yet written (flushed before each commit)
        self._size_deltas = [0, 0]  # chunks, tokens
        self._live: list[tuple[str, int]] = [(workspace, self.gen)]
        self._live_read = False

    def _generation(self, *, new: bool, create: bool) -> int:
        if create:
            self.conn.execute("INSERT INTO cm_workspaces(workspace, created_at) VALUES(%s, %s)"
                              " ON CONFLICT DO NOTHING", (self.workspace, time.time()))
        if new:
            row = self.conn.execute("UPDATE cm_workspaces SET next_gen = next_gen + 1 WHERE workspace = %s"
                                    " RETURNING next_gen - 1", (self.workspace,)).fetchone()
        else:
            row = self.conn.execute("SELECT live_gen FROM cm_workspaces WHERE workspace = %s",
                                    (self.workspace,)).fetchone()
        if row is None:
            raise IndexUnavailable(f"no index of workspace {self.workspace!r} in the shared index yet:"
                                   " run `clawmem index` first")
        return int(row[0])

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A transaction at the outer level, a savepoint inside; the workspace's version moves on commit.

        Term statistics are counted in memory and written once, before the outer commit: a row
        updated once per file in one transaction would grow a chain of row versions that every
        later update walks. A savepoint's counts are kept apart and dropped if it fails.
        """
        outer = self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        saved_terms, saved_sizes = self._term_deltas, self._size_deltas
        self._term_deltas, self._size_deltas = Counter(), [0, 0]
        try:
            with self.conn.transaction():
                yield
                if outer and not self.read_only:
                    self._flush_terms()
                    self._bump()
        except BaseException:
            self._term_deltas, self._size_deltas = saved_terms, saved_sizes
            raise
        if not outer:  # a savepoint that held: its counts join the enclosing block's
            saved_terms.update(self._term_deltas)
            saved_sizes[0] += self._size_deltas[0]
            saved_sizes[1] += self._size_deltas[1]
        self._term_deltas, self._size_deltas = saved_terms, saved_sizes

    def _atomic(self) -> contextlib.AbstractContextManager[None]:
        """A transaction for one change, unless one is open (no savepoint per chunk: a round trip each)."""
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            return self.transaction()
        return contextlib.nullcontext()

    def _bump(self) -> None:
        self.conn.execute("UPDATE cm_workspaces SET version = version + 1 WHERE workspace = %s", (self.workspace,))

    def _write(self, query: str, args: Any = None) -> psycopg.Cursor[Any]:
        """A write outside `transaction()` is its own commit: the version moves with it."""
        if self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            with self.conn.transaction():
                cur = self.conn.execute(query, args)  # type: ignore[arg-type]
                self._bump()
                return cur
        return self.conn.execute(query, args)  # type: ignore[arg-type]

    def integrity_ok(self) -> bool:
        return True

    # -- meta ---------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM cm_meta WHERE workspace = %s AND gen = %s AND key = %s",
                                (self.workspace, self.gen, key)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._write("INSERT INTO cm_meta VALUES(%s, %s, %s, %s) ON CONFLICT(workspace, gen, key)"
                    " DO UPDATE SET value = excluded.value", (self.workspace, self.gen, key, pg_text(value)))

    def delete_meta(self, key: str) -> None:
        self._write("DELETE FROM cm_meta WHERE workspace = %s AND gen = %s AND key = %s", (self.workspace, self.gen, key))

    def all_meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.conn.execute(
            "SELECT key, value FROM cm_meta WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))}

    # -- files and chunks ---------------------------------------------------------------------

    def files(self) -> dict[str, FileRow]:
        return {row[0]: FileRow(*row) for row in self.conn.execute(
            "SELECT path, source, hash, mtime, size, state FROM cm_files WHERE workspace = %s AND gen = %s",
            (self.workspace, self.gen))}

    def file_stats(self) -> dict[str, tuple[int, int]]:
        return {row[0]: (int(row[1]), int(row[2])) for row in self.conn.execute(
            "SELECT path, mtime, size FROM cm_files WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))}

    def file_row(self, path: str) -> FileRow | None:
        row = self.conn.execute(
            "SELECT path, source, hash, mtime, size, state FROM cm_files WHERE workspace = %s AND gen = %s"
            " AND path = %s", (self.workspace, self.gen, pg_text(path))).fetchone()
        return None if row is None else FileRow(*row)

    def upsert_file(self, row: FileRow) -> None:
        self._write(
            "INSERT INTO cm_files VALUES(%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT(workspace, gen, path)"
            " DO UPDATE SET source = excluded.source, hash = excluded.hash, mtime = excluded.mtime,"
            " size = excluded.size, state = excluded.state, indexed_at = excluded.indexed_at",
            (self.workspace, self.gen, pg_text(row.path), row.source, row.hash, row.mtime, row.size,
             pg_text(row.state), time.time()))

    def chunks_of(self, path: str) -> list[ChunkRow]:
        return [ChunkRow(*row) for row in self.conn.execute(
            "SELECT seq, id, path, start_line, end_line, hash, text FROM cm_chunks WHERE workspace = %s AND gen = %s"
            " AND path = %s ORDER BY start_line, seq", (self.workspace, self.gen, pg_text(path)))]

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

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str,
                     text: str, fts_text: str, model: str = "", date: str | None = None) -> int:
        """Add a chunk with its terms, and count them into the workspace's term statistics."""
        id, path, text = pg_text(id), pg_text(path), pg_text(text)
        terms = chunk_terms(pg_text(fts_text))
        with self._atomic():
            row = self.conn.execute(
                "INSERT INTO cm_chunks(workspace, gen, id, path, source, start_line, end_line, hash, model, text,"
                " date, updated_at, terms, counts, length) VALUES(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " %s, %s, %s) RETURNING seq",
                (self.workspace, self.gen, id, path, source, start_line, end_line, hash, model, text, date,
                 time.time(), terms.terms, terms.counts, terms.length)).fetchone()
            self._term_deltas.update(terms.terms)
            self._size_deltas[0] += 1
            self._size_deltas[1] += terms.length
        assert row is not None
        return int(row[0])

    def _flush_terms(self) -> None:
        """Write the term statistics' changes of this transaction: one statement for all its chunks."""
        changed = {term: n for term, n in self._term_deltas.items() if n}
        if changed:
            self.conn.execute(
                "INSERT INTO cm_terms(workspace, gen, term, df) SELECT %s, %s, t, n"
                " FROM unnest(%s::text[], %s::int[]) AS d(t, n)"
                " ON CONFLICT(workspace, gen, term) DO UPDATE SET df = cm_terms.df + excluded.df",
                (self.workspace, self.gen, list(changed), list(changed.values())))
            if any(n < 0 for n in changed.values()):
                self.conn.execute("DELETE FROM cm_terms WHERE workspace = %s AND gen = %s AND term = ANY(%s)"
                                  " AND df <= 0", (self.workspace, self.gen, [t for t, n in changed.items() if n < 0]))
        if any(self._size_deltas):
            self.conn.execute(
                "INSERT INTO cm_stats VALUES(%s, %s, %s, %s) ON CONFLICT(workspace, gen) DO UPDATE"
                " SET chunks = cm_stats.chunks + excluded.chunks, tokens = cm_stats.tokens + excluded.tokens",
                (self.workspace, self.gen, *self._size_deltas))
        self._term_deltas.clear()
        self._size_deltas = [0, 0]

    def move_chunk(self, seq: int, start_line: int, end_line: int) -> None:
        self._write("UPDATE cm_chunks SET start_line = %s, end_line = %s WHERE seq = %s AND workspace = %s",
                    (start_line, end_line, seq, self.workspace))

    def delete_chunks(self, seqs: Sequence[int]) -> None:
        """Drop chunks and take their terms out of the statistics."""
        if not seqs:
            return
        with self._atomic():
            gone = self.conn.execute(
                "DELETE FROM cm_chunks WHERE seq = ANY(%s) AND workspace = %s AND gen = %s RETURNING terms, length",
                (list(seqs), self.workspace, self.gen)).fetchall()
            if not gone:
                return
            self._term_deltas.subtract(term for terms, _ in gone for term in terms)
            self._size_deltas[0] -= len(gone)
            self._size_deltas[1] -= sum(int(length) for _, length in gone)

    def delete_file(self, path: str) -> int:
        with self._atomic():
            removed = self.delete_chunks_from(path, 0)
            self.conn.execute("DELETE FROM cm_files WHERE workspace = %s AND gen = %s AND path = %s",
                              (self.workspace, self.gen, pg_text(path)))
        return removed

    def delete_chunks_from(self, path: str, start_line: int) -> int:
        seqs = [int(row[0]) for row in self.conn.execute(
            "SELECT seq FROM cm_chunks WHERE workspace = %s AND gen = %s AND path = %s AND start_line >= %s",
            (self.workspace, self.gen, pg_text(path), start_line))]
        self.delete_chunks(seqs)
        return len(seqs)

    def counts(self) -> tuple[int, int]:
        row = self.conn.execute(
            "SELECT (SELECT count(*) FROM cm_files WHERE workspace = %s AND gen = %s),"
            " (SELECT count(*) FROM cm_chunks WHERE workspace = %s AND gen = %s)",
            (self.workspace, self.gen, self.workspace, self.gen)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def pending_embeddings(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM cm_chunks WHERE workspace = %s AND gen = %s AND NOT embedded",
                                (self.workspace, self.gen)).fetchone()
        return int(row[0]) if row else 0

    # -- what a search reads ------------------------------------------------------------------

    def data_version(self) -> int:
        """Moves with every commit to any workspace in scope; also takes their live generations for the search."""
        rows = self.conn.execute("SELECT workspace, live_gen, version FROM cm_workspaces WHERE workspace = ANY(%s)"
                                 " ORDER BY workspace", (list(self.scope),)).fetchall()
        if self.read_only or self.scope != (self.workspace,):
            self._live = [(str(w), int(g)) for w, g, _ in rows]
            self._live_read = True
            if self.scope == (self.workspace,) and rows:
                self.gen = int(rows[0][1])
        return hash(tuple((str(w), int(g), int(v)) for w, g, v in rows))

    def visible(self) -> list[str]:
        """The workspaces in scope this connection found (at the last `data_version`)."""
        return [w for w, _ in self._live if w in self.scope] if self._live_read else [self.workspace]

    def _scope_sql(self, alias: str) -> tuple[str, dict[str, Any]]:
        return (f"({alias}.workspace, {alias}.gen) IN (SELECT * FROM unnest(%(scope_ws)s::text[], %(scope_gen)s::bigint[]))",
                {"scope_ws": [w for w, _ in self._live], "scope_gen": [g for _, g in self._live]})

    def newest_date(self) -> str | None:
        scope, args = self._scope_sql("c")
        row = self.conn.execute(f"SELECT max(c.date) FROM cm_chunks AS c WHERE {scope} AND c.date IS NOT NULL",
                                args).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def text_search(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[TextHit]:
        return self.text_hits(self.text_ranking(match, limit, where))

    def text_ranking(self, match: str, limit: int, where: ChunkFilter | None = None) -> list[tuple[int, float]]:
        """(seq, bm25) of the best `limit` chunks, best first, bm25 negative as FTS5's (ties by seq)."""
        return self._bm25(match, limit=limit, where=where)

    def text_scores_of(self, match: str, seqs: Iterable[int]) -> dict[int, float]:
        wanted = sorted({int(s) for s in seqs})
        if not wanted:
            return {}
        return dict(self._bm25(match, seqs=wanted))

    def _bm25(self, match: str, *, limit: int | None = None, where: ChunkFilter | None = None,
              seqs: list[int] | None = None) -> list[tuple[int, float]]:
        phrases = phrases_of(match)
        if not phrases or limit == 0:
            return []
        scope, args = self._scope_sql("c")
        n, avgdl = self._collection_stats()
        terms: list[str] = []
        phrase_of: list[int] = []
        idfs: list[float] = []
        for i, (phrase, matched) in enumerate(self._expand(phrases)):
            df = self._df(phrase, matched)
            idf = math.log((n - df + 0.5) / (df + 0.5)) if n else 0.0
            idf = idf if idf > 0 else 1e-6
            for term in matched:
                terms.append(term)
                phrase_of.append(i)
                idfs.append(idf)
        if not terms:
            return []
        condition, filter_args = _filter_sql(where, "c")
        among = " AND c.seq = ANY(%(seqs)s)" if seqs is not None else ""
        order = "" if seqs is not None else " ORDER BY bm25, c.seq LIMIT %(limit)s"
        rows = self.conn.execute(
            "SELECT c.seq, -sum(p.idf * p.tf * %(k1p)s / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * c.length / %(avgdl)s)))"
            " AS bm25 FROM cm_chunks AS c CROSS JOIN LATERAL ("
            "   SELECT m.phrase, max(m.idf) AS idf, sum(u.tf)::float8 AS tf"
            "   FROM unnest(c.terms, c.counts) AS u(term, tf)"
            "   JOIN unnest(%(terms)s::text[], %(phrases)s::int[], %(idfs)s::float8[]) AS m(term, phrase, idf)"
            "   ON m.term = u.term GROUP BY m.phrase) AS p"
            f" WHERE c.terms && %(terms)s::text[] AND {scope} AND {condition}{among}"
            f" GROUP BY c.seq{order}",
            {**args, **filter_args, "terms": terms, "phrases": phrase_of, "idfs": idfs, "k1": K1, "k1p": K1 + 1,
             "b": B, "avgdl": avgdl, "seqs": seqs, "limit": limit}).fetchall()
        return [(int(seq), float(score)) for seq, score in rows]

    def _collection_stats(self) -> tuple[int, float]:
        row = self.conn.execute(
            "SELECT coalesce(sum(chunks), 0), coalesce(sum(tokens), 0) FROM cm_stats AS c WHERE "
            + self._scope_sql("c")[0], self._scope_sql("c")[1]).fetchone()
        n, tokens = (int(row[0]), int(row[1])) if row else (0, 0)
        return n, (tokens / n if n else 1.0) or 1.0

    def _expand(self, phrases: list[Phrase]) -> list[tuple[Phrase, list[str]]]:
        """Each phrase with the indexed terms it matches (a prefix: every term it begins)."""
        scope, args = self._scope_sql("t")
        out = []
        for phrase in phrases:
            if not phrase.prefix:
                out.append((phrase, [phrase.term]))
                continue
            pattern = phrase.term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            found = [str(r[0]) for r in self.conn.execute(
                f"SELECT DISTINCT t.term FROM cm_terms AS t WHERE {scope} AND t.term LIKE %(pattern)s ORDER BY 1"
                " LIMIT 4096", {**args, "pattern": pattern})]
            out.append((phrase, found))
        return out

    def _df(self, phrase: Phrase, matched: list[str]) -> int:
        """How many chunks in scope hold the phrase (a prefix's terms may share chunks: counted once)."""
        if not matched:
            return 0
        if not phrase.prefix:
            scope, args = self._scope_sql("t")
            row = self.conn.execute(f"SELECT coalesce(sum(t.df), 0) FROM cm_terms AS t WHERE {scope}"
                                    " AND t.term = %(term)s", {**args, "term": matched[0]}).fetchone()
        else:
            scope, args = self._scope_sql("c")
            row = self.conn.execute(f"SELECT count(*) FROM cm_chunks AS c WHERE {scope}"
                                    " AND c.terms && %(terms)s::text[]", {**args, "terms": matched}).fetchone()
        return int(row[0]) if row else 0

    def text_hits(self, ranked: Sequence[tuple[int, float]]) -> list[TextHit]:
        rows = self._rows([seq for seq, _ in ranked])
        return [TextHit(*rows[seq][:6], bm25, rows[seq][6], rows[seq][7]) for seq, bm25 in ranked if seq in rows]

    def _rows(self, seqs: list[int]) -> dict[int, tuple[Any, ...]]:
        scope, args = self._scope_sql("c")
        return {int(r[0]): tuple(r) for r in self.conn.execute(
            f"SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, c.date, c.workspace FROM cm_chunks AS c"
            f" WHERE c.seq = ANY(%(seqs)s) AND {scope}", {**args, "seqs": seqs})}

    def workspaces_of(self, seqs: Sequence[int]) -> dict[int, str]:
        """Which workspace each chunk is from (a search over several names it in each result)."""
        return {seq: str(row[7]) for seq, row in self._rows(list(seqs)).items()}

    def vector_search(self, query_blob: bytes, limit: int, where: ChunkFilter | None = None, *,
                      candidates_for: int | None = None) -> list[VectorHit]:
        """The `limit` nearest chunks by exact cosine distance, nearest first (ties by seq)."""
        if limit < 1:
            return []
        scope, args = self._scope_sql("c")
        condition, filter_args = _filter_sql(where, "c")
        rows = self.conn.execute(
            "SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text, c.embedding <=> %(q)s::vector AS d, c.date,"
            " c.workspace"
            f" FROM cm_chunks AS c WHERE {scope} AND c.embedding IS NOT NULL AND c.dims = %(dims)s AND {condition}"
            " ORDER BY d, c.seq LIMIT %(limit)s",
            {**args, **filter_args, "q": _literal(query_blob), "dims": len(query_blob) // 4, "limit": limit}).fetchall()
        return [VectorHit(int(r[0]), r[1], r[2], r[3], r[4], r[5], float(r[6]), r[7], r[8]) for r in rows]

    def vector_distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        if not seqs:
            return {}
        scope, args = self._scope_sql("c")
        return {int(seq): float(d) for seq, d in self.conn.execute(
            f"SELECT c.seq, c.embedding <=> %(q)s::vector FROM cm_chunks AS c WHERE c.seq = ANY(%(seqs)s) AND {scope}"
            " AND c.embedding IS NOT NULL AND c.dims = %(dims)s",
            {**args, "q": _literal(query_blob), "seqs": list(seqs), "dims": len(query_blob) // 4})}

    def vec_table_exists(self) -> bool:
        return True

    def vector_method(self) -> str:
        return "pgvector exact cosine"

    def ensure_vector_table(self, dims: int) -> None:
        """Nothing to make: each chunk's vector column takes any dimensions (a search compares like with like)."""

    # -- vectors of chunks ----------------------------------------------------------------------

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        self._write("UPDATE cm_chunks SET embedded = true, model = %s, dims = %s, embedding = %s::vector"
                    " WHERE seq = %s AND workspace = %s",
                    (model, *_vector_args(blob), seq, self.workspace))

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> list[tuple[int, bytes]]:
        """Each chunk's vector if it still waits for the text `hash` names (see Store.store_vectors)."""
        if not items:
            return []
        with self.transaction():
            waiting = {int(seq): str(h) for seq, h in self.conn.execute(
                "SELECT seq, hash FROM cm_chunks WHERE NOT embedded AND workspace = %s AND seq = ANY(%s)",
                (self.workspace, [seq for seq, _, _ in items]))}
            current = [(seq, blob) for seq, h, blob in items if waiting.get(seq) == h]
            with self.conn.cursor() as cur:
                cur.executemany(
                    "UPDATE cm_chunks SET embedded = true, model = %s, dims = %s, embedding = %s::vector"
                    " WHERE seq = %s AND workspace = %s",
                    [(model, *_vector_args(blob), seq, self.workspace) for seq, blob in current])
        return current  # type: ignore[return-value]

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT seq, hash, text FROM cm_chunks WHERE workspace = %s AND gen = %s AND NOT embedded AND seq > %s"
            " ORDER BY seq LIMIT %s", (self.workspace, self.gen, after, limit))]

    def reset_vectors(self) -> int:
        """Forget this generation's vectors (a new model's go in their place; the cache keeps the old ones)."""
        cur = self._write("UPDATE cm_chunks SET embedded = false, model = '', dims = NULL, embedding = NULL"
                          " WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))
        return int(cur.rowcount)

    # -- the fleet's embedding cache ----------------------------------------------------------

    def set_vector_owner(self, provider: str, model: str, key: str) -> None:
        """Nothing to do: the shared cache keeps every vector, whichever model the chunks hold."""

    def cached_embeddings(self, provider: str, model: str, key: str, hashes: Iterable[str], *,
                          touch: bool = True) -> dict[str, bytes]:
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        found = {str(h): bytes(blob) for h, blob in self.conn.execute(
            "SELECT hash, embedding FROM cm_embedding_cache WHERE provider = %s AND model = %s AND provider_key = %s"
            " AND hash = ANY(%s)", (provider, model, key, wanted))}
        if touch:
            self.touch_cached(provider, model, key, found)
        return found

    def touch_cached(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        wanted = sorted(set(hashes))
        if wanted:
            self.conn.execute("UPDATE cm_embedding_cache SET updated_at = %s WHERE provider = %s AND model = %s"
                              " AND provider_key = %s AND hash = ANY(%s)", (time.time(), provider, model, key, wanted))

    def uncache(self, provider: str, model: str, key: str, hashes: Iterable[str]) -> None:
        """Nothing to do: cached vectors stay for the fleet (chunks hold their own copy)."""

    def cache_embedding(self, provider: str, model: str, key: str, hash: str, blob: bytes, dims: int) -> None:
        self.conn.execute(
            "INSERT INTO cm_embedding_cache VALUES(%s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT(provider, model, provider_key, hash) DO UPDATE SET embedding = excluded.embedding,"
            " dims = excluded.dims, updated_at = excluded.updated_at",
            (provider, model, key, hash, blob, dims, time.time()))

    def prune_cache(self, max_entries: int) -> int:
        """The shared cache is the fleet's: one workspace's setting does not prune it."""
        return 0

    def copy_cache_from(self, other: object) -> None:
        """Nothing to copy: every generation reads the same cache."""

    def uncached_pending(self, provider: str, model: str, key: str, *,
                         exclude: Collection[str] = ()) -> dict[str, str]:
        rows = self.conn.execute(
            "SELECT c.hash, c.text FROM cm_chunks AS c WHERE c.workspace = %s AND c.gen = %s AND NOT c.embedded"
            " AND NOT EXISTS (SELECT 1 FROM cm_embedding_cache AS e WHERE e.provider = %s AND e.model = %s"
            " AND e.provider_key = %s AND e.hash = c.hash)", (self.workspace, self.gen, provider, model, key))
        return {str(h): str(text) for h, text in rows if h not in exclude}

    # -- batch jobs ---------------------------------------------------------------------------

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

    # -- generations --------------------------------------------------------------------------

    def switch_to(self, fresh: PgStore) -> None:
        """Make `fresh`'s generation the live one and drop this one's rows, in one transaction."""
        with self.transaction():
            self.conn.execute("UPDATE cm_workspaces SET live_gen = %s WHERE workspace = %s",
                              (fresh.gen, self.workspace))
            self._drop_generations(keep=(fresh.gen,))
        self.gen = fresh.gen

    def drop_strays(self) -> None:
        """Rows of generations that are not live (a rebuild that died before its switch)."""
        with self.transaction():
            self._drop_generations(keep=(self.gen,))

    def drop_own_generation(self) -> None:
        """A rebuild that failed: its rows go (the live generation is untouched)."""
        with self.conn.transaction():
            for table in ("cm_meta", "cm_files", "cm_chunks", "cm_terms", "cm_stats"):
                self.conn.execute(f"DELETE FROM {table} WHERE workspace = %s AND gen = %s",  # noqa: S608
                                  (self.workspace, self.gen))

    def _drop_generations(self, keep: tuple[int, ...]) -> None:
        for table in ("cm_meta", "cm_files", "cm_chunks", "cm_terms", "cm_stats"):
            self.conn.execute(f"DELETE FROM {table} WHERE workspace = %s AND NOT gen = ANY(%s)",  # noqa: S608
                              (self.workspace, list(keep)))

    def execute(self, query: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        cur = self.conn.execute(query, args)  # type: ignore[arg-type]
        return [tuple(row) for row in cur.fetchall()] if cur.description else []


def _filter_sql(where: ChunkFilter | None, alias: str) -> tuple[str, dict[str, Any]]:
    """`ChunkFilter.sql` in PostgreSQL's placeholders."""
    if not where:
        return "true", {}
    clauses: list[str] = []
    args: dict[str, Any] = {}
    if where.path_prefix:
        clauses.append(f"starts_with({alias}.path, %(prefix)s)")
        args["prefix"] = where.path_prefix
    if where.source:
        clauses.append(f"{alias}.source = %(source)s")
        args["source"] = where.source
    if where.since:
        clauses.append(f"{alias}.date >= %(since)s")
        args["since"] = where.since
    if where.before:
        clauses.append(f"{alias}.date < %(before)s")
        args["before"] = where.before
    return " AND ".join(clauses), args


def _literal(blob: bytes) -> str:
    """A float32 blob as pgvector's text form (each float32 printed exactly)."""
    import numpy as np

    return "[" + ",".join(map(repr, np.frombuffer(blob, dtype="<f4").astype(float).tolist())) + "]"


def _vector_args(blob: bytes | None) -> tuple[int | None, str | None]:
    """(dims, vector) for a chunk's columns; None, zero or not finite: no usable vector, never matched."""
    if blob is None or not blob:
        return None, None
    import numpy as np

    values = np.frombuffer(blob, dtype="<f4")
    if not np.all(np.isfinite(values)) or not np.any(values):
        return None, None
    return len(values), _literal(blob)
