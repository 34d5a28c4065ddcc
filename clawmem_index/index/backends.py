"""Where the index lives: one SQLite file (the default), or a workspace's rows in a shared PostgreSQL.

The engine asks a backend for connections, the writer's lock, and a private place to rebuild into
that it then swaps in whole; everything else goes through the store interface both share. A
backend opens no connection until asked, so choosing one costs nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import xxhash

from clawmem_index.config import Settings
from clawmem_index.errors import DiskFull, IndexBusy, IndexCorrupt, IndexUnavailable
from clawmem_index.index.connection import checkpoint_by_limit, make_private_dirs, make_private_file
from clawmem_index.index.interface import IndexStore
from clawmem_index.index.keyword_index import SHARED_POSTINGS, PostingsCache
from clawmem_index.index.store import Store
from clawmem_index.index.vector_cells import SHARED_BYTES, SharedCells

if TYPE_CHECKING:
    from clawmem_index.index.pg.store import PgStore

__all__ = ["Backend", "PostgresBackend", "SqliteBackend", "backend_for", "former_writer_identity", "redacted",
           "writer_identity"]


S = TypeVar("S", bound=IndexStore)  # the stores a backend opens, and takes back


class Backend(Protocol[S]):
    """Where one workspace's index lives (SqliteBackend: `Backend[Store]`, PostgresBackend: `Backend[PgStore]`); the
    engine holds a `Backend[Any]` and passes back only stores the same backend opened."""

    name: str

    def describe(self) -> str: ...
    def exists(self) -> bool: ...
    def open_reader(self, *, read_only: bool, long_lived: bool) -> S: ...
    def open_live(self) -> S | None: ...
    def refresh(self, store: S) -> None: ...
    def write_lock(self, timeout: float) -> contextlib.AbstractContextManager[None]: ...
    def writing(self) -> contextlib.AbstractContextManager[None]: ...
    def fresh(self) -> contextlib.AbstractContextManager[S]: ...
    def swap_in(self, fresh: S) -> None: ...
    def status(self) -> dict[str, object]: ...
    def memory(self) -> dict[str, object]: ...
    def files_held_by(self, store: S) -> str | None: ...


def writer_identity(state: Path) -> str:
    """Which folder writes a workspace of the shared index: a random id kept in `state` (beside the index's
    local state), made at its first write. Hosts cloned from one image share their machine id and
    usually the folder's path, so those could not tell two clones apart: each then replaced the other's
    rows. Clones made before the first write each make their own id (an image made after it carries
    its id: delete `state` in the image)."""
    make_private_dirs(state.parent)
    try:
        fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        made = state.read_text(encoding="ascii", errors="replace").strip()
        if len(made) == 32 and all(c in "0123456789abcdef" for c in made):
            return made
        os.unlink(state)  # damaged (a crash as it was written): a new one; `claim` says if that matters
        fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    made = secrets.token_hex(16)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(made + "\n")
        out.flush()
        os.fsync(out.fileno())
    return made


def former_writer_identity(workspace: Path) -> str:
    """The identity clawmem gave a folder before `writer_identity`: a hash of the machine's id (its host
    name where it has none) and the folder's real path. A workspace claimed so is taken over by the
    folder that still answers to it, once, as it upgrades."""
    machine = ""
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        with contextlib.suppress(OSError):
            machine = Path(candidate).read_text().strip()
        if machine:
            break
    seen = f"{machine or socket.gethostname()}\0{os.path.realpath(workspace)}"
    return xxhash.xxh3_128_hexdigest(seen.encode("utf-8", "surrogatepass"))


def backend_for(settings: Settings) -> Backend[Any]:
    if settings.index_backend == "postgres":
        return PostgresBackend(settings)
    return SqliteBackend(settings)


class SqliteBackend:
    """The index file: readers share it in WAL mode; a rebuild fills a private file and copies it in."""

    name = "sqlite"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.index_path
        self._postings = PostingsCache(SHARED_POSTINGS)  # the long-lived readers' keyword scores, kept together
        self._cells = SharedCells()  # and the vector cells they read

    def describe(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.exists()

    def open_reader(self, *, read_only: bool, long_lived: bool) -> Store:
        return Store(self.path, create=False, read_only=read_only, keep_keyword_scores=long_lived,
                     keyword_postings=self._postings if long_lived else None,
                     shared_cells=self._cells if long_lived else None)

    def refresh(self, store: Store) -> None:
        """Nothing to do: a reader of the file sees each commit (and a swapped-in rebuild) by itself."""

    def open_live(self) -> Store | None:
        """The live index, or None when there is none worth keeping (missing or damaged)."""
        if not self.path.exists():
            return None
        try:
            return Store(self.path, create=False)
        except IndexCorrupt:
            return None

    def create_live(self) -> Store:
        """A new, empty live index (a first index is written in place: nothing older to keep serving), its WAL
        checkpointed by size while it is written."""
        store = Store(self.path)
        checkpoint_by_limit(store.conn)
        return store

    @contextlib.contextmanager
    def write_lock(self, timeout: float) -> Iterator[None]:
        """The workspace's writer lock (flock: released by the kernel if the holder dies).

        Every writer also keeps the index private: the file and its journals 0600, and the default
        location's folders (clawmem's own) 0700, whatever the umask or an older version left.
        """
        ours = self.settings.index is None
        if ours:
            make_private_dirs(self.settings.cache_dir, tighten=True)
        make_private_dirs(self.path.parent, tighten=ours)
        make_private_file(self.path, create=False)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                        raise IndexBusy(f"another clawmem process is writing {self.path}") from None
                    time.sleep(0.05)
            for stray in self.path.parent.glob(f"{self.path.name}.rebuild-*"):
                with contextlib.suppress(FileNotFoundError):
                    stray.unlink()
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write: a full disk, SQLite's FullError wherever it is met, is said as DiskFull (no file's
        fault: the run stops, and the next goes on from what was committed)."""
        import apsw

        try:
            yield
        except apsw.FullError as exc:
            raise DiskFull(f"the disk holding the index ({self.path.parent}) is full ({exc}): free some space; the"
                           " next `clawmem index`, or the daemon's next pass, goes on from what was committed") from exc

    @contextlib.contextmanager
    def fresh(self) -> Iterator[Store]:
        """A private file to rebuild into, carrying the live index's vectors and jobs (removed after)."""
        tmp = self.path.with_name(f"{self.path.name}.rebuild-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            store = Store(tmp, fast_unsafe=True)
            try:
                if self.path.exists():
                    with contextlib.suppress(Exception):
                        store.carry.copy_cache_from(self.path)
                yield store
            finally:
                store.close()
        finally:
            tmp.unlink(missing_ok=True)

    def swap_in(self, fresh: Store) -> None:
        """Copy the rebuilt file over the live one in a single write transaction (SQLite's backup API)."""
        live = self.open_live()
        if live is None:
            # No usable index (missing or not a database): nothing to keep serving, start a new file.
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            live = Store(self.path)
        try:
            with live.conn.backup("main", fresh.conn, "main") as backup:
                while not backup.done:
                    backup.step(-1)
        finally:
            live.close()

    def status(self) -> dict[str, object]:
        return {"index_backend": "sqlite", "index_path": str(self.path)}

    def memory(self) -> dict[str, object]:
        """What the long-lived readers keep together, against its bounds."""
        return {"keyword_postings": self._postings.held, "keyword_postings_max": SHARED_POSTINGS,
                "vector_cells_bytes": self._cells.held, "vector_cells_max_bytes": SHARED_BYTES}

    def files_held_by(self, store: Store) -> str | None:
        """An index file is its folder's: the files it is compared with are here."""
        return None


class PostgresBackend:
    """This workspace's rows in a shared PostgreSQL; a rebuild writes a new generation and switches to it."""

    name = "postgres"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = settings.index_url
        self.workspace = settings.workspace_id
        self.scope: tuple[str, ...] = (self.workspace,)

    def describe(self) -> str:
        return f"workspace {self.workspace!r} in the shared index at {redacted(self.url)}"

    def exists(self) -> bool:
        import psycopg

        from clawmem_index.index.pg.connection import READER_SESSION, connect, one_line, unavailable

        conn = connect(self.url, READER_SESSION)
        try:
            row = conn.execute("SELECT to_regclass('cm_workspaces') IS NOT NULL").fetchone()
            if not (row and row[0]):
                return False
            found = conn.execute("SELECT 1 FROM cm_workspaces WHERE workspace = %s", (self.workspace,)).fetchone()
            return found is not None
        except psycopg.errors.InsufficientPrivilege as exc:
            raise IndexUnavailable(
                f"role {conn.info.user!r} may not read the shared index ({one_line(exc)}): the database's owner"
                " grants a role its workspaces (see docs/shared-index.md)") from exc
        except psycopg.OperationalError as exc:
            raise unavailable(exc) from exc
        finally:
            conn.close()

    def open_reader(self, *, read_only: bool, long_lived: bool) -> PgStore:
        from clawmem_index.index.pg.store import PgStore

        return PgStore(self.url, self.workspace, read_only=True, scope=self.scope, keep_postings=long_lived)

    def refresh(self, store: PgStore) -> None:
        """A reader works on the generation live when it asks: a rebuild switched since is seen now."""
        store.scope = (self.workspace,)
        store.data_version()

    def open_live(self) -> PgStore | None:
        from clawmem_index.index.pg.store import PgStore

        return PgStore(self.url, self.workspace)

    @contextlib.contextmanager
    def write_lock(self, timeout: float) -> Iterator[None]:
        """A session advisory lock per workspace: the server drops it if the writer's connection dies."""
        from clawmem_index.index.pg.connection import connect
        from clawmem_index.index.pg.store import PgStore

        conn = connect(self.url)
        try:
            deadline = time.monotonic() + timeout
            while True:
                row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                                   (f"clawmem-writer:{self.workspace}",)).fetchone()
                if row and row[0]:
                    break
                if time.monotonic() >= deadline:
                    raise IndexBusy(f"another clawmem process is writing {self.describe()}")
                time.sleep(0.05)
            live = PgStore(self.url, self.workspace)
            try:
                live.claim(*self._writer, formerly=former_writer_identity(self.settings.workspace))
                live.drop_strays()
            finally:
                live.close()
            yield
        finally:
            conn.close()

    def files_held_by(self, store: PgStore) -> str | None:
        """The host of the folder that writes this workspace when it is not this one (a reader elsewhere, a
        dashboard): its files are there, so this folder cannot tell which changed. None when this folder writes
        it, or none does yet. Reads this folder's writer id without making one (a reader never writes)."""
        import psycopg

        try:
            row = store.conn.execute("SELECT writer, writer_host FROM cm_workspaces WHERE workspace = %s",
                                     (store.workspace,)).fetchone()
        except psycopg.Error:
            return None  # unreadable: the files here are compared, as before
        if row is None or row[0] is None:
            return None
        state = self.settings.index_path.parent / "writer-id"
        with contextlib.suppress(OSError):
            if state.read_text(encoding="ascii", errors="replace").strip() == row[0]:
                return None
        if row[0] == former_writer_identity(self.settings.workspace):
            return None
        return str(row[1] or "another host")

    @functools.cached_property
    def _writer(self) -> tuple[str, str]:
        """(this folder's writer identity, host name): read once, not at every write lock."""
        return writer_identity(self.settings.index_path.parent / "writer-id"), socket.gethostname()

    def take_over(self) -> None:
        """Make this folder the writer of its workspace (moved from another host or folder): the one
        that wrote it before is refused from then on, and this folder's next sync makes the rows its own."""
        from clawmem_index.index.pg.store import PgStore

        live = PgStore(self.url, self.workspace)
        try:
            live.claim(*self._writer, take_over=True)
        finally:
            live.close()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a write: the server's disk full is said as DiskFull (the run stops; the next goes on)."""
        import psycopg

        try:
            yield
        except psycopg.errors.DiskFull as exc:
            raise DiskFull(f"the disk of the shared index's server ({self.describe()}) is full ({exc}): free some"
                           " space there; the next `clawmem index`, or the daemon's next pass, goes on from what"
                           " was committed") from exc

    @contextlib.contextmanager
    def fresh(self) -> Iterator[PgStore]:
        """A new generation of this workspace's rows, invisible to readers until `swap_in`."""
        from clawmem_index.index.pg.store import PgStore

        store = PgStore(self.url, self.workspace, new_generation=True)
        switched = False
        try:
            yield store
            switched = store.switched
        finally:
            if not switched:
                with contextlib.suppress(Exception):
                    store.drop_own_generation()
            store.close()

    def swap_in(self, fresh: PgStore) -> None:
        from clawmem_index.index.pg.store import PgStore

        fresh.settle()
        live = PgStore(self.url, self.workspace)
        try:
            live.switch_to(fresh)
            fresh.switched = True
        finally:
            live.close()

    def status(self) -> dict[str, object]:
        return {"index_backend": "postgres", "index_url": redacted(self.url), "workspace_name": self.workspace}

    def memory(self) -> dict[str, object]:
        """Nothing shared between readers: each connection keeps its own few lists."""
        return {}


def redacted(url: str) -> str:
    """A connection URL without its password (for status, logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))

