"""The index in a shared PostgreSQL: the same small interface as `clawmem_index.index.store.Store`.

One `PgStore` is one connection working for one workspace (its writer, or a reader that may also
read other workspaces: `scope`). A writer works on one generation: the live one, or a new one a
rebuild fills and `switch_to` makes live. A reader takes each workspace's live generation when
`data_version` is asked (the start of every search), so a switch is seen by the next search.

The store keeps files, chunks, their terms and the term statistics; its parts (the interface's) and
the rest have their own module: `connection` (the session, transactions, COPY), `generations` (the
workspace's row, partition and generations), `meta`, `live` (the workspaces a search reads, and the
`facts` of their chunks), `keyword_search` (`keywords`: BM25 from the terms), `vectors` (`vectors` and
`embeddings`: pgvector rows and their HNSW graphs) and `embedding_cache` (`cache` and `carry`: the
fleet's cache; `batch_jobs`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg

from clawmem_index.errors import IndexUnavailable, StoreError
from clawmem_index.index.pg.connection import (
    READER_SESSION,
    WRITER_SESSION,
    Connection,
    copy_annotations,
    copy_array,
    copy_text,
    one_line,
    pg_text,
)
from clawmem_index.index.pg.embedding_cache import EmbeddingCache, Jobs
from clawmem_index.index.pg.generations import Generations
from clawmem_index.index.pg.keyword_search import KeywordSearch
from clawmem_index.index.pg.live import Live
from clawmem_index.index.pg.meta import PgMeta
from clawmem_index.index.pg.schema import migrate
from clawmem_index.index.pg.terms import ChunkTerms, chunk_terms_of
from clawmem_index.index.pg.vectors import Vectors
from clawmem_index.index.rows import ChunkRow, FileRow
from clawmem_index.text.annotations import Annotations

__all__ = ["PgStore"]

_SEQ_BLOCKS = (256, 8192)  # chunk numbers taken from the sequence in one round trip: first, and at most
# A rebuild writes in bulk: its GIN insertions are merged into the index in bigger batches, with more memory.
_BULK_SESSION = "SET gin_pending_list_limit = '16MB'; SET work_mem = '32MB'"


class PgStore:
    """One connection to the shared index, for one workspace (see the module's docstring)."""

    vec_loaded = True
    vec_error = ""
    terms_of = staticmethod(chunk_terms_of)
    # The cache is the fleet's: another workspace holding the same text, or this one switching back
    # to a model it had, finds every vector made there (`cm_vectors` keeps its own copy to search).
    caches_stored_vectors = True

    def __init__(self, url: str, workspace: str, *, read_only: bool = False, new_generation: bool = False,
                 scope: Sequence[str] | None = None, create: bool = True, keep_postings: bool = False) -> None:
        """`keep_postings`: keep each phrase's matches per workspace version and rank common words in
        numpy (a long-lived reader, the daemon's); otherwise every ranking is one query."""
        self.url = url
        self.workspace = workspace
        self.read_only = read_only
        self.new_generation = new_generation
        self.conn = Connection(url)
        self.generations = Generations(self.conn, workspace)
        try:
            if not read_only:
                migrate(self.conn)
            self.gen = self.generations.open(new=new_generation, create=create and not read_only)
            self.conn.use_session(READER_SESSION if read_only else WRITER_SESSION)
            if new_generation:
                self.conn.execute(_BULK_SESSION)
        except psycopg.Error as exc:
            self.conn.close()
            raise IndexUnavailable(f"the shared index cannot be used: {one_line(exc)}") from exc
        except BaseException:
            self.conn.close()
            raise
        self.scope = tuple(dict.fromkeys(scope or (workspace,)))
        self.switched = False  # a new generation made live (see PostgresBackend.fresh)
        self._term_deltas: Counter[str] = Counter()  # df changes not yet written (flushed before each commit)
        self._size_deltas = [0, 0]  # chunks, tokens
        self._live = Live(self.conn, [(workspace, self.gen)])
        self._seqs: list[int] = []  # chunk numbers taken from the sequence and not used yet
        self._seq_block = _SEQ_BLOCKS[0]  # doubled at each round trip: a bulk write stops its COPY less often
        self.meta = PgMeta(self)
        self.keywords = KeywordSearch(self._live, keep_postings=keep_postings)
        self.vectors = self.embeddings = Vectors(self, self._live)  # one part: the chunks' rows are the vectors'
        self.cache = self.carry = EmbeddingCache(self.conn)  # the fleet's cache: nothing to carry
        self.batch_jobs = Jobs(self.conn, workspace)
        self.facts = self._live

    def close(self) -> None:
        self.conn.close()

    def interrupt(self) -> None:
        """Ask the server to cancel the statement running on this connection (from any thread)."""
        raw = self.conn.raw
        if raw is not None and not raw.closed:
            cancel = getattr(raw, "cancel_safe", None) or raw.cancel
            with contextlib.suppress(psycopg.Error):
                cancel()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A transaction at the outer level, a savepoint inside; the workspace's version moves on commit.

        Term statistics are counted in memory and written once, before the outer commit: a row
        updated once per file in one transaction would grow a chain of row versions that every
        later update walks. A savepoint's counts are kept apart and dropped if it fails.
        """
        outer = not self.conn.in_transaction
        saved_terms, saved_sizes = self._term_deltas, self._size_deltas
        self._term_deltas, self._size_deltas = Counter(), [0, 0]
        try:
            with self.conn.transaction():
                yield
                if outer and not self.read_only:
                    self._flush_terms()
                    self._bump()
        except BaseException as exc:
            self._term_deltas, self._size_deltas = saved_terms, saved_sizes
            if isinstance(exc, (psycopg.DataError, psycopg.IntegrityError)):  # a value or a row it cannot hold
                raise StoreError(f"{type(exc).__name__}: {exc}") from exc
            raise
        if not outer:  # a savepoint that held: its counts join the enclosing block's
            saved_terms.update(self._term_deltas)
            saved_sizes[0] += self._size_deltas[0]
            saved_sizes[1] += self._size_deltas[1]
        self._term_deltas, self._size_deltas = saved_terms, saved_sizes

    def _atomic(self) -> contextlib.AbstractContextManager[None]:
        """A transaction for one change, unless one is open (no savepoint per chunk: a round trip each)."""
        if not self.conn.in_transaction:
            return self.transaction()
        return contextlib.nullcontext()

    def _bump(self) -> None:
        self.conn.execute("UPDATE cm_workspaces SET version = version + 1 WHERE workspace = %s", (self.workspace,))

    def _write(self, query: str, args: Any = None) -> psycopg.Cursor[Any]:
        """A write outside `transaction()` is its own commit: the version moves with it."""
        if not self.conn.in_transaction:
            with self.conn.transaction():
                cur = self.conn.execute(query, args)
                self._bump()
                return cur
        return self.conn.execute(query, args)

    def integrity_ok(self) -> bool:
        return True

    # -- files and chunks ---------------------------------------------------------------------

    def file_stats(self) -> dict[str, tuple[int, int]]:
        return {row[0]: (int(row[1]), int(row[2])) for row in self.conn.execute(
            "SELECT path, mtime, size FROM cm_files WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))}

    def file_stat(self, path: str) -> tuple[int, int] | None:  # a round trip: engine.status reads `file_stats` once
        return None if (row := self.file_row(path)) is None else (row.mtime, row.size)

    def file_row(self, path: str) -> FileRow | None:
        row = self.conn.execute(
            "SELECT path, source, hash, mtime, size, state FROM cm_files WHERE workspace = %s AND gen = %s"
            " AND path = %s", (self.workspace, self.gen, pg_text(path))).fetchone()
        return None if row is None else FileRow(*row)

    def upsert_file(self, row: FileRow) -> None:
        path = pg_text(row.path)
        with self._atomic():
            self.conn.hold_file(path, (self.workspace, self.gen, path, row.source, row.hash, row.mtime, row.size,
                                       pg_text(row.state), time.time()))

    def chunks_of(self, path: str) -> list[ChunkRow]:
        return [ChunkRow(*row) for row in self.conn.execute(
            "SELECT seq, id, path, start_line, end_line, hash, text FROM cm_chunks WHERE workspace = %s AND gen = %s"
            " AND path = %s ORDER BY start_line, seq", (self.workspace, self.gen, pg_text(path)))]

    def insert_chunk(self, *, id: str, path: str, source: str, start_line: int, end_line: int, hash: str,
                     text: str, fts_text: str, model: str = "", date: str | None = None,
                     terms: ChunkTerms | None = None, annotations: Annotations | None = None) -> int:
        """Add a chunk with its terms (`terms_of(fts_text)`, made here unless given), and count them into
        the workspace's term statistics."""
        if terms is None:
            terms = chunk_terms_of(fts_text)
        seq = self._next_seq()
        with self._atomic():
            self.conn.hold_chunk("\t".join((
                str(seq), copy_text(self.workspace), str(self.gen), copy_text(pg_text(id)), copy_text(pg_text(path)),
                copy_text(source), str(start_line), str(end_line), copy_text(hash),
                copy_text(pg_text(text)), "\\N" if date is None else copy_text(date), repr(time.time()),
                copy_array(terms.terms), copy_array(terms.counts), str(terms.length),
                *copy_annotations(annotations))) + "\n")
            self._term_deltas.update(terms.terms)
            self._size_deltas[0] += 1
            self._size_deltas[1] += terms.length
        return seq

    def _next_seq(self) -> int:
        if not self._seqs:
            self._seqs = [int(r[0]) for r in self.conn.execute(
                "SELECT nextval('cm_chunks_seq_seq') FROM generate_series(1, %s)", (self._seq_block,))]
            self._seqs.reverse()
            self._seq_block = min(2 * self._seq_block, _SEQ_BLOCKS[1])
        return self._seqs.pop()

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

    def date_undated(self, dates: Mapping[str, str]) -> int:
        """Give the undated chunks of these memory files (path -> ISO date) that date; returns how many."""
        if not dates:
            return 0
        return self._write(
            "UPDATE cm_chunks AS c SET date = d.day FROM unnest(%s::text[], %s::text[]) AS d(path, day)"
            " WHERE c.workspace = %s AND c.gen = %s AND c.path = d.path AND c.source = 'memory' AND c.date IS NULL",
            ([pg_text(path) for path in dates], list(dates.values()), self.workspace, self.gen)).rowcount

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
            self.conn.execute("DELETE FROM cm_vectors WHERE seq = ANY(%s) AND workspace = %s AND gen = %s",
                              (list(seqs), self.workspace, self.gen))
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

    def damage(self, chunks: int | None = None) -> str | None:
        """What this generation lost (or gained) behind its writer's back, or None when whole.

        The writer keeps the chunks' number in `cm_stats` with every change it makes, and every chunk has its row in
        `cm_vectors`: rows deleted or added by anyone else (an operator's SQL, a hole in the row-level security)
        leave the numbers apart, and the sync rebuilds the generation. Two counts of the workspace's rows (35 ms at
        87,000 chunks): `chunks`, when the caller has just counted them (`counts`), saves one."""
        counted = "%(n)s" if chunks is not None else \
            "(SELECT count(*) FROM cm_chunks WHERE workspace = %(w)s AND gen = %(g)s)"
        row = self.conn.execute(
            f"SELECT (SELECT chunks FROM cm_stats WHERE workspace = %(w)s AND gen = %(g)s), {counted},"
            " (SELECT count(*) FROM cm_vectors WHERE workspace = %(w)s AND gen = %(g)s)",
            {"w": self.workspace, "g": self.gen, "n": chunks}).fetchone()
        assert row is not None
        stored, chunks, vectors = int(row[0] or 0), int(row[1]), int(row[2])
        if stored == chunks == vectors:
            return None
        return (f"the shared index holds {chunks:,} chunks and {vectors:,} vector rows of the {stored:,} chunks its"
                " writer stored: rows were changed outside clawmem")

    def pending_embeddings(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM cm_vectors WHERE workspace = %s AND gen = %s AND NOT embedded",
                                (self.workspace, self.gen)).fetchone()
        return int(row[0]) if row else 0

    # -- what a search reads ------------------------------------------------------------------

    def data_version(self) -> int:
        """Moves with every commit to any workspace in scope; also takes their live generations for the search."""
        rows = self.conn.execute("SELECT workspace, live_gen, version FROM cm_workspaces WHERE workspace = ANY(%s)"
                                 " ORDER BY workspace", (list(self.scope),)).fetchall()
        self._live.versions = {str(w): int(v) for w, _, v in rows}
        if self.read_only or self.scope != (self.workspace,):
            self._live.generations = [(str(w), int(g)) for w, g, _ in rows]
            self._live.read = True
            if self.scope == (self.workspace,) and rows:
                self.gen = int(rows[0][1])
        return hash(tuple((str(w), int(g), int(v)) for w, g, v in rows))

    def visible(self) -> list[str]:
        """The workspaces in scope this connection found (at the last `data_version`)."""
        return [w for w, _ in self._live.generations if w in self.scope] if self._live.read else [self.workspace]

    def chunk_lines(self, workspace: str, path: str, start_line: int, end_line: int) -> list[str | None]:
        return self._live.chunk_lines(workspace, path, start_line, end_line)

    def workspaces_of(self, seqs: Sequence[int]) -> dict[int, str]:
        """Which workspace each chunk is from (a search over several names it in each result)."""
        return {seq: str(row[7]) for seq, row in self._live.rows(list(seqs)).items()}

    # -- generations (see `generations`) --------------------------------------------------------

    def switch_to(self, fresh: PgStore) -> None:
        """Make `fresh`'s generation the live one and drop this one's rows, in one transaction."""
        with self.transaction():
            self.generations.switch(fresh.gen)
        self.gen = fresh.gen
        self.vectors.drop_stale_indexes()  # after the commit: a DROP INDEX holds off readers until its own

    def claim(self, writer: str, host: str, *, take_over: bool = False, formerly: str | None = None) -> None:
        self.generations.claim(writer, host, take_over=take_over, formerly=formerly)

    def settle(self) -> None:
        self.generations.settle()

    def drop_strays(self) -> None:
        """Rows of generations that are not live (a rebuild that died before its switch), and their
        HNSW indexes."""
        if self.generations.strays(self.gen):
            with self.transaction():
                self.generations.drop_others(keep=self.gen)
            self.vectors.drop_stale_indexes()

    def drop_own_generation(self) -> None:
        """A rebuild that failed: its rows go (the live generation is untouched)."""
        self.generations.drop(self.gen)
        self.vectors.drop_stale_indexes()

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        cur = self.conn.execute(sql, args)
        return [tuple(row) for row in cur.fetchall()] if cur.description else []
