"""The index in a shared PostgreSQL: the same small interface as `clawmem_index.index.store.Store`.

One `PgStore` is one connection working for one workspace (its writer, or a reader that may also
read other workspaces: `scope`). A writer works on one generation: the live one, or a new one a
rebuild fills and `switch_to` makes live. A reader takes each workspace's live generation when
`data_version` is asked (the start of every search), so a switch is seen by the next search.

Keyword ranking is FTS5's BM25, computed here from the terms `terms.chunk_terms` keeps per chunk
and each workspace's term statistics (`cm_terms`, `cm_stats`), kept in step in the same
transaction as the chunks. Vectors are pgvector rows of their own (`cm_vectors`, one a chunk, made
with it by a trigger and filled when its vector comes), ranked by exact cosine distance; every
vector made also goes to the fleet-wide embedding cache.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format

from clawmem_index.errors import IndexUnavailable, WorkspaceTaken
from clawmem_index.index.filters import ChunkFilter
from clawmem_index.index.keyword_index import TextHit
from clawmem_index.index.pg.schema import migrate
from clawmem_index.index.pg.terms import ChunkTerms, Phrase, chunk_terms, phrases_of
from clawmem_index.text.storable import storable
from clawmem_index.index.store import ChunkRow, FileRow, JobRow
from clawmem_index.index.vector_index import VectorHit

__all__ = ["PgStore", "connect", "one_line", "pg_text", "unavailable"]

K1, B = 1.2, 0.75  # FTS5's bm25() defaults


def pg_text(value: str) -> str:
    """Text PostgreSQL can hold: lone surrogates repaired (as SQLite's store does) and NUL, which it refuses, as U+FFFD."""
    return storable(value).replace("\x00", "\ufffd")


def chunk_terms_of(text: str) -> ChunkTerms:
    """A chunk's terms as the shared index keeps them (picklable: a parse worker makes them)."""
    return chunk_terms(pg_text(text))


# A reader gives up on a statement after this: a tenant's open transaction, a queued lock or a stalled server
# then costs a search a clear error (and `status` fresh: false with the reason), not minutes of waiting.
READ_TIMEOUT = "5s"
# A writer waits this long for a lock (one a tenant's `LOCK TABLE` holds, say), then fails the pass, says why,
# and the next one tries again. Not a statement timeout: building a large workspace's vector graph takes minutes.
WRITE_LOCK_TIMEOUT = "30s"
READER_SESSION = f"SET statement_timeout = '{READ_TIMEOUT}'"
WRITER_SESSION = f"SET lock_timeout = '{WRITE_LOCK_TIMEOUT}'"


def connect(url: str, session: str = "") -> psycopg.Connection:
    """An autocommit connection (transactions are explicit) with `session`'s settings, or IndexUnavailable
    saying why not."""
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10, prepare_threshold=None)
        conn.adapters.register_dumper(PgVector, _VectorDumper)
        if session:
            conn.execute(session)  # type: ignore[arg-type]
        return conn
    except psycopg.Error as exc:
        raise IndexUnavailable(f"cannot reach the shared index: {one_line(exc)}") from exc


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def unavailable(exc: psycopg.OperationalError) -> IndexUnavailable:
    """What a failed statement tells the caller: a lost server, or one that did not answer in time."""
    if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
        return IndexUnavailable(f"the shared index did not answer in time ({one_line(exc)}): another session holds"
                                " a lock it needs, or the server is overloaded; try again shortly")
    return IndexUnavailable(f"lost the shared index: {one_line(exc)}")


@dataclass
class _Level:
    """One open transaction level: what it holds unsent, and its savepoint once one was needed."""

    chunks: list[str] = field(default_factory=list)  # COPY rows
    files: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # cm_files rows by path, the last one kept
    savepoint: str | None = None


class _Connection:
    """A connection that survives the server's restart: a lost one raises IndexUnavailable once, and the
    next call connects again (a transaction cut by the loss was rolled back by the server).

    Writes of a whole batch travel together. New chunks are held as COPY rows and files as rows of
    one upsert, and sent just before the next statement or commit; a nested transaction opens its
    savepoint only when a statement runs inside it. A cold index of a batch of files is then one
    COPY and one upsert instead of five round trips per file. What a level holds when it fails was
    never sent, and is dropped with it; each level's rows are sent inside its own savepoint.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = ""  # settings every connection of it takes (`use_session`), a new one after a loss too
        self.raw = connect(url)
        self.levels: list[_Level] = []
        self._copy: contextlib.ExitStack | None = None  # a COPY of chunks left open while Python goes on
        self._copy_writer: Any = None
        self._staged: bool | None = None  # chunks COPY into a temp table first (see `_copy_chunks`)
        self._typed: psycopg.Connection | None = None  # the connection vectors are bound with their type on

    def _live(self) -> psycopg.Connection:
        if self.raw.broken or self.raw.closed:
            self.levels.clear()
            self._copy = None
            self._staged = None
            self.raw = connect(self.url, self.session)
        return self.raw

    def use_session(self, session: str) -> None:
        self.session = session
        self._live().execute(session)  # type: ignore[arg-type]

    def type_vectors(self) -> None:
        """Bind vectors with pgvector's type (looked up once per connection, once the extension exists):
        an array of them can then go as one binary parameter."""
        raw = self._live()
        if self._typed is raw:
            return
        from psycopg.types import TypeInfo

        self._prepare()  # a COPY left open must end before another statement
        info = TypeInfo.fetch(raw, "vector")
        if info is None:
            raise IndexUnavailable("the shared index's database has no pgvector `vector` type")
        info.register(raw)
        raw.adapters.register_dumper(PgVector, type("_TypedVectorDumper", (_VectorDumper,), {"oid": info.oid}))
        self._typed = raw

    def _copy_chunks(self) -> str:
        """The COPY that takes chunk rows: into the chunks, or, for a role row-level security applies to
        (PostgreSQL refuses COPY FROM there), into a temp table `_unstage` moves them from with an
        INSERT the policies check."""
        if self._staged is None:
            row = self.raw.execute("SELECT row_security_active('cm_chunks')").fetchone()
            self._staged = bool(row and row[0])
        if not self._staged:
            return _COPY_CHUNKS
        try:
            self.raw.execute(_STAGE_CHUNKS)
        except psycopg.errors.InsufficientPrivilege as exc:
            database, role = self.raw.info.dbname, self.raw.info.user
            raise IndexUnavailable(
                f"role {role!r} may not create temporary tables in database {database!r}, where a writer stages its"
                f" chunks ({one_line(exc)}): the database's owner runs GRANT TEMPORARY ON DATABASE {database} TO"
                f" {role} (grant_workspace does, for a writable grant)") from exc
        return _COPY_STAGED

    def _unstage(self) -> None:
        if self._staged:
            self.raw.execute(_UNSTAGE_CHUNKS)

    def _stream(self, rows: str) -> None:
        """Send chunk rows of the outermost level into a COPY kept open: the server stores them while the
        next files are parsed, until the next statement ends it (`_end_copy`)."""
        if self._copy is None:
            from psycopg.copy import QueuedLibpqWriter

            stack = contextlib.ExitStack()
            cur = stack.enter_context(self.raw.cursor())
            self._copy_writer = stack.enter_context(cur.copy(self._copy_chunks(), writer=QueuedLibpqWriter(cur)))
            self._copy = stack
        self._copy_writer.write(rows)

    def _end_copy(self, error: BaseException | None = None) -> None:
        stack, self._copy, self._copy_writer = self._copy, None, None
        if stack is None:
            return
        if error is None:
            stack.close()
            self._unstage()
        elif not self.raw.broken:
            with contextlib.suppress(psycopg.Error):
                stack.__exit__(type(error), error, error.__traceback__)

    def hold_chunk(self, row: str) -> None:
        self.levels[-1].chunks.append(row)

    def hold_file(self, path: str, row: tuple[Any, ...]) -> None:
        self.levels[-1].files[path] = row

    def _prepare(self) -> None:
        """Before a statement: each level's savepoint opened and its held rows sent inside it, outermost first."""
        self._end_copy()
        for depth, level in enumerate(self.levels):
            if depth and level.savepoint is None:
                self.raw.execute(f"SAVEPOINT cm_level_{depth}")
                level.savepoint = f"cm_level_{depth}"
            if level.chunks:
                rows, level.chunks = "".join(level.chunks), []
                with self.raw.cursor() as cur, cur.copy(self._copy_chunks()) as copy:
                    copy.write(rows)
                self._unstage()
            if level.files:
                rows_ = list(level.files.values())
                level.files = {}
                self.raw.execute(_UPSERT_FILES, [list(column) for column in zip(*rows_, strict=True)])

    def execute(self, query: Any, args: Any = None, *, binary: bool = False) -> psycopg.Cursor[Any]:
        try:
            raw = self._live()
            self._prepare()
            return raw.execute(query, args, binary=binary)
        except psycopg.OperationalError as exc:
            raise unavailable(exc) from exc

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            if not self.levels:
                with self._live().transaction():
                    self.levels.append(_Level())
                    try:
                        yield
                        self._prepare()
                    except BaseException as exc:
                        self._end_copy(exc)
                        raise
                    finally:
                        self.levels.clear()
            else:
                yield from self._nested()
        except psycopg.OperationalError as exc:
            raise unavailable(exc) from exc

    def _nested(self) -> Iterator[None]:
        level = _Level()
        self.levels.append(level)
        try:
            yield
        except BaseException as exc:
            self.levels.pop()
            if level.savepoint is not None and not self.raw.broken:
                self._end_copy(exc)
                self.raw.execute(f"ROLLBACK TO SAVEPOINT {level.savepoint}")
                self.raw.execute(f"RELEASE SAVEPOINT {level.savepoint}")
            raise
        self.levels.pop()
        if level.savepoint is not None:
            self.raw.execute(f"RELEASE SAVEPOINT {level.savepoint}")
        parent = self.levels[-1]
        if len(self.levels) == 1 and level.chunks:
            self._stream("".join(level.chunks))
        else:
            parent.chunks.extend(level.chunks)
        parent.files.update(level.files)

    def cursor(self) -> psycopg.Cursor[Any]:
        raw = self._live()
        self._prepare()
        return raw.cursor()

    @property
    def in_transaction(self) -> bool:
        return bool(self.levels)

    @property
    def info(self) -> Any:
        return self.raw.info

    def close(self) -> None:
        self.levels.clear()
        self._copy = None
        self.raw.close()


_CHUNK_COLUMNS = "seq, workspace, gen, id, path, source, start_line, end_line, hash, text, date, updated_at," \
    " terms, counts, length"
_COPY_CHUNKS = f"COPY cm_chunks({_CHUNK_COLUMNS}) FROM STDIN"
_STAGE_CHUNKS = ("CREATE TEMP TABLE IF NOT EXISTS cm_chunks_staged(seq bigint, workspace text, gen bigint, id text,"
                 " path text, source text, start_line integer, end_line integer, hash text, text text,"
                 " date text, updated_at double precision, terms text[], counts integer[], length integer)")
_COPY_STAGED = f"COPY cm_chunks_staged({_CHUNK_COLUMNS}) FROM STDIN"
_UNSTAGE_CHUNKS = (f"WITH moved AS (DELETE FROM cm_chunks_staged RETURNING *)"
                   f" INSERT INTO cm_chunks({_CHUNK_COLUMNS}) SELECT * FROM moved")
_UPSERT_FILES = (
    "INSERT INTO cm_files SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[],"
    " %s::bigint[], %s::bigint[], %s::text[], %s::float8[]) ON CONFLICT(workspace, gen, path) DO UPDATE"
    " SET source = excluded.source, hash = excluded.hash, mtime = excluded.mtime, size = excluded.size,"
    " state = excluded.state, indexed_at = excluded.indexed_at")
_GENERATION_TABLES = ("cm_meta", "cm_files", "cm_chunks", "cm_vectors", "cm_terms", "cm_stats")  # rows of one generation
_SEQ_BLOCKS = (256, 8192)  # chunk numbers taken from the sequence in one round trip: first, and at most
# A rebuild writes in bulk: its GIN insertions are merged into the index in bigger batches, with more memory.
_BULK_SESSION = "SET gin_pending_list_limit = '16MB'; SET work_mem = '32MB'"


def _copy_text(value: str) -> str:
    """A text field of COPY's text format (replace is C speed; a translate table went through a dict per character)."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\n" in value or "\t" in value or "\r" in value:
        value = value.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return value


def _copy_array(values: Sequence[object]) -> str:
    """A text[] or int[] as one field of COPY's text format (terms never hold a tab or a line break)."""
    strings = list(map(str, values))
    whole = "".join(strings)
    if "\\" in whole or '"' in whole:
        strings = [v.replace("\\", "\\\\").replace('"', '\\"') for v in strings]
    return ('{"' + '","'.join(strings) + '"}' if strings else "{}").replace("\\", "\\\\")


class _PostingsCache:
    """Each phrase's matches in one workspace's generation at one version: chunk numbers, term
    frequencies and lengths, read once (one query) and kept while the version stands.

    BM25 of an OR of phrases is then summed in numpy: a phrase's document frequency is its number
    of matches, N and the average length come from `cm_stats` (kept per version too). The same
    sums `_bm25`'s query makes, without sending every matching chunk's terms through it again.
    Bounded by the matches held (least recently used dropped).
    """

    LIMIT = 1 << 21

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._held = 0
        self._entries: OrderedDict[tuple[str, int, int, Phrase], tuple[Any, Any, Any]] = OrderedDict()
        self._stats: dict[tuple[str, int, int], tuple[int, int]] = {}
        self._last: tuple[object, tuple[Any, Any] | None] = (None, None)  # one query's sums: its ranking, then its scores

    def bm25(self, phrases: list[Phrase], live: list[tuple[str, int]], versions: dict[str, int], *,
             limit: int | None, seqs: list[int] | None) -> list[tuple[int, float]]:
        import numpy as np

        keys = [(w, g, versions.get(w, -1)) for w, g in live]
        summed = self._last[1] if self._last[0] == (keys, phrases) else None
        if summed is None:
            summed = self._sums(phrases, keys)
            self._last = ((keys, phrases), summed)
        if summed is None:
            return []
        matched, gains = summed
        if seqs is not None:
            picked = np.isin(matched, np.asarray(seqs, dtype=np.int64))
            return [(int(q), -float(g)) for q, g in zip(matched[picked], gains[picked], strict=True)]
        if limit is not None and limit < len(matched):
            floor = np.partition(gains, len(gains) - limit)[len(gains) - limit]
            keep = gains >= floor
            matched, gains = matched[keep], gains[keep]
        order = np.lexsort((matched, -gains))[:limit]
        return [(int(matched[i]), -float(gains[i])) for i in order]

    def _sums(self, phrases: list[Phrase], keys: list[tuple[str, int, int]]) -> tuple[Any, Any] | None:
        """Every matching chunk and its BM25 relevance, summed over the phrases in their order (as FTS5 does)."""
        import numpy as np

        chunks = tokens = 0
        for key in keys:
            n, t = self._stats_of(*key)
            chunks, tokens = chunks + n, tokens + t
        avgdl = (tokens / chunks if chunks else 1.0) or 1.0
        all_seqs, all_gains = [], []
        for phrase in phrases:
            found = [self._phrase(key, phrase) for key in keys]
            df = sum(len(f[0]) for f in found)
            if not df:
                continue
            idf = math.log((chunks - df + 0.5) / (df + 0.5)) if chunks else 0.0
            idf = idf if idf > 0 else 1e-6
            for seq, tf, length in found:
                all_seqs.append(seq)
                all_gains.append(idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avgdl)))
        if not all_seqs:
            return None
        # Each phrase's matches are in chunk order: a stable sort merges the runs, keeping phrase order per chunk.
        seqs = np.concatenate(all_seqs)
        order = np.argsort(seqs, kind="stable")
        seqs, gains = seqs[order], np.concatenate(all_gains)[order]
        starts = np.flatnonzero(np.concatenate(([True], seqs[1:] != seqs[:-1])))
        return seqs[starts], np.add.reduceat(gains, starts)

    def _stats_of(self, workspace: str, gen: int, version: int) -> tuple[int, int]:
        key = (workspace, gen, version)
        if key not in self._stats:
            row = self._conn.execute("SELECT chunks, tokens FROM cm_stats WHERE workspace = %s AND gen = %s",
                                     (workspace, gen)).fetchone()
            if len(self._stats) > 256:
                self._stats.clear()
            self._stats[key] = (int(row[0]), int(row[1])) if row else (0, 0)
        return self._stats[key]

    def _phrase(self, key: tuple[str, int, int], phrase: Phrase) -> tuple[Any, Any, Any]:
        import numpy as np

        entry = self._entries.get((*key, phrase))
        if entry is not None:
            self._entries.move_to_end((*key, phrase))
            return entry
        workspace, gen, _ = key
        if phrase.prefix:
            pattern = phrase.term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            row = self._conn.execute(
                "WITH t AS (SELECT coalesce(array_agg(term), '{}') AS terms FROM (SELECT term FROM cm_terms"
                "   WHERE workspace = %(w)s AND gen = %(g)s AND term LIKE %(p)s ORDER BY term LIMIT 4096) AS m)"
                " SELECT array_agg(c.seq ORDER BY c.seq), array_agg((SELECT sum(u.tf) FROM unnest(c.terms, c.counts)"
                "   AS u(term, tf) WHERE u.term = ANY(t.terms)) ORDER BY c.seq), array_agg(c.length ORDER BY c.seq)"
                " FROM cm_chunks AS c, t WHERE c.workspace = %(w)s AND c.gen = %(g)s AND c.terms && t.terms",
                {"w": workspace, "g": gen, "p": pattern}, binary=True).fetchone()
        else:
            row = self._conn.execute(
                "SELECT array_agg(c.seq ORDER BY c.seq), array_agg(c.counts[array_position(c.terms, %(t)s)]"
                " ORDER BY c.seq), array_agg(c.length ORDER BY c.seq) FROM cm_chunks AS c"
                " WHERE c.workspace = %(w)s AND c.gen = %(g)s AND c.terms @> ARRAY[%(t)s]::text[]",
                {"w": workspace, "g": gen, "t": phrase.term}, binary=True).fetchone()
        seqs, tfs, lengths = row if row and row[0] is not None else ([], [], [])
        entry = (np.asarray(seqs, dtype=np.int64), np.asarray(tfs, dtype=np.float64),
                 np.asarray(lengths, dtype=np.float64))
        self._entries[(*key, phrase)] = entry
        self._held += len(entry[0])
        while self._held > self.LIMIT and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self._held -= len(dropped[0])
        return entry


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
        self.conn = _Connection(url)
        try:
            if not read_only:
                migrate(self.conn)
            self.gen = self._generation(new=new_generation, create=create and not read_only)
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
        self._live: list[tuple[str, int]] = [(workspace, self.gen)]
        self._live_read = False
        self._seqs: list[int] = []  # chunk numbers taken from the sequence and not used yet
        self._seq_block = _SEQ_BLOCKS[0]  # doubled at each round trip: a bulk write stops its COPY less often
        self._versions: dict[str, int] = {}
        self._ef_search: int | None = None
        self._vector_dims: set[int] = set()  # noted in this generation's meta (`ensure_vector_table`)
        self._vectors_indexed: set[tuple[int, int]] = set()  # (generation, dims) known to have their index
        self._postings = _PostingsCache(self.conn) if keep_postings else None

    def _generation(self, *, new: bool, create: bool) -> int:
        if create:
            self.conn.execute("INSERT INTO cm_workspaces(workspace, created_at) VALUES(%s, %s)"
                              " ON CONFLICT DO NOTHING", (self.workspace, time.time()))
            self._add_partition()
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

    def _add_partition(self) -> None:
        """This workspace's partition of the chunks (see clawmem_index.index.pg.schema), made if missing."""
        found = self.conn.execute("SELECT to_regclass(cm_vector_partition_name(%s)) IS NOT NULL",
                                  (self.workspace,)).fetchone()
        if found and found[0]:
            return
        try:
            self.conn.execute("SELECT cm_add_partition(%s)", (self.workspace,))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise IndexUnavailable(
                f"workspace {self.workspace!r} has no place in the shared index yet, and this role may not make"
                " it: the database's owner grants it with clawmem_index.index.pg.schema.grant_workspace") from exc

    def close(self) -> None:
        self.conn.close()

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
        if not self.conn.in_transaction:
            return self.transaction()
        return contextlib.nullcontext()

    def _bump(self) -> None:
        self.conn.execute("UPDATE cm_workspaces SET version = version + 1 WHERE workspace = %s", (self.workspace,))

    def _write(self, query: str, args: Any = None) -> psycopg.Cursor[Any]:
        """A write outside `transaction()` is its own commit: the version moves with it."""
        if not self.conn.in_transaction:
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

    def file_stats(self) -> dict[str, tuple[int, int]]:
        return {row[0]: (int(row[1]), int(row[2])) for row in self.conn.execute(
            "SELECT path, mtime, size FROM cm_files WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))}

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
                     text: str, fts_text: str, model: str = "", date: str | None = None,
                     terms: ChunkTerms | None = None) -> int:
        """Add a chunk with its terms (`terms_of(fts_text)`, made here unless given), and count them into
        the workspace's term statistics."""
        if terms is None:
            terms = chunk_terms_of(fts_text)
        seq = self._next_seq()
        with self._atomic():
            self.conn.hold_chunk("\t".join((
                str(seq), _copy_text(self.workspace), str(self.gen), _copy_text(pg_text(id)), _copy_text(pg_text(path)),
                _copy_text(source), str(start_line), str(end_line), _copy_text(hash),
                _copy_text(pg_text(text)), "\\N" if date is None else _copy_text(date), repr(time.time()),
                _copy_array(terms.terms), _copy_array(terms.counts), str(terms.length))) + "\n")
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

        The writer keeps the chunks' number in `cm_stats` with every change it makes, and every chunk
        has its row in `cm_vectors`: rows deleted or added by anyone else (an operator's SQL, a hole
        in the row-level security) leave the numbers apart, and the sync rebuilds the generation.
        Two counts of the workspace's rows (35 ms at 87,000 chunks): `chunks`, when the caller has
        just counted them (`counts`), saves one.
        """
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
        self._versions = {str(w): int(v) for w, _, v in rows}
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
        """The workspaces in scope at their live generations (the first condition picks their partitions)."""
        return (f"{alias}.workspace = ANY(%(scope_ws)s::text[]) AND ({alias}.workspace, {alias}.gen) IN"
                " (SELECT * FROM unnest(%(scope_ws)s::text[], %(scope_gen)s::bigint[]))",
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
        if self._postings is not None and not where and not self.conn.in_transaction and self._live_read:
            return self._postings.bm25(phrases, self._live, self._versions, limit=limit, seqs=seqs)
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
        """The `limit` nearest chunks by cosine distance, nearest first (ties by seq).

        One search per workspace in scope, each through its generation's HNSW index when it has one
        (`index_vectors`): the index is partial, so the generation and dimensions are written into
        the query for the planner to match it. An iterative scan goes on past chunks a filter drops
        until `limit` pass; the distances are exact, the order is re-sorted on them.
        """
        if limit < 1 or not self._live:
            return []
        dims = len(query_blob) // 4
        self._tune_hnsw(candidates_for or limit)
        condition, args = _filter_sql(where, "c")
        arms = []
        for n, (workspace, gen) in enumerate(self._live):
            args[f"w{n}"] = workspace
            arms.append(
                "(SELECT c.seq, c.path, c.source, c.start_line, c.end_line, c.text,"
                f" v.embedding::vector({dims}) <=> %(q)b::vector({dims}) AS d, c.date, c.workspace"
                " FROM cm_vectors AS v JOIN cm_chunks AS c ON c.workspace = v.workspace AND c.seq = v.seq"
                f" WHERE v.workspace = %(w{n})s AND v.gen = {int(gen)} AND v.dims = {dims}"
                f" AND c.workspace = %(w{n})s AND {condition} ORDER BY d LIMIT %(limit)s)")
        rows = self.conn.execute(
            f"SELECT * FROM ({' UNION ALL '.join(arms)}) AS near ORDER BY d, seq LIMIT %(limit)s",
            {**args, "q": PgVector(query_blob), "limit": limit}).fetchall()
        return [VectorHit(int(r[0]), r[1], r[2], r[3], r[4], r[5], float(r[6]), r[7], r[8]) for r in rows]

    def _tune_hnsw(self, wanted: int) -> None:
        """How many candidates an HNSW search keeps: four times the rows the search needs
        (`candidates_for`: a read ahead past them continues the scan), at least 300, at most 1000
        (pgvector's bound). The graphs are lean (m 8, built fast) and searched wide: recall@10 0.987
        against the exact order on real vectors (docs/benchmarks.md). Each workspace's index holds
        only its own vectors (its partition's)."""
        ef = min(1000, max(300, 4 * wanted))
        if ef != self._ef_search:
            self.conn.execute(f"SET hnsw.ef_search = {ef}")
            if self._ef_search is None:
                self.conn.execute("SET hnsw.iterative_scan = relaxed_order")
            self._ef_search = ef

    def vector_distances_of(self, query_blob: bytes, seqs: Sequence[int]) -> dict[int, float]:
        if not seqs:
            return {}
        scope, args = self._scope_sql("v")
        return {int(seq): float(d) for seq, d in self.conn.execute(
            f"SELECT v.seq, v.embedding <=> %(q)b::vector FROM cm_vectors AS v WHERE v.seq = ANY(%(seqs)s) AND {scope}"
            " AND v.embedding IS NOT NULL AND v.dims = %(dims)s",
            {**args, "q": PgVector(query_blob), "seqs": list(seqs), "dims": len(query_blob) // 4})}

    def vec_table_exists(self) -> bool:
        return True

    def vectors_in_cells(self) -> bool:
        """Never: pgvector's HNSW graph answers deeper reads itself."""
        return False

    def vector_method(self) -> str:
        """HNSW when every workspace in scope has its index for the vectors it holds; an exact scan
        (slower, never wrong) while one waits for its embedding pass to end (see `index_vectors`)."""
        self.data_version()
        missing = self.conn.execute(
            "SELECT count(*) FROM cm_meta AS m JOIN unnest(%s::text[], %s::bigint[]) AS l(w, g)"
            " ON m.workspace = l.w AND m.gen = l.g WHERE m.key = 'vector_dims'"
            " AND to_regclass(quote_ident(cm_vector_index_name(l.w, l.g, m.value::integer))) IS NULL",
            ([w for w, _ in self._live], [g for _, g in self._live])).fetchone()
        if missing and missing[0]:
            return "pgvector exact cosine scan (the HNSW index is built when the embedding pass ends)"
        return "pgvector HNSW (cosine), exact distances"

    def ensure_vector_table(self, dims: int, precision: str = "float32") -> None:
        """Note that this generation holds vectors of `dims` dimensions (`vector_dims`, as SQLite's store).

        Their HNSW index is not made here: pgvector keeps one up to date row by row, which cost a
        cold index nine tenths of its vector writes. `index_vectors` builds it whole at the end of
        the embedding pass. Vectors are float32 here (`precision` float16 is refused by the settings).
        """
        if precision != "float32":
            raise ValueError("the shared PostgreSQL index stores float32 vectors only")
        if dims in self._vector_dims:
            return
        self._vector_dims.add(dims)
        if self.get_meta("vector_dims") != str(int(dims)):
            self.set_meta("vector_dims", str(int(dims)))

    def index_vectors(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Build this generation's HNSW index from the vectors stored, if it has none yet (each
        generation and size of vector has its own: a rebuild's is made before its switch).
        One statement in the server: no `progress` to report.

        Through `cm_index_vectors`, which runs as the tables' owner for any role that may write the
        workspace, with memory for the graph. The build holds writes to this workspace's rows
        (its writer's own, being this one), not reads. A role that may not build it leaves
        searches to scan exactly: slower, never wrong.
        """
        dims = self.get_meta("vector_dims")
        if dims is None or (self.gen, int(dims)) in self._vectors_indexed:
            return
        try:
            with self._atomic():
                built = self.conn.execute("SELECT cm_index_vectors(%s, %s, %s)",
                                          (self.workspace, self.gen, int(dims))).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            return
        self._vectors_indexed.add((self.gen, int(dims)))
        if built and built[0] and not self.new_generation and not self.conn.in_transaction:
            self._drop_stale_vector_indexes()  # the graph of a size of vector this generation no longer holds

    def release_vector_index(self) -> None:
        """Before every vector of this generation is replaced in place (a model switch): drop its graphs.

        Kept, the graph would take each new vector one by one; dropped, searches scan exactly until
        `index_vectors` builds the new one whole at the end of the fill (status says which). Run
        outside any transaction: the DROP's exclusive lock on the partition lasts only this statement,
        not the switch.
        """
        if self.conn.in_transaction:
            return
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            self.conn.execute("SELECT cm_drop_generation_vector_indexes(%s, %s)", (self.workspace, self.gen))
        self._vectors_indexed = {key for key in self._vectors_indexed if key[0] != self.gen}

    def _drop_stale_vector_indexes(self) -> None:
        """The HNSW indexes of generations (or sizes of vector) no longer live: each held its rows' graph.
        One that cannot be dropped now (a reader of the workspace holds its lock past the function's
        lock_timeout) goes at a later drop: searches never read a graph of a generation not live."""
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege, IndexUnavailable):
            self.conn.execute("SELECT cm_drop_vector_indexes(%s)", (self.workspace,))

    # -- vectors of chunks ----------------------------------------------------------------------

    def store_vector(self, seq: int, blob: bytes | None, model: str) -> None:
        self._write("UPDATE cm_vectors SET embedded = true, model = %s, dims = %s, embedding = %b::vector"
                    " WHERE seq = %s AND workspace = %s AND gen = %s",
                    (model, *_vector_args(blob), seq, self.workspace, self.gen))

    def store_vectors(self, items: Sequence[tuple[int, str, bytes | None]], model: str) -> list[tuple[int, bytes]]:
        """Each chunk's vector if it still waits for the text `hash` names (see Store.store_vectors).

        One statement for the batch, the vectors bound as one binary array: an UPDATE a vector
        cost twice the server's time (each statement's own start, plan and round trip)."""
        if not items:
            return []
        self.conn.type_vectors()
        columns: tuple[list[Any], ...] = ([], [], [], [])
        for seq, h, blob in items:
            dims, vector = _vector_args(blob)
            for column, value in zip(columns, (seq, h, dims, vector), strict=True):
                column.append(value)
        with self.transaction():
            given = {int(row[0]) for row in self.conn.execute(
                "UPDATE cm_vectors AS v SET embedded = true, model = %b, dims = u.dims, embedding = u.embedding"
                " FROM unnest(%b::bigint[], %b::text[], %b::integer[], %b::vector[]) AS u(seq, hash, dims, embedding)"
                " WHERE v.workspace = %b AND v.gen = %b AND v.seq = u.seq AND v.hash = u.hash AND NOT v.embedded"
                " RETURNING v.seq", (model, *columns, self.workspace, self.gen), binary=True)}
        return [(seq, blob) for seq, _, blob in items if seq in given]  # type: ignore[misc]

    def pending_chunks(self, limit: int, after: int = 0) -> list[tuple[int, str, str]]:
        return [(int(r[0]), str(r[1]), str(r[2])) for r in self.conn.execute(
            "SELECT v.seq, v.hash, c.text FROM cm_vectors AS v JOIN cm_chunks AS c ON c.workspace = v.workspace"
            " AND c.seq = v.seq WHERE v.workspace = %s AND v.gen = %s AND NOT v.embedded AND v.seq > %s"
            " AND c.workspace = %s ORDER BY v.seq LIMIT %s", (self.workspace, self.gen, after, self.workspace, limit))]

    def reset_vectors(self, next_owner: tuple[str, str, str] | None = None, precision: str = "float32") -> int:
        """Forget this generation's vectors (a new model's go in their place; the cache keeps the old ones,
        as the fleet's cache keeps every vector: nothing to park)."""
        with self._atomic():
            cur = self.conn.execute("UPDATE cm_vectors SET embedded = false, model = '', dims = NULL, embedding = NULL"
                                    " WHERE workspace = %s AND gen = %s", (self.workspace, self.gen))
            self.delete_meta("vector_dims")
        self._vector_dims.clear()
        return int(cur.rowcount)

    # -- the fleet's embedding cache ----------------------------------------------------------

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

    def uncached_pending(self, provider: str, model: str, key: str, *,
                         exclude: Collection[str] = ()) -> dict[str, str]:
        rows = self.conn.execute(
            "WITH pending AS (SELECT c.hash, c.text FROM cm_vectors AS v JOIN cm_chunks AS c"
            " ON c.workspace = v.workspace AND c.seq = v.seq WHERE v.workspace = %s AND v.gen = %s AND NOT v.embedded"
            " AND c.workspace = %s) SELECT p.hash, p.text FROM pending AS p"
            " WHERE p.hash IN (SELECT cm_uncached(%s, %s, %s, ARRAY(SELECT hash FROM pending)))",
            (self.workspace, self.gen, self.workspace, provider, model, key))
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
            self._drop_generations(keep=fresh.gen)
        self.gen = fresh.gen
        self._drop_stale_vector_indexes()  # after the commit: a DROP INDEX holds off readers until its own

    def claim(self, writer: str, host: str, *, take_over: bool = False, formerly: str | None = None) -> None:
        """Make sure the folder `writer` names is the one writing this workspace: the first to write it
        claims it; another folder is refused with WorkspaceTaken unless it takes it over, or the
        workspace is claimed by `formerly`, this folder's identity of an older clawmem.

        Read first and written only when it changes, so a writer's every lock costs no commit.
        """
        row = self.conn.execute("SELECT writer, writer_host, writer_since FROM cm_workspaces WHERE workspace = %s",
                                (self.workspace,)).fetchone()
        if row is not None and row[0] == writer:
            return
        if row is not None and row[0] is not None and row[0] != formerly and not take_over:
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(row[2])) if row[2] else "an earlier run"
            raise WorkspaceTaken(
                f"workspace {self.workspace!r} of the shared index is written by another folder (host {row[1]},"
                f" since {since}); two writers of one name would each drop the other's files from it. Give this"
                f" folder another workspace_name, or run `clawmem take-over` here to move the workspace to it")
        self.conn.execute("UPDATE cm_workspaces SET writer = %s, writer_host = %s, writer_since = %s"
                          " WHERE workspace = %s", (writer, host, time.time(), self.workspace))

    def settle(self) -> None:
        """After a bulk write, merge the keyword index's pending entries now (GIN keeps recent insertions
        in a list every search scans whole, and the next small write would merge them itself), and
        give the planner the partition's statistics (until autovacuum's first round it guesses from
        the pages, and at a few thousand chunks it scanned the whole workspace for a rare word:
        15 ms a query instead of 0.5). The first queries and the first edit after a rebuild then cost
        what later ones do. Only the tables' owner may; for other roles autovacuum does both within
        its next rounds."""
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege), self.conn.transaction():
            self.conn.execute("SET LOCAL default_statistics_target = 10")  # a small sample: enough for the plan
            row = self.conn.execute("SELECT cm_partition_name(%s)", (self.workspace,)).fetchone()
            if row is not None:
                self.conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(row[0])))
        names = self.conn.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
            " JOIN pg_am AS a ON a.oid = c.relam WHERE a.amname = 'gin'"
            " AND i.indrelid = to_regclass(quote_ident(cm_partition_name(%s)))", (self.workspace,)).fetchall()
        for (name,) in names:
            with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
                self.conn.execute("SELECT gin_clean_pending_list(%s::regclass)", (name,))

    def drop_strays(self) -> None:
        """Rows of generations that are not live (a rebuild that died before its switch), and their
        HNSW indexes.

        Rows are looked for first, through the keys, which lead with workspace and generation: every write
        lock asks, and a commit for nothing would move the version every reader's cache follows. Each
        side of the live generation is its own range: with `gen < g OR gen > g` the planner read every
        key of the workspace (72 ms an edit in the term statistics alone at 20,000 notes).
        """
        found = self.conn.execute(
            "SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {table} WHERE workspace = %(w)s AND gen {side} %(g)s)"
                                    for table in _GENERATION_TABLES for side in "<>"),
            {"w": self.workspace, "g": self.gen}).fetchone()
        if found and found[0]:
            with self.transaction():
                self._drop_generations(keep=self.gen)
            self._drop_stale_vector_indexes()

    def drop_own_generation(self) -> None:
        """A rebuild that failed: its rows go (the live generation is untouched)."""
        with self.conn.transaction():
            for table in _GENERATION_TABLES:
                self.conn.execute(f"DELETE FROM {table} WHERE workspace = %s AND gen = %s",  # noqa: S608
                                  (self.workspace, self.gen))
        self._drop_stale_vector_indexes()

    def _drop_generations(self, keep: int) -> None:
        for table in _GENERATION_TABLES:
            self.conn.execute(f"DELETE FROM {table} WHERE workspace = %(w)s AND (gen < %(g)s OR gen > %(g)s)",  # noqa: S608
                              {"w": self.workspace, "g": keep})

    def execute(self, query: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Escape hatch for diagnostics and tests."""
        cur = self.conn.execute(query, args)  # type: ignore[arg-type]
        return [tuple(row) for row in cur.fetchall()] if cur.description else []


def _filter_sql(where: ChunkFilter | None, alias: str) -> tuple[str, dict[str, Any]]:
    """`ChunkFilter.sql` in PostgreSQL's dialect (no filter: true)."""
    return (where or ChunkFilter()).sql(alias, dialect="postgres")


class PgVector:
    """A vector bound in pgvector's binary form (dimensions, a zero, each float32 big-endian): formatting
    384 floats as text cost a third of a millisecond a vector; the server takes the type from the cast."""

    __slots__ = ("data",)

    def __init__(self, blob: bytes) -> None:
        import numpy as np

        values = np.frombuffer(blob, dtype="<f4")
        self.data = struct.pack(">HH", len(values), 0) + values.astype(">f4").tobytes()


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: PgVector) -> bytes:
        return obj.data


def _vector_args(blob: bytes | None) -> tuple[int | None, PgVector | None]:
    """(dims, vector) for a chunk's columns; None, zero or not finite: no usable vector, never matched."""
    if blob is None or not blob:
        return None, None
    import numpy as np

    values = np.frombuffer(blob, dtype="<f4")
    if not np.all(np.isfinite(values)) or not np.any(values):
        return None, None
    return len(values), PgVector(blob)
