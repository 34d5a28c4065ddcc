"""The connection to the shared index: sessions, transactions, COPY of new chunks, and vectors as pgvector binds them.

Below the store, which speaks SQL through it: a lost server costs one IndexUnavailable and the
next statement connects again, and a batch's new chunks and files are held and sent together.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from clawmem_index.errors import IndexUnavailable
from clawmem_index.text.annotations import Annotations
from clawmem_index.text.storable import storable

__all__ = ["READER_SESSION", "READ_TIMEOUT", "WRITER_SESSION", "WRITE_LOCK_TIMEOUT", "Connection", "PgVector",
           "connect", "copy_annotations", "copy_array", "copy_text", "one_line", "pg_text", "unavailable",
           "vector_args"]

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
            conn.execute(session)
        return conn
    except psycopg.Error as exc:
        raise IndexUnavailable(f"cannot reach the shared index: {one_line(exc)}") from exc


def pg_text(value: str) -> str:
    """Text PostgreSQL can hold: lone surrogates repaired (as SQLite's store does) and NUL, which it refuses, as
    U+FFFD."""
    return storable(value).replace("\x00", "\ufffd")


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


class Connection:
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
        self._live().execute(session)

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
    " terms, counts, length, importance, triggers, projects"
_COPY_CHUNKS = f"COPY cm_chunks({_CHUNK_COLUMNS}) FROM STDIN"
_STAGE_CHUNKS = ("CREATE TEMP TABLE IF NOT EXISTS cm_chunks_staged(seq bigint, workspace text, gen bigint, id text,"
                 " path text, source text, start_line integer, end_line integer, hash text, text text,"
                 " date text, updated_at double precision, terms text[], counts integer[], length integer,"
                 " importance integer, triggers text, projects text)")
_COPY_STAGED = f"COPY cm_chunks_staged({_CHUNK_COLUMNS}) FROM STDIN"
_UNSTAGE_CHUNKS = (f"WITH moved AS (DELETE FROM cm_chunks_staged RETURNING *)"
                   f" INSERT INTO cm_chunks({_CHUNK_COLUMNS}) SELECT * FROM moved")
_UPSERT_FILES = (
    "INSERT INTO cm_files SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[],"
    " %s::bigint[], %s::bigint[], %s::text[], %s::float8[]) ON CONFLICT(workspace, gen, path) DO UPDATE"
    " SET source = excluded.source, hash = excluded.hash, mtime = excluded.mtime, size = excluded.size,"
    " state = excluded.state, indexed_at = excluded.indexed_at")


def copy_text(value: str) -> str:
    """A text field of COPY's text format (replace is C speed; a translate table went through a dict per character)."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\n" in value or "\t" in value or "\r" in value:
        value = value.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return value


def copy_array(values: Sequence[object]) -> str:
    """A text[] or int[] as one field of COPY's text format (terms never hold a tab or a line break)."""
    strings = list(map(str, values))
    whole = "".join(strings)
    if "\\" in whole or '"' in whole:
        strings = [v.replace("\\", "\\\\").replace('"', '\\"') for v in strings]
    return ('{"' + '","'.join(strings) + '"}' if strings else "{}").replace("\\", "\\\\")



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


def vector_args(blob: bytes | None) -> tuple[int | None, PgVector | None]:
    """(dims, vector) for a chunk's columns; None, zero or not finite: no usable vector, never matched."""
    if blob is None or not blob:
        return None, None
    import numpy as np

    values = np.frombuffer(blob, dtype="<f4")
    if not np.all(np.isfinite(values)) or not np.any(values):
        return None, None
    return len(values), PgVector(blob)


def copy_annotations(notes: Annotations | None) -> tuple[str, str, str]:
    """A chunk's annotations as COPY fields (\\N: none)."""
    if notes is None:
        return "\\N", "\\N", "\\N"
    return ("\\N" if notes.importance is None else str(notes.importance),
            "\\N" if notes.triggers is None else copy_text(pg_text(notes.triggers)),
            "\\N" if notes.projects is None else copy_text(pg_text(notes.projects)))
